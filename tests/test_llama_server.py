"""The real llama-server, built from the llama.cpp that llama-cpp-python vendors, on the small
demo pair with --metrics: the numbers SpecDesk shows for a reply are the server's own, and a
compare between llama-server without and with the draft model keeps greedy text identical.

llama-server is built once and cached (benchmarks/native_drivers.py). The build takes long on
a small machine (docs/serving.md, "Served engines"), so these tests build it only when
SPECDESK_BUILD_LLAMA_SERVER=1 is set, and otherwise say how to build it and are skipped.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from specdesk.app.serving.endpoint import Endpoint
from specdesk.app.serving.served import compare_served
from specdesk.engines.types import SamplingParams

SPEC = importlib.util.spec_from_file_location("native_drivers",
                                              Path(__file__).resolve().parent.parent / "benchmarks" / "native_drivers.py")
native = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(native)

CHAT = [{"role": "user", "content": "Write a function that parses command line arguments."}]
PROMPTS = ["import argparse\n\n\ndef main(", "def parse_args(argv):", "class Config:"]


@pytest.fixture(scope="module")
def llama_server() -> Path:
    binary = native.native_binary(native.SERVER)
    if not binary.is_file():
        if os.environ.get("SPECDESK_BUILD_LLAMA_SERVER") != "1":
            pytest.skip(f"llama-server is not built at {binary}: `python benchmarks/native_drivers.py --build-server` "
                        "builds it once (tens of minutes on two cores), or set SPECDESK_BUILD_LLAMA_SERVER=1")
        binary = native.build_driver(2, native.SERVER)
    return binary


@pytest.fixture(scope="module")
def servers(llama_server, demo_family):
    """llama-server on the demo target with the demo draft (k = 4), and without a draft."""
    speculative = native.start_server(llama_server, demo_family["target_gguf"], demo_family["draft_gguf"], k=4)
    try:
        baseline = native.start_server(llama_server, demo_family["target_gguf"])
    except BaseException:
        native.stop_server(speculative[0])
        raise
    yield speculative[1], baseline[1]
    for child, _ in (speculative, baseline):
        native.stop_server(child)


def test_the_replys_numbers_are_the_servers_own(servers):
    endpoint = Endpoint(servers[0])
    info = endpoint.probe()
    assert info.kind == "llama-server" and info.metrics and info.per_position
    before = endpoint.scrape()
    run = endpoint.chat(CHAT, SamplingParams(), 48)
    after = endpoint.scrape()
    timings, stats = run.numbers.raw, run.result.stats
    assert timings["draft_n"] > 0 and run.numbers.source == "per request + metric deltas" and run.note is None
    # acceptance and tokens per pass from the server's own draft_n / draft_n_accepted
    assert stats.tokens == timings["predicted_n"]
    assert stats.acceptance_rate == timings["draft_n_accepted"] / timings["draft_n"]
    assert stats.mean_accepted_length == timings["predicted_n"] / (timings["predicted_n"] - timings["draft_n_accepted"])
    # per-position bars: the deltas of the server's counters around this reply
    name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
    moved = {p: v - before.by_label(name, "position").get(p, 0) for p, v in after.by_label(name, "position").items()}
    assert list(stats.per_position_accepted) == [moved[str(i)] for i in range(len(moved))]
    drafts = after.total("llamacpp:spec_decode_num_drafts_total") - before.total("llamacpp:spec_decode_num_drafts_total")
    assert list(stats.per_position_drafted) == [drafts] * len(moved) and drafts > 0
    assert sum(stats.per_position_accepted) == stats.accepted
    assert stats.per_position_acceptance == [a / drafts for a in stats.per_position_accepted]


def test_compare_without_and_with_the_draft_keeps_greedy_text(servers):
    speculative, baseline = Endpoint(servers[0]), Endpoint(servers[1])
    assert baseline.probe().kind == "llama-server"
    report = compare_served(speculative, baseline, PROMPTS, SamplingParams(), 48)
    assert report.identical_outputs is True
    assert all(r.speculative.text for r in report.results)
    assert report.baseline.drafted == 0 and report.speculative.drafted > 0 and report.speedup > 0


def test_the_documented_flags_exist_in_the_built_binary(llama_server):
    """Every flag of docs/serving.md's llama-server commands is in the built binary's --help."""
    from test_serving_docs import doc_commands

    help_text = subprocess.run([str(llama_server), "--help"], capture_output=True, text=True, timeout=60).stdout
    known = set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", help_text))
    commands = doc_commands("llama-server")
    assert commands
    for argv in commands:
        used = {a for a in argv if a.startswith("--")}
        assert used <= known, used - known
        if "--spec-type" in argv:
            assert argv[argv.index("--spec-type") + 1] in help_text
