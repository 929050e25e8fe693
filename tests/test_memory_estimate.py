"""The memory estimate (app/models/pairing.estimate_memory) against a real-size model: the zoo's qwen2
at Qwen2.5-0.5B's shapes (494 M parameters, 151,936 tokens, benchmarks/zoo.py) in F16 and
Q4_K_M, loaded by the llama.cpp engine in a fresh process at the context the app picks, so the
resident growth (VmRSS after the load and a short generation, minus before) is the model's alone.

The zoo is built once and cached on disk (about a minute cold on two cores; the first run also
fetches the llama-cpp-python source with pip, as tests/test_zoo.py does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks import zoo
from specdesk.app.models.library import read_model
from specdesk.app.models.pairing import MemoryInfo, estimate_memory

PLENTY = MemoryInfo(64 << 30, 64 << 30)

MEASURE = r"""
import json, sys, threading
from specdesk.engines.llama.binding import llama_lib
from specdesk.engines.llama.engine import LlamaEngine
from specdesk.engines.types import GenerationRequest, SpecConfig

def status():
    with open("/proc/self/status") as f:
        return {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f)
                if k in ("VmRSS", "RssAnon", "RssFile")}

llama_lib()  # the Python process and the llama.cpp library are there before any model
before = status()
engine = LlamaEngine(sys.argv[1], n_threads=1)  # the context the app picks (the estimate's too)
prompt = engine.tokenize("def parse_args(argv):\n    parser = argparse.ArgumentParser()\n" * 8)
request = GenerationRequest(tuple(prompt), max_tokens=16, spec=SpecConfig(method="none"), stop_at_eos=False)
for _ in engine.generate(request, threading.Event()):
    pass
after = status()
print(json.dumps({"n_ctx": engine.n_ctx, **{k: after[k] - before[k] for k in after}}))
"""


def measure(target: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", MEASURE, target], capture_output=True, text=True, timeout=600,
                         env=env)
    assert out.returncode == 0, f"the measuring process failed ({out.returncode}):\n{out.stderr[-4000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmRSS from /proc (Linux)")
@pytest.mark.parametrize("quant", ["F16", "Q4_K_M"])
def test_estimate_is_within_15_percent_of_resident_growth_at_qwen2_0_5b_size(quant):
    target = zoo.build("qwen2", quant, small=False)["target_gguf"]
    growth = measure(target)
    entry = read_model(target)
    estimate = estimate_memory(entry, None, 0, PLENTY)
    assert estimate.n_ctx == growth["n_ctx"]
    measured = growth["VmRSS"]
    error = (estimate.required_bytes - measured) / measured
    print(json.dumps({"quant": quant, "n_ctx": estimate.n_ctx, "measured_bytes": measured,
                      "measured_anon_bytes": growth["RssAnon"], "measured_file_bytes": growth["RssFile"],
                      "estimated_bytes": estimate.required_bytes, "weights_bytes": estimate.weights_bytes,
                      "kv_cache_bytes": estimate.kv_cache_bytes, "compute_bytes": estimate.compute_bytes,
                      "overhead_bytes": estimate.overhead_bytes, "relative_error": round(error, 4)}))
    assert abs(error) <= 0.15
