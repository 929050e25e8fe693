"""What a trained demo family folder holds, and how its files are fingerprinted.

Both the recipe (which writes the folder) and the installer (which verifies it) read these;
the module needs neither torch nor the other's code.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from specdesk.engines.methods import native_drafters

TRAINED_FILES = ("tokenizer.json", "core.safetensors", "draft.safetensors", "mtp.safetensors", "dflash.safetensors",
                 "eagle3.safetensors", "dspark.safetensors")
# method -> its trained file, for the drafters that read the target's hidden states (present when the card has them)
NATIVE_DRAFTER_FILES = {Path(name).stem: name for name in TRAINED_FILES if Path(name).stem in native_drafters()}


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_float32(path: Path) -> dict:
    """Every tensor of a safetensors file, as float32 numpy arrays (the recipe's working precision)."""
    import numpy as np
    from safetensors.numpy import load_file

    return {name: t.astype(np.float32) for name, t in load_file(str(path)).items()}
