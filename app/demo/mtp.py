"""The demo target's MTP layer: trained on the core's own hidden states, stored MiMo-style.

Training happens at the core's size (d = 256), where it is cheap: row t reads the core's
final hidden state h_t and the embedding of x_{t+1}, and learns the core's distribution
for x_{t+2} (KL to the core, which is what verification compares against). Installing
widens it with the same function-preserving map as the target (widen.py), so on the demo
target it computes exactly what it computed on the core, and writes it into the target's HF
folder as a second shard (`model-mtp.safetensors`) under MiMo's tensor names
(`model.mtp_layers.0.*`, `num_nextn_predict_layers: 1`), the format of XiaomiMiMo/MiMo-7B.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import DrafterTraining, ModelConfig
from .files import load_float32
from .widen import NEW_WEIGHT_STD

PREFIX = "model.mtp_layers.0."
METHOD = "mtp"  # its row in the method table (engines/methods.py), and its key in the card
FILE = "mtp.safetensors"


@dataclass(frozen=True)
class MtpTraining(DrafterTraining):
    seed: int = 777
    chained_weight: float = 0.5  # loss weight of the second, chained step (0: train the first step only)


def _chained_step(layer, out1, embedded_next, cos, sin):
    """Second-step rows exactly as inference runs them: row i sits at position i + 1, reads
    feedback(out1_i) and the embedding of x_{i+2}, and attends to the first-step rows at
    positions 0..i (the committed rows in the cache) and to itself."""
    import torch
    import torch.nn.functional as F

    from specdesk.engines.torch.model import apply_rope

    attn = layer.self_attn
    B, T, _ = embedded_next.shape
    heads, head_dim = attn.n_head, attn.head_dim

    def project(x, c, s_):
        n = layer.input_layernorm(x)
        q = apply_rope(attn.q_proj(n).view(B, -1, heads, head_dim).transpose(1, 2), c, s_)
        k = apply_rope(attn.k_proj(n).view(B, -1, attn.n_kv, head_dim).transpose(1, 2), c, s_)
        v = attn.v_proj(n).view(B, -1, attn.n_kv, head_dim).transpose(1, 2)
        return q, k, v

    x2 = layer.fuse(layer.feedback(out1["out"][:, :T]), embedded_next)  # (B, T, d)
    q2, k2, v2 = project(x2, cos[1:T + 1], sin[1:T + 1])
    keys = torch.cat([out1["k"][:, :, :T], k2], dim=2)  # (B, heads, 2T, head_dim)
    values = torch.cat([out1["v"][:, :, :T], v2], dim=2)
    rows = torch.arange(T)
    mask = torch.cat([rows[None, :] <= rows[:, None], torch.eye(T, dtype=torch.bool)], dim=1)  # (T, 2T)
    y = F.scaled_dot_product_attention(q2, keys, values, attn_mask=mask)
    h = x2 + attn.o_proj(y.transpose(1, 2).reshape(B, T, -1))
    return h + layer.mlp(layer.post_attention_layernorm(h))


def train_mtp(core_model, core: ModelConfig, settings: MtpTraining, train_tokens: np.ndarray,
              held_out_tokens: np.ndarray, progress=None) -> tuple[dict[str, np.ndarray], dict]:
    """Train one MiMo-style MTP layer against the frozen core (a Transformer); returns
    (tensors by checkpoint name, info)."""
    import torch
    import torch.nn.functional as F

    from specdesk.engines.torch.model import apply_rope, causal_mask, rope_tables
    from specdesk.engines.torch.mtp import MtpLayer

    from .train import fit, init_weights, sample_batch

    layer = MtpLayer(core, "mimo")
    init_weights(layer, settings.seed, core.num_hidden_layers)
    core_model.requires_grad_(False)
    cos, sin = rope_tables(core, settings.seq_len)
    mask = causal_mask(0, settings.seq_len - 1, "cpu")

    def batch_loss(tokens: torch.Tensor, rng=None) -> tuple[torch.Tensor, dict]:
        with torch.no_grad():
            hidden = core_model.hidden_states(tokens)[0]  # (B, T, d) after the final norm
            teacher = F.log_softmax(core_model.logits(hidden), dim=-1)  # (B, T, V)
            embedded = core_model.model.embed_tokens(tokens)
        T = tokens.shape[1] - 1
        x1 = layer.fuse(hidden[:, :T], embedded[:, 1:])
        out = layer(x1, cos[:T], sin[:T], 0, mask[:T, :T])  # row t -> x_{t+2}
        student = F.log_softmax(core_model.logits(layer.final_layernorm(out)), dim=-1)
        target = teacher[:, 1:]  # the core's distribution for x_{t+2}
        kl = F.kl_div(student.reshape(-1, student.shape[-1]), target.reshape(-1, target.shape[-1]),
                      log_target=True, reduction="batchmean")
        figures = {"top1_agreement": (student.argmax(-1) == target.argmax(-1)).float().mean().item(),
                   "step2_top1_agreement": 0.0}
        if settings.chained_weight > 0:
            attn, n = layer.self_attn, layer.input_layernorm(x1)
            k1 = apply_rope(attn.k_proj(n).view(*n.shape[:2], attn.n_kv, attn.head_dim).transpose(1, 2),
                            cos[:T], sin[:T])
            v1 = attn.v_proj(n).view(*n.shape[:2], attn.n_kv, attn.head_dim).transpose(1, 2)
            out2 = _chained_step(layer, {"out": out, "k": k1, "v": v1}, embedded[:, 2:], cos, sin)  # row t -> x_{t+3}
            student2 = F.log_softmax(core_model.logits(layer.final_layernorm(out2)), dim=-1)
            target2 = teacher[:, 2:]
            kl2 = F.kl_div(student2.reshape(-1, student2.shape[-1]), target2.reshape(-1, target2.shape[-1]),
                           log_target=True, reduction="batchmean")
            kl = kl + settings.chained_weight * kl2
            figures["step2_top1_agreement"] = (student2.argmax(-1) == target2.argmax(-1)).float().mean().item()
        return kl, figures

    def evaluate() -> dict:
        eval_rng = np.random.default_rng(0)
        figures = [batch_loss(sample_batch(held_out_tokens, settings.batch_size, settings.seq_len - 1, eval_rng))[1]
                   for _ in range(8)]
        return {key: float(np.mean([f[key] for f in figures])) for key in figures[0]}

    started = time.time()
    history = fit(layer, batch_loss, settings.schedule(), train_tokens, "mtp", evaluate, progress=progress)
    info = {"steps": settings.steps, "style": "mimo", "held_out_top1_agreement": history[-1]["top1_agreement"],
            "held_out_step2_top1_agreement": history[-1]["step2_top1_agreement"],
            "chained_weight": settings.chained_weight, "train_seconds": round(time.time() - started, 1)}
    state = {PREFIX + name: t.detach().float().numpy() for name, t in layer.state_dict().items()}
    return state, info


def take(folder: Path) -> tuple[dict[str, np.ndarray], dict]:
    """What the demo keeps of the trainer's MTP folder (trainer_run.py): the layer, under MiMo's names."""
    state = load_float32(Path(folder) / "model-mtp.safetensors")
    return state, {"style": "mimo"}


def widen_mtp(state: dict[str, np.ndarray], core: ModelConfig, wide: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    """The MTP layer for the widened target, computing exactly what it computed on the core.

    Same rules as widen.py: norms scaled by sqrt(d_core/d_wide); new heads and FFN units read
    through random projections and write nothing; input_proj reads each half of its
    [hidden, embedding] input from that half's first d_core columns and writes zeros to the
    new dimensions.
    """
    from .widen import widen

    block = {name.removeprefix(PREFIX): t for name, t in state.items() if name != PREFIX + "input_proj.weight"}
    renamed = {"model.layers.0." + n: t for n, t in block.items()}  # widen.py's rules go by name suffix
    _, wide_block = widen(core, renamed, wide.hidden_size, wide.num_attention_heads, wide.intermediate_size,
                          seed=seed)
    out = {PREFIX + n.removeprefix("model.layers.0."): t for n, t in wide_block.items()}
    d, D = core.hidden_size, wide.hidden_size
    proj = state[PREFIX + "input_proj.weight"]  # (d, 2d)
    rng = np.random.default_rng(seed + 1)
    wide_proj = np.zeros((D, 2 * D), dtype=np.float32)
    wide_proj[:d, :d] = proj[:, :d]
    wide_proj[:d, D:D + d] = proj[:, d:]
    # New input columns read dimensions that are always zero: random, so they are real units.
    wide_proj[:d, d:D] = rng.standard_normal((d, D - d), dtype=np.float32) * np.float32(NEW_WEIGHT_STD)
    wide_proj[:d, D + d:] = rng.standard_normal((d, D - d), dtype=np.float32) * np.float32(NEW_WEIGHT_STD)
    out[PREFIX + "input_proj.weight"] = wide_proj
    return out


def mtp_config_keys() -> dict:
    """What config.json gains: the key MiMo and DeepSeek checkpoints use."""
    return {"num_nextn_predict_layers": 1}


def add_mtp_shard(target_dir, trained_dir, card: dict, core: ModelConfig, wide: ModelConfig, seed: int) -> None:
    """Write the widened MTP layer into an exported target folder as a second shard.

    The folder keeps its model.safetensors (what the GGUF exporter and transformers read)
    and gains model-mtp.safetensors, a model.safetensors.index.json naming both, and
    `num_nextn_predict_layers` in config.json: a sharded MiMo-format checkpoint.
    """
    import json

    from safetensors import safe_open
    from safetensors.numpy import save_file

    from .export_hf import atomic_path, write_json_atomic

    target_dir, trained_dir = Path(target_dir), Path(trained_dir)
    state = load_float32(trained_dir / "mtp.safetensors")
    wide_state = widen_mtp(state, core, wide, seed)
    weights = {name: np.ascontiguousarray(t.astype(np.float16)) for name, t in sorted(wide_state.items())}
    with atomic_path(target_dir / "model-mtp.safetensors") as tmp:
        save_file(weights, str(tmp), metadata={"format": "pt"})
    with safe_open(str(target_dir / "model.safetensors"), framework="numpy") as f:
        main_names = list(f.keys())
    weight_map = {name: "model.safetensors" for name in sorted(main_names)}
    weight_map.update({name: "model-mtp.safetensors" for name in weights})
    total = sum(p.stat().st_size for p in (target_dir / "model.safetensors", target_dir / "model-mtp.safetensors"))
    write_json_atomic(target_dir / "model.safetensors.index.json",
                      {"metadata": {"total_size": total}, "weight_map": weight_map})
    config = json.loads((target_dir / "config.json").read_text(encoding="utf-8"))
    config.update(mtp_config_keys())
    write_json_atomic(target_dir / "config.json", config)
