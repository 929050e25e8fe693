"""Torch is an optional extra: without it the torch methods say how to enable them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

WITHOUT_TORCH = """
import json, sys
sys.modules["torch"] = None  # every `import torch` raises ImportError, as if it were not installed
from specdesk.engines.speculation.proposers import SUPPORTED_METHODS
from specdesk.engines.torch.engine import TorchEngine, supported_methods
from specdesk.engines.types import SpecDeskError
reasons = supported_methods(sys.argv[1])
try:
    TorchEngine(sys.argv[1])
    error = None
except SpecDeskError as e:
    error = str(e)
print(json.dumps({"methods": list(SUPPORTED_METHODS), "reasons": reasons, "error": error}))
"""


def test_without_torch_methods_say_how_to_enable_them(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", WITHOUT_TORCH, str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    hint = "needs PyTorch: pip install 'specdesk[torch]'"
    assert {"none", "ngram", "draft", "mtp", "dflash"} <= set(result["methods"])
    assert all(hint in reason for reason in result["reasons"].values())
    assert hint in result["error"]
