"""docs/serving.md's launch commands use flags the servers have.

vLLM and SGLang need GPUs and are not installed here: where they are importable, each flag is
checked against their own argument parser; otherwise against the option names of their server
argument files (vllm/engine/arg_utils.py with vllm/entrypoints/openai/cli_args.py, and
sglang/srt/server_args.py), listed below as of the versions the document describes. The
llama-server commands are checked against the built binary in tests/test_llama_server.py.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "serving.md"

VLLM_OPTIONS = {"--tensor-parallel-size", "--pipeline-parallel-size", "--speculative-config",
                "--per-request-spec-decode-metrics", "--host", "--port", "--api-key", "--served-model-name"}
VLLM_METHODS = {"eagle", "eagle3", "mtp", "dflash", "ngram", "draft_model", "suffix"}
SGLANG_OPTIONS = {"--model-path", "--tp-size", "--pp-size", "--speculative-algorithm",
                  "--speculative-draft-model-path", "--speculative-num-steps", "--speculative-eagle-topk",
                  "--speculative-num-draft-tokens", "--enable-metrics", "--host", "--port", "--api-key"}
SGLANG_ALGORITHMS = {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH"}


def doc_commands(program: str) -> list[list[str]]:
    """The commands of docs/serving.md's bash blocks that start with `program`, as argv lists."""
    text = DOC.read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line.startswith(program):
                commands.append(shlex.split(line))
    return commands


def flags(argv: list[str]) -> set[str]:
    return {a for a in argv if a.startswith("--")}


def parser_options(module: str) -> set[str] | None:
    """The option strings of a server's own parser, when it is installed here."""
    try:
        if module == "vllm":
            from vllm.entrypoints.openai.cli_args import make_arg_parser
            from vllm.utils import FlexibleArgumentParser

            parser = make_arg_parser(FlexibleArgumentParser())
        else:
            import argparse

            from sglang.srt.server_args import ServerArgs

            parser = argparse.ArgumentParser()
            ServerArgs.add_cli_args(parser)
    except Exception:  # noqa: BLE001 - not installed (or not importable without a GPU): use the lists
        return None
    return {s for action in parser._actions for s in action.option_strings}


def test_vllm_commands_use_its_options():
    commands = doc_commands("vllm serve")
    assert len(commands) >= 5
    known = parser_options("vllm") or VLLM_OPTIONS
    methods = set()
    for argv in commands:
        assert flags(argv) <= known, flags(argv) - known
        if "--speculative-config" in argv:
            config = json.loads(argv[argv.index("--speculative-config") + 1])
            assert config["method"] in VLLM_METHODS and config["num_speculative_tokens"] >= 1
            methods.add(config["method"])
    assert {"eagle3", "mtp", "dflash", "ngram"} <= methods
    assert any("--pipeline-parallel-size" in argv for argv in commands)


def test_sglang_commands_use_its_options():
    commands = doc_commands("python -m sglang.launch_server")
    assert len(commands) >= 5
    known = parser_options("sglang") or SGLANG_OPTIONS
    algorithms = set()
    for argv in commands:
        assert flags(argv) <= known, flags(argv) - known
        if "--speculative-algorithm" in argv:
            algorithms.add(argv[argv.index("--speculative-algorithm") + 1])
    assert algorithms <= SGLANG_ALGORITHMS and {"EAGLE3", "NEXTN", "DFLASH", "NGRAM"} <= algorithms
    assert any("--pp-size" in argv for argv in commands) and all("--enable-metrics" in argv for argv in commands)


def test_llama_server_commands_turn_on_metrics():
    commands = doc_commands("llama-server")
    assert len(commands) >= 5 and all("--metrics" in argv for argv in commands)
    types = {argv[argv.index("--spec-type") + 1] for argv in commands if "--spec-type" in argv}
    assert {"draft-simple", "ngram-simple", "draft-mtp", "draft-eagle3", "draft-dflash"} <= types


@pytest.mark.parametrize("program", ["vllm serve", "python -m sglang.launch_server", "llama-server"])
def test_every_server_has_a_baseline_command_for_compare(program):
    assert any(not any(a.startswith("--spec") for a in argv) for argv in doc_commands(program))
