"""Hugging Face checkpoints by tensor name: config.json plus model.safetensors, or shards
listed in model.safetensors.index.json.

A module is filled by walking its own state dict: each name (with a prefix, for layers that
live inside a bigger checkpoint such as MTP layers) must exist in the checkpoint with the
module's shape. A missing or misshapen tensor is refused with an error naming it and its
file, before any weights are used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.nn as nn

from ..files import require_regular_file
from ..hf_config import read_config
from ..types import SpecDeskError

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


@dataclass(frozen=True)
class Checkpoint:
    folder: Path
    config: dict
    weight_map: dict[str, str]  # tensor name -> file name inside folder

    @property
    def config_path(self) -> Path:
        return self.folder / "config.json"

    def has(self, name: str) -> bool:
        return name in self.weight_map

    def names_with_prefix(self, prefix: str) -> list[str]:
        return sorted(n for n in self.weight_map if n.startswith(prefix))


def read_json(path: Path) -> dict:
    """A JSON object file of the folder (regular file, plausible size, sane nesting: hf_config.py)."""
    if not os.path.lexists(path):
        raise SpecDeskError(f"{path} is missing: a Hugging Face model folder needs it")
    return read_config(path, f"{path.name} file")


def _safetensors_names(path: Path) -> list[str]:
    with _open_safetensors(path) as f:
        return list(f.keys())


def open_checkpoint(folder: str | Path) -> Checkpoint:
    """Read config.json and the tensor index (sharded or single file) of a model folder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SpecDeskError(f"{folder}: not a folder (a Hugging Face model is a folder with config.json)")
    config = read_json(folder / "config.json")
    index_path = folder / INDEX_NAME
    if index_path.is_file():
        index = read_json(index_path)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise SpecDeskError(f"{index_path}: no 'weight_map' of tensor names to shard files")
        for shard in sorted(set(weight_map.values())):
            if not (folder / shard).is_file():
                raise SpecDeskError(f"{index_path} lists shard {shard}, which is missing from {folder}")
        return Checkpoint(folder, config, dict(weight_map))
    single = folder / SINGLE_NAME
    if not single.is_file():
        raise SpecDeskError(f"{folder}: neither {SINGLE_NAME} nor {INDEX_NAME} is there")
    return Checkpoint(folder, config, {name: SINGLE_NAME for name in _safetensors_names(single)})


def drafter_problem(what: str, folder: Optional[str | Path], target: Checkpoint, check) -> Optional[str]:
    """Why a drafter-file method cannot run on `target` now: no drafter folder chosen yet (`what`
    to pick), or `check(folder, target)`'s reason; None when it can."""
    if folder is None:
        return f"pick {what} for this target"
    return check(folder, target)


def _open_safetensors(path: Path):
    from safetensors import safe_open

    require_regular_file(path, "safetensors file")  # a FIFO would block the open
    try:
        return safe_open(str(path), framework="pt")
    except Exception as e:
        raise SpecDeskError(f"{path}: cannot read the safetensors file ({e})") from e


def _checked_plan(module: nn.Module, checkpoint: Checkpoint, prefix: str,
                  renames: dict[str, str]) -> dict[str, list[tuple[str, str]]]:
    """File name -> (module name, tensor name) for every tensor of `module`, each checked to be
    in the checkpoint with the module's shape. Only headers are read and only shapes are
    asked of `module`, so this runs on a meta-device module before any memory is allocated:
    a config.json claiming more than the checkpoint holds is refused before it costs memory."""
    expected = {name: tuple(t.shape) for name, t in module.state_dict().items()}
    plan: dict[str, list[tuple[str, str]]] = {}
    for name in expected:
        tensor_name = prefix + renames.get(name, name)
        if tensor_name not in checkpoint.weight_map:
            raise SpecDeskError(f"{checkpoint.folder}: tensor {tensor_name} is missing "
                                f"(config.json implies it; the checkpoint does not have it)")
        plan.setdefault(checkpoint.weight_map[tensor_name], []).append((name, tensor_name))
    for file_name, names in plan.items():
        path = checkpoint.folder / file_name
        with _open_safetensors(path) as f:
            available = set(f.keys())
            for name, tensor_name in names:
                if tensor_name not in available:
                    raise SpecDeskError(f"{path}: tensor {tensor_name} is missing (the index says it is here)")
                shape = tuple(f.get_slice(tensor_name).get_shape())
                if shape != expected[name]:
                    raise SpecDeskError(f"{path}: tensor {tensor_name} has shape {shape}, "
                                        f"config.json implies {expected[name]}")
    return plan


def check_module(module: nn.Module, checkpoint: Checkpoint, prefix: str = "",
                 renames: Optional[dict[str, str]] = None) -> None:
    """Refuse, naming the tensor, a checkpoint that lacks a tensor of `module` or has it in
    another shape (headers only; use it on a meta-device module before allocating it)."""
    _checked_plan(module, checkpoint, prefix, renames or {})


def load_module(module: nn.Module, checkpoint: Checkpoint, prefix: str = "",
                dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                renames: Optional[dict[str, str]] = None) -> None:
    """Fill every parameter of `module` from checkpoint tensors named prefix + its name.

    `renames` maps a module name to a different checkpoint name where a format spells it
    otherwise. Tensors are checked (present, right shape) before any is copied.
    """
    plan = _checked_plan(module, checkpoint, prefix, renames or {})
    loaded: dict[str, torch.Tensor] = {}
    for file_name, names in plan.items():
        with _open_safetensors(checkpoint.folder / file_name) as f:
            for name, tensor_name in names:
                loaded[name] = f.get_tensor(tensor_name)
    module.load_state_dict({n: t.to(dtype) for n, t in loaded.items()}, strict=True)
    module.to(device=device, dtype=dtype)
