"""What the GGUF exporters of llama.cpp's native drafters share (native_gguf_mtp.py,
native_gguf_dflash.py, native_gguf_eagle3.py): reading a Hugging Face folder, writing tensors in
the types llama.cpp's kernels expect, and seeded weights for a drafter not trained yet."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

from specdesk.engines.types import SpecDeskError

from .export_gguf import copy_vocab  # noqa: F401  (the exporters copy the target's vocabulary)

def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise SpecDeskError(f"{folder}: no config.json, so this is not a Hugging Face model folder")
    return json.loads(path.read_text(encoding="utf-8"))


def read_weights(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of the folder: model.safetensors and any further shards (an MTP layer may
    live in its own shard, named by model.safetensors.index.json)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    weights: dict[str, np.ndarray] = {}
    for shard in shards:
        if not (folder / shard).is_file():
            raise SpecDeskError(f"{folder}: no {shard}")
        weights.update(load_file(str(folder / shard)))
    return weights


def add_tensor(writer: gguf.GGUFWriter, name: str, data: np.ndarray) -> None:
    # 1-D tensors (norms, biases) stay F32 as llama.cpp's kernels expect; matrices are F16.
    dtype = np.float32 if data.ndim <= 1 or name.endswith("ffn_gate_inp.weight") else np.float16
    writer.add_tensor(name, np.ascontiguousarray(np.asarray(data, dtype=np.float32).astype(dtype)))


def finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def seeded_rng(seed: int, *parts: str) -> np.random.Generator:
    digest = hashlib.sha256(("/".join(parts) + f"/{seed}").encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))
