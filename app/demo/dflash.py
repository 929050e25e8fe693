"""The demo target's DFlash drafter: trained on the core's hidden states, saved in z-lab's
DFlashDraftModel format (its own folder: config.json + model.safetensors).

Training runs at the core's size. Each step takes the core's layer outputs for a batch,
picks anchor positions a, and teaches the drafter that the block [x_a, mask x (B-1)] at
positions a.., attending to the context rows before a and to its own block, should give the
core's distributions for x_{a+1}..x_{a+B-1} (KL to the core). Many blocks share one pass
through an attention mask. Installing widens the hidden dimension with widen.py's rules
(new dimensions read through random weights and are never written), so on the demo target
the drafter computes exactly what it computed on the core.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from .config import DrafterTraining, ModelConfig, from_card
from .files import load_float32
from .widen import NEW_WEIGHT_STD

METHOD = "dflash"  # its row in the method table (engines/methods.py), and its key in the card
FILE = "dflash.safetensors"


@dataclass(frozen=True)
class DFlashSpec:
    num_layers: int
    num_heads: int
    head_dim: int
    intermediate_size: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int  # an existing token: the drafter learns what the mask rows mean


@dataclass(frozen=True)
class DFlashTraining(DrafterTraining):
    blocks_per_sequence: int = 16
    seed: int = 999
    position_decay: float = 2.0  # loss weight exp(-i / decay) for block position i
    init_from_core: bool = True  # start the draft layers from the core's last layers (same shapes)


def drafter_config(spec: DFlashSpec, hidden_size: int, rms_norm_eps: float, qk_norm_eps: float, core: ModelConfig):
    from specdesk.engines.torch.dflash import DFlashConfig

    model = replace(core, hidden_size=hidden_size, num_hidden_layers=spec.num_layers,
                    num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_heads, head_dim=spec.head_dim,
                    intermediate_size=spec.intermediate_size, rms_norm_eps=rms_norm_eps, qk_norm=True,
                    architecture="DFlashDraftModel")
    return DFlashConfig(model, spec.block_size, spec.mask_token_id, spec.target_layer_ids,
                        core.num_hidden_layers, qk_norm_eps)


def wide_eps(core: ModelConfig, wide_hidden: int) -> float:
    return core.rms_norm_eps * core.hidden_size / wide_hidden


def core_features(core_model, tokens, layer_ids):
    """(features (B, T, n*d): outputs of the listed layers, logits (B, T, V)) of the core."""
    import torch

    hidden, taps = core_model.hidden_states(tokens, taps=[i + 1 for i in layer_ids])  # H[i+1]: layer i's output
    return torch.cat([taps[i + 1] for i in layer_ids], dim=-1), core_model.logits(hidden)


def copy_core_layers(drafter, core_model, core: ModelConfig) -> None:
    """Start each draft layer from one of the core's last layers, where the shapes agree: they
    already know which positions to attend to, which a drafter learns slowly from scratch.
    Layers the core does not hold (a GGUF target's, which stay in llama.cpp) keep their start."""
    import torch

    layers = drafter.layers
    first = core.num_hidden_layers - len(layers)
    with torch.no_grad():
        for i, layer in enumerate(layers):
            source = dict(core_model.model.layers[first + i].named_parameters())
            for name, param in layer.named_parameters():
                if name in source and source[name].shape == param.shape and not source[name].is_meta:
                    param.copy_(source[name])
        # fc starts as a pass-through of the deepest tapped layer, so context rows begin in the
        # space the copied layers' key and value projections were trained on.
        d = core.hidden_size
        drafter.fc.weight.zero_()
        drafter.fc.weight[:, -d:] = torch.eye(d)


def train_dflash(core_model, core: ModelConfig, spec: DFlashSpec, settings: DFlashTraining, wide_hidden: int,
                 train_tokens: np.ndarray, held_out_tokens: np.ndarray, progress=None) -> tuple[dict, dict]:
    """Returns (tensors by checkpoint name at the core's size, info)."""
    import torch
    import torch.nn.functional as F

    from specdesk.engines.torch.dflash import DFlashDraftModel
    from specdesk.engines.torch.model import rope_tables

    from .train import fit, init_weights, sample_batch

    # Hidden-size norms use the core's eps (widening rescales it); q/k norms over head_dim
    # already use the wide eps, which widening leaves alone.
    config = drafter_config(spec, core.hidden_size, core.rms_norm_eps, wide_eps(core, wide_hidden), core)
    drafter = DFlashDraftModel(config)
    init_weights(drafter, settings.seed, spec.num_layers)
    if settings.init_from_core:
        copy_core_layers(drafter, core_model, core)
    core_model.requires_grad_(False)
    B, T, n_blocks = spec.block_size, settings.seq_len, settings.blocks_per_sequence
    cos, sin = rope_tables(config.model, T + B)

    def batch_loss(tokens: torch.Tensor, anchor_rng: np.random.Generator) -> tuple[torch.Tensor, dict]:
        anchors = np.sort(anchor_rng.choice(np.arange(1, T - B + 1), size=n_blocks, replace=False))
        with torch.no_grad():
            features, teacher_logits = core_features(core_model, tokens, spec.target_layer_ids)
            teacher = F.log_softmax(teacher_logits, dim=-1)  # (Bt, T, V)
            ids = torch.full((tokens.shape[0], n_blocks, B), spec.mask_token_id, dtype=torch.long)
            ids[:, :, 0] = tokens[:, anchors]
            block = core_model.model.embed_tokens(ids.view(tokens.shape[0], -1))  # (Bt, n_blocks*B, d)
        positions = torch.as_tensor((anchors[:, None] + np.arange(B)[None, :]).reshape(-1))  # (n_blocks*B,)
        block_of = torch.arange(n_blocks).repeat_interleave(B)
        sees_context = torch.arange(T)[None, :] < torch.as_tensor(anchors).repeat_interleave(B)[:, None]
        sees_block = block_of[:, None] == block_of[None, :]
        mask = torch.cat([sees_context, sees_block], dim=1)  # (n_blocks*B, T + n_blocks*B)
        rope = (cos[positions], sin[positions], cos[:T], sin[:T])
        rows = drafter(block, features, rope, 0, mask)  # (Bt, n_blocks*B, d)
        rows = rows.view(tokens.shape[0], n_blocks, B, -1)[:, :, 1:]  # drafted rows
        student = F.log_softmax(core_model.logits(rows), dim=-1)  # (Bt, n_blocks, B-1, V)
        target_positions = torch.as_tensor(anchors[:, None] + np.arange(B - 1)[None, :])  # row i predicts x_{a+i+1}
        target = teacher[:, target_positions]  # (Bt, n_blocks, B-1, V)
        # Early block positions decide most of the accepted length: weight them more, as DFlash does.
        weights = torch.exp(-torch.arange(B - 1, dtype=torch.float32) / settings.position_decay)
        per_row = (target.exp() * (target - student)).sum(-1)  # (Bt, n_blocks, B-1) KL(core || drafter)
        kl = (per_row * weights).sum(-1).mean() / weights.sum()
        agree = (student.argmax(-1) == target.argmax(-1)).float().mean(dim=(0, 1))  # (B-1,) per block position
        return kl, {"top1_agreement": agree.tolist()}

    def evaluate() -> dict:
        eval_rng = np.random.default_rng(0)
        agreements = [batch_loss(sample_batch(held_out_tokens, settings.batch_size, T - 1, eval_rng), eval_rng)[1]
                      for _ in range(8)]
        return {"top1_agreement": np.mean([a["top1_agreement"] for a in agreements], axis=0).tolist()}

    started = time.time()
    history = fit(drafter, batch_loss, settings.schedule(), train_tokens, "dflash", evaluate, progress=progress)
    info = {"steps": settings.steps, "held_out_top1_agreement_per_position": history[-1]["top1_agreement"],
            "train_seconds": round(time.time() - started, 1)}
    state = {name: t.detach().float().numpy() for name, t in drafter.state_dict().items()}
    return state, info


def widen_dflash(state: dict[str, np.ndarray], core: ModelConfig, spec: DFlashSpec, wide_hidden: int,
                 seed: int) -> dict[str, np.ndarray]:
    """The drafter for the widened target: only the hidden dimension grows (heads stay).

    Hidden-size norms are scaled by sqrt(d_core/d_wide) (with the wide eps, as widen.py);
    projections reading the stream get random columns for the new dimensions; projections
    writing it (o_proj, down_proj, fc) get zero rows there; fc reads each target layer's
    slice of the concatenated features from that slice's first d_core columns.
    """
    d, D = core.hidden_size, wide_hidden
    rng = np.random.default_rng(seed)
    scale = np.float32(math.sqrt(d / D))

    def random(shape):
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(NEW_WEIGHT_STD)

    out: dict[str, np.ndarray] = {}
    for name in sorted(state):
        t = np.asarray(state[name], dtype=np.float32)
        if name.endswith(("q_norm.weight", "k_norm.weight")):  # over head_dim: unchanged
            out[name] = t
        elif name.endswith("norm.weight"):  # input/post_attention layernorms, hidden_norm, norm
            out[name] = np.concatenate([t * scale, np.full((D - d,), scale, dtype=np.float32)])
        elif name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight")):
            wide = random((t.shape[0], D))
            wide[:, :d] = t
            out[name] = wide
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            wide = np.zeros((D, t.shape[1]), dtype=np.float32)
            wide[:d] = t
            out[name] = wide
        elif name == "fc.weight":  # (d, n*d) -> (D, n*D)
            n = len(spec.target_layer_ids)
            wide = np.zeros((D, n * D), dtype=np.float32)
            for i in range(n):
                wide[:d, i * D:i * D + d] = t[:, i * d:(i + 1) * d]
                wide[:d, i * D + d:(i + 1) * D] = random((d, D - d))
            out[name] = wide
        else:
            raise ValueError(f"widen_dflash: unexpected tensor {name!r}")
    return out


def dflash_hf_config(spec: DFlashSpec, core: ModelConfig, hidden_size: int, rms_norm_eps: float) -> dict:
    """config.json in z-lab's format (Qwen3 keys plus block_size and dflash_config)."""
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "attention_bias": False,
        "block_size": spec.block_size,
        "dflash_config": {"mask_token_id": spec.mask_token_id, "target_layer_ids": list(spec.target_layer_ids)},
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden_size,
        "intermediate_size": spec.intermediate_size,
        "max_position_embeddings": core.max_position_embeddings,
        "num_attention_heads": spec.num_heads,
        "num_hidden_layers": spec.num_layers,
        "num_key_value_heads": spec.num_heads,
        "num_target_layers": core.num_hidden_layers,
        "rms_norm_eps": rms_norm_eps,
        "rope_theta": core.rope_theta,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "vocab_size": core.vocab_size,
    }


def spec_from_config(config: dict) -> DFlashSpec:
    """The drafter's shape from its config.json: z-lab's (the DFlash keys under dflash_config) or
    DeepSpec DSpark's (the same keys at the top level)."""
    block = {**config, **(config.get("dflash_config") or {})}
    return DFlashSpec(num_layers=config["num_hidden_layers"], num_heads=config["num_attention_heads"],
                      head_dim=config["head_dim"], intermediate_size=config["intermediate_size"],
                      block_size=config["block_size"], target_layer_ids=tuple(block["target_layer_ids"]),
                      mask_token_id=block["mask_token_id"])


def take(folder: Path) -> tuple[dict[str, np.ndarray], dict]:
    """What the demo keeps of the trainer's DFlash folder (trainer_run.py): every tensor, and its shape."""
    state, _, fields = read_trained(folder)
    return state, fields


def read_trained(folder: Path) -> tuple[dict[str, np.ndarray], dict, dict]:
    """A trainer's block-drafter folder (DFlash or DSpark): (tensors, config.json, the card's shape fields)."""
    import json

    config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    state = load_float32(Path(folder) / "model.safetensors")
    return state, config, {"spec": asdict(spec_from_config(config))}


def widen_seed(entry: dict) -> int:
    """The widening seed of a card entry: the recipe's own drafters name it, the trainer's carry it in settings."""
    return int(entry.get("widen_seed", entry.get("settings", {}).get("widen_seed", 0)))


def export_dflash_hf(trained_dir, card: dict, out_dir) -> None:
    """The widened drafter as a z-lab DFlashDraftModel folder (config.json, model.safetensors)."""
    import shutil

    from safetensors.numpy import save_file

    from .export_hf import atomic_path, write_json_atomic

    trained_dir, out_dir = Path(trained_dir), Path(out_dir)
    core = from_card(card["core"]["config"])
    spec = DFlashSpec(**{**card["dflash"]["spec"], "target_layer_ids": tuple(card["dflash"]["spec"]["target_layer_ids"])})
    wide_hidden = card["wide"]["hidden_size"]
    state = load_float32(trained_dir / "dflash.safetensors")
    wide_state = widen_dflash(state, core, spec, wide_hidden, seed=widen_seed(card["dflash"]))
    if out_dir.is_dir():
        shutil.rmtree(out_dir)
    write_json_atomic(out_dir / "config.json", dflash_hf_config(spec, core, wide_hidden, wide_eps(core, wide_hidden)))
    weights = {name: np.ascontiguousarray(t.astype(np.float16)) for name, t in sorted(wide_state.items())}
    with atomic_path(out_dir / "model.safetensors") as tmp:
        save_file(weights, str(tmp), metadata={"format": "pt"})
