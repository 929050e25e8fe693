"""The demo target's DSpark drafter: trained on the core by `specdesk train-drafter`, widened.

The recipe runs the product's own trainer on the core (trainer_run.py). DSpark is DFlash's
parallel block drafter (reading target layers 1, 4 and 6 of 8) plus a Markov head that adds
a bias by the token chosen before each row; it runs as a DFlash drafter in both engines.
What ships is the drafter at the core's width (`dspark.safetensors`). Installing widens the
backbone as widen_dflash does; the Markov head maps tokens to tokens through its own rank
and does not see the hidden width, so it is kept as trained. The folder is DeepSpec's
Qwen3DSparkModel format, which the GGUF exporter turns into a dflash GGUF with the Markov
tensors that llama.cpp runs as draft-dspark.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .config import ModelConfig, from_card
from .dflash import DFlashSpec, dflash_hf_config, read_trained, wide_eps, widen_dflash, widen_seed
from .files import load_float32

METHOD = "dspark"  # its row in the method table (engines/methods.py), and its key in the card
FILE = "dspark.safetensors"
ARCHITECTURE = "Qwen3DSparkModel"  # DeepSpec's (engines/torch/dflash.py reads it)
MARKOV = "markov_head."


def dspark_hf_config(spec: DFlashSpec, core: ModelConfig, hidden_size: int, rms_norm_eps: float, rank: int) -> dict:
    """config.json in DeepSpec's format: z-lab's Qwen3 keys, the DFlash keys at the top level, a
    vanilla Markov head of `rank`, no confidence head."""
    config = dflash_hf_config(spec, core, hidden_size, rms_norm_eps)
    block = config.pop("dflash_config")
    return {**config, **block, "architectures": [ARCHITECTURE], "markov_rank": rank,
            "markov_head_type": "vanilla", "enable_confidence_head": False}


def take(folder: Path) -> tuple[dict[str, np.ndarray], dict]:
    """The trainer's DSpark folder: every tensor, and the shape the card records (DFlash's, and the Markov rank)."""
    state, config, fields = read_trained(folder)
    return state, {**fields, "markov_rank": int(config["markov_rank"])}


def card_spec(card: dict) -> DFlashSpec:
    spec = card["dspark"]["spec"]
    return DFlashSpec(**{**spec, "target_layer_ids": tuple(spec["target_layer_ids"])})


def widen_dspark(state: dict[str, np.ndarray], core: ModelConfig, spec: DFlashSpec, wide_hidden: int,
                 seed: int) -> dict[str, np.ndarray]:
    """The drafter for the widened target: the backbone as widen_dflash, the Markov head as it is."""
    backbone = {name: t for name, t in state.items() if not name.startswith(MARKOV)}
    markov = {name: np.asarray(t, dtype=np.float32) for name, t in state.items() if name.startswith(MARKOV)}
    return {**widen_dflash(backbone, core, spec, wide_hidden, seed), **markov}


def export_dspark_hf(trained_dir, card: dict, out_dir) -> None:
    """The widened drafter as a DeepSpec Qwen3DSparkModel folder (config.json, model.safetensors)."""
    import shutil

    from safetensors.numpy import save_file

    from .export_hf import atomic_path, write_json_atomic

    trained_dir, out_dir = Path(trained_dir), Path(out_dir)
    core = from_card(card["core"]["config"])
    spec = card_spec(card)
    wide_hidden = card["wide"]["hidden_size"]
    state = load_float32(trained_dir / FILE)
    wide = widen_dspark(state, core, spec, wide_hidden, seed=widen_seed(card["dspark"]))
    if out_dir.is_dir():
        shutil.rmtree(out_dir)
    config = dspark_hf_config(spec, core, wide_hidden, wide_eps(core, wide_hidden), card["dspark"]["markov_rank"])
    write_json_atomic(out_dir / "config.json", config)
    weights = {name: np.ascontiguousarray(t.astype(np.float16)) for name, t in sorted(wide.items())}
    with atomic_path(out_dir / "model.safetensors") as tmp:
        save_file(weights, str(tmp), metadata={"format": "pt"})

