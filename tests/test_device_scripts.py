"""benchmarks/device_cuda.sh, the one prepared run for a GPU machine, in its --dry-run mode:
every llama.cpp step on the CPU with the small zoo, and the torch benchmark on the CPU, so the
script cannot rot between the rare runs on a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_device_cuda_dry_run_prints_every_step_as_json_lines(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", "benchmarks/device_cuda.sh", "--dry-run", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    steps = [row["step"] for row in rows if "step" in row]
    assert steps[:4] == ["llama_cuda_build", "build", "models", "placement"]
    assert {"pass_cost", "bandwidth", "llama_server"} <= set(steps)
    methods = {row["method"]: row for row in rows if row.get("step") == "method"}
    assert set(methods) == {"none", "draft", "ngram", "auto"} and all(r["tok_s"] > 0 for r in methods.values())
    ratios = next(row for row in rows if row.get("step") == "pass_cost")["t_k_over_t1"]
    assert sorted(int(k) for k in ratios) == list(range(2, 9)) and all(v > 0 for v in ratios.values())
    placement = next(row for row in rows if row.get("step") == "placement")
    assert placement["target"]["device"] == "CPU" and placement["target"]["allocated_bytes"]["CPU"] > 0
    torch_rows = [row for row in rows if row.get("engine") == "torch" or row.get("step") == "torch"]
    assert torch_rows and torch_rows[0].get("identical_outputs", True) is True
    assert (tmp_path / "llama.jsonl").is_file()
