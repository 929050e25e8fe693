"""The demo target's EAGLE-3 head: trained on the core by `specdesk train-drafter`, widened.

The recipe runs the product's own trainer on the core (trainer_run.py). What ships is the
head at the core's width (`eagle3.safetensors`); installing widens it with the same
function-preserving map as the target (widen.py), so on the demo target it computes exactly
what it computed on the core, and writes it as an EAGLE-3 folder whose lm_head is the
target's own.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .config import ModelConfig, from_card
from .dflash import wide_eps
from .files import load_float32
from .widen import NEW_WEIGHT_STD

METHOD = "eagle3"  # its row in the method table (engines/methods.py), and its key in the card
FILE = "eagle3.safetensors"


def take(folder: Path) -> tuple[dict[str, np.ndarray], dict]:
    """What the demo keeps of the trainer's EAGLE-3 folder: the head without the target's lm_head
    (frozen; installing takes the widened target's) and without d2t (the full vocabulary)."""
    state = load_float32(folder / "model.safetensors")
    state.pop("lm_head.weight", None)
    state.pop("d2t", None)
    return state, {}


def widen_eagle3(state: dict[str, np.ndarray], core: ModelConfig, wide_hidden: int, seed: int) -> dict[str, np.ndarray]:
    """The head for the widened target: only the hidden dimension grows (heads stay).

    As widen_dflash: hidden-size norms scaled by sqrt(d_core/d_wide) (with the wide eps);
    projections reading the stream get random columns for the new dimensions; projections
    writing it (o_proj, down_proj, fc) zero rows there. q/k/v read cat[embedding, g], so each
    half keeps its core columns at the start of its wide half; fc reads each tapped layer's
    slice of the features from that slice's first d_core columns.
    """
    d, D = core.hidden_size, wide_hidden
    rng = np.random.default_rng(seed)
    scale = np.float32(math.sqrt(d / D))

    def random(shape):
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(NEW_WEIGHT_STD)

    def read_halves(t: np.ndarray, halves: int) -> np.ndarray:
        wide = random((t.shape[0], halves * D))
        for i in range(halves):
            wide[:, i * D:i * D + d] = t[:, i * d:(i + 1) * d]
        return wide

    out: dict[str, np.ndarray] = {}
    for name in sorted(state):
        t = np.asarray(state[name], dtype=np.float32)
        if name.endswith("norm.weight"):  # input_layernorm, hidden_norm, post_attention_layernorm, norm
            out[name] = np.concatenate([t * scale, np.full((D - d,), scale, dtype=np.float32)])
        elif name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):  # (heads*hd, 2d)
            out[name] = read_halves(t, 2)
        elif name.endswith(("gate_proj.weight", "up_proj.weight")):
            out[name] = read_halves(t, 1)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            wide = np.zeros((D, t.shape[1]), dtype=np.float32)
            wide[:d] = t
            out[name] = wide
        elif name == "fc.weight":  # (d, 3d) -> (D, 3D)
            wide = np.zeros((D, 3 * D), dtype=np.float32)
            wide[:d] = read_halves(t, 3)[:d]
            out[name] = wide
        else:
            raise ValueError(f"widen_eagle3: unexpected tensor {name!r}")
    return out


def hf_config(core: ModelConfig, taps, hidden_size: int) -> dict:
    """config.json of the widened head: the trainer's, at the wide width and eps."""
    from .eagle3_config import hf_config as trainer_config

    config = trainer_config(core, taps)
    config.update({"hidden_size": hidden_size, "rms_norm_eps": wide_eps(core, hidden_size)})
    return config


def export_eagle3_hf(trained_dir, card: dict, target_hf, out_dir) -> None:
    """The widened head as an EAGLE-3 folder for the demo target (its lm_head the target's)."""
    import shutil

    from safetensors import safe_open
    from safetensors.numpy import save_file

    from .export_hf import atomic_path, write_json_atomic

    trained_dir, target_hf, out_dir = Path(trained_dir), Path(target_hf), Path(out_dir)
    core = from_card(card["core"]["config"])
    wide_hidden = card["wide"]["hidden_size"]
    state = load_float32(trained_dir / FILE)
    wide = widen_eagle3(state, core, wide_hidden, seed=card["eagle3"]["settings"]["widen_seed"])
    with safe_open(str(target_hf / "model.safetensors"), framework="numpy") as target:  # its head only
        wide["lm_head.weight"] = target.get_tensor("lm_head.weight").astype(np.float32)
    if out_dir.is_dir():
        shutil.rmtree(out_dir)
    write_json_atomic(out_dir / "config.json", hf_config(core, card["eagle3"]["taps"], wide_hidden))
    weights = {name: np.ascontiguousarray(t.astype(np.float16)) for name, t in sorted(wide.items())}
    with atomic_path(out_dir / "model.safetensors") as tmp:
        save_file(weights, str(tmp), metadata={"format": "pt"})
