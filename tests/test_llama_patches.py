"""The patches set-up applies to llama.cpp (packaging/llama-patches/) are in the build that runs:
with them, llamafile's x86 kernels take one-token products too, so a verification pass over
several tokens computes every row as a one-token pass does, and greedy speculation on F16 and
BF16 weights is identical to plain decoding bit for bit (before them the rows differed by up to
0.03 in F16 and 0.24 in BF16). Q4_1 weights, which had no batched kernel on x86 (each token of a
pass ran the one-row dot product again), have one (0003) that computes each block as that dot
product does, so their rows stay equal bit for bit too; and F16 products take their F32
activations as they are at every pass size (0004); their threads claim runs of consecutive jobs
(0005), which moves no result; and a one-token pass reads one weight row at a time and a pass
over 2 to 6 tokens two, each row's stream fetched ahead (0006, 0009), so the 6-token pass checked
here runs the two-row tiles, the 12-token pass the 4-row tiles and the one-token passes the
one-row tiles, whose rows must all agree. With AVX512-VNNI, Q8_0 passes over up to 32 tokens read
one weight row at a time too, 16 blocks a step and 8 tokens at a time (0007, 0011), so there the
one-token passes run that kernel once a token, the 6-token pass once, the 12-token pass twice (8
tokens, then 4) and the 17-token pass, the largest a verification takes (k = 16), three times. Each
query of a pass smaller than flash attention's Q tile is computed alone in three vector passes
(0012), masked positions and all. Past 512 cached positions
flash attention runs a lone query as it runs a query in a batch (0008), checked on its own below.
Checked on the CPU module this machine picks and, forced, on the AVX2 (haswell) module, whatever
this CPU would pick, and on the AVX512-VNNI (icelake) module where this CPU runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def cpu_flags() -> set[str]:
    """This CPU's flags, read as set-up reads them (scripts/llama_backend.py, standard library only)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("llama_backend", ROOT / "scripts" / "llama_backend.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.cpu_flags()


PROBE = """
import json, sys
from specdesk.engines.llama.engine import LlamaEngine
from specdesk.engines.llama.devices import llama_build
from specdesk.engines.speculation.noise import measure_logit_noise
engine = LlamaEngine(sys.argv[1], n_ctx=256, n_threads=1)
tokens = engine.tokenize("def parse_args(argv):\\n    parser = argparse.ArgumentParser()\\n    parser.add_argument(")
print(json.dumps([llama_build()["cpu_module"], max(measure_logit_noise(engine, tokens, rows=r) for r in (6, 12, 17))]))
"""


def run_probe(code: str, model: str, env: dict) -> list:
    """Run a probe script on `model` in a process of its own (a CPU module is chosen once a
    process); what its last line prints, as JSON."""
    done = subprocess.run([sys.executable, "-c", code, model], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_each_patch_is_a_diff_inside_vendored_llama_cpp():
    patches = sorted((ROOT / "packaging" / "llama-patches").glob("*.patch"))
    assert patches, "set-up applies the patches in packaging/llama-patches/"
    for patch in patches:
        text = patch.read_text()
        assert text.startswith(("From ", "diff ", "---", "Subject")) or "\n--- a/" in text, patch
        assert "+++ b/ggml/" in text or "+++ b/src/" in text  # paths inside vendor/llama.cpp, -p1


# What a forced module's code needs of the CPU (/proc/cpuinfo's names): the AVX2 one, and the
# AVX512-VNNI one whose Q0 kernel takes passes over up to 32 tokens a row at a time (0007, 0011).
NEEDS = {"haswell": {"avx2", "fma", "f16c", "bmi2"},
         "icelake": {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512vbmi", "avx512_vnni"}}


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="llamafile's x86 kernels")
@pytest.mark.parametrize("module", [None, "haswell", "icelake"])
@pytest.mark.parametrize("weights", ["F16", "BF16", "Q8_0", "Q4_1"])
def test_a_pass_over_several_tokens_computes_each_row_as_a_one_token_pass(demo_family, tmp_path, module, weights):
    import llama_cpp

    from specdesk.engines.llama.binding import quantize_gguf

    model = demo_family["target_gguf"]
    if weights != "F16":  # llama.cpp's own quantizer, from the demo target
        model = str(quantize_gguf(model, tmp_path / f"target-{weights}.gguf", weights))

    env = {**os.environ, "SPECDESK_CACHE_DIR": str(tmp_path)}
    env.pop("SPECDESK_LLAMA_CPU_MODULE", None)
    if module is not None:
        path = Path(llama_cpp.__file__).parent / "lib" / f"libggml-cpu-{module}.so"
        if not path.is_file():
            pytest.skip("a build with its CPU code linked in")
        flags = cpu_flags()
        if not NEEDS[module] <= flags:
            pytest.skip(f"this CPU lacks {', '.join(sorted(NEEDS[module] - flags))}")
        env["SPECDESK_LLAMA_CPU_MODULE"] = str(path)
    chosen, noise = run_probe(PROBE, model, env)
    assert module is None or chosen == module
    assert noise == 0.0, f"{chosen}, {weights}: a batched pass's logits differ from one-token passes' by up to {noise}"


LONG_PROBE = """
import json, sys
from specdesk.engines.llama.engine import LlamaEngine
from specdesk.engines.speculation.noise import measure_logit_noise
engine = LlamaEngine(sys.argv[1], n_ctx=1024, n_threads=2)
text = "".join(f"def area_{i}(width, height):\\n    return width * height + {i}\\n\\n" for i in range(14))
tokens = engine.tokenize(text)
print(json.dumps([len(tokens), measure_logit_noise(engine, tokens, rows=5, spans=2)]))
"""


def test_past_512_cached_positions_a_batched_pass_still_computes_each_row_as_a_one_token_pass(demo_family, tmp_path):
    """llama.cpp pads the attended cache to 256 positions; from 512 its CPU flash attention ran a
    lone query (a one-token pass) through a split-KV path whose sums come in another order than a
    batch's (patch 0008 takes it out), so from some 257 tokens of context a verification pass and
    plain decoding differed (0.009 in the demo target's logits at 1000 tokens). Two threads: the
    split path needs more than one chunk."""
    env = {**os.environ, "SPECDESK_CACHE_DIR": str(tmp_path)}
    n_tokens, noise = run_probe(LONG_PROBE, demo_family["target_gguf"], env)
    assert n_tokens > 300, f"the probe's text is {n_tokens} tokens: too short to reach 512 cached positions"
    assert noise == 0.0, f"past 512 cached positions a batched pass's logits differ from one-token passes' by up to {noise}"
