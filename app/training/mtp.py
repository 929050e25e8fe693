"""Training an MTP layer for a PyTorch target that has none, from recorded data.

The layer is the engine's MtpLayer in MiMo's format: row p reads the target's final-normed
hidden state h_p (the recorded output of its last layer, through its final norm) and the
embedding of x_{p+1}, and drafts x_{p+2}; further steps feed the layer's own normed output
back, at the next position, attending to the committed rows up to p and to row p's own
earlier steps, as the engine's proposer chains them. The loss is KL from the recorded top-k
at every step, later steps weighted down (EAGLE-3's training-time test, which the demo's MTP
layer uses for its second step).

The export is the target's folder with the layer added as a second shard
(`model-mtp.safetensors`, `num_nextn_predict_layers: 1`), the target's own weight files
linked (or copied where links are not possible), never modified. A GGUF target has no such
folder: the layer is exported alone (the same shard, and a config.json describing the target),
and export_native_gguf.export_mtp_target_from_gguf writes it into a copy of the GGUF.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from specdesk.app.demo.mtp import PREFIX, mtp_config_keys
from specdesk.app.demo.train import init_weights
from specdesk.app.models.library import LAYER_ONLY
from specdesk.engines.torch.loader import INDEX_NAME, open_checkpoint
from specdesk.engines.torch.model import ModelConfig, rope_tables
from specdesk.engines.torch.mtp import MtpLayer
from specdesk.engines.types import SpecDeskError

from .eagle3 import STEP_WEIGHT, Batch, acceptance, chained_attention, kl_loss  # noqa: F401  (STEP_WEIGHT: the same weighting)
from .methods import DEPTH, Plan, PlanInputs, figures


def taps(config: ModelConfig) -> tuple[int, ...]:
    """H[L]: the last layer's output, which the target's final norm turns into what MTP reads."""
    return (config.num_hidden_layers,)


def new_layer(target_network, seed: int = 0) -> MtpLayer:
    config = target_network.config
    layer = MtpLayer(config, "mimo")
    init_weights(layer, seed, config.num_hidden_layers)
    layer.final_layernorm.weight.data.copy_(target_network.model.norm.weight.float())
    return layer


def unroll(layer: MtpLayer, target_network, batch: Batch, depth: int) -> list[torch.Tensor]:
    """Target-vocabulary logits of each step (B, T-1, V), row p drafting x_{p+step+2}."""
    B, T = batch.tokens.shape
    rows = T - 1
    device = batch.tokens.device
    cos, sin = (t.to(device) for t in rope_tables(target_network.config, rows + depth))
    embed = target_network.model.embed_tokens
    g = target_network.model.norm(batch.features[:, :rows])  # (B, rows, d) final-normed h_p
    keys, values, logits = [], [], []
    for step in range(depth):
        token_ids = torch.zeros(B, rows, dtype=torch.long, device=device)
        token_ids[:, :max(0, T - 1 - step)] = batch.tokens[:, 1 + step:]
        x = layer.fuse(g, embed(token_ids).float())  # (B, rows, d)
        y = chained_attention(layer.self_attn, layer.input_layernorm(x), cos[step:step + rows],
                              sin[step:step + rows], keys, values)
        h = x + y
        out = h + layer.mlp(layer.post_attention_layernorm(h))
        logits.append(target_network.logits(layer.final_layernorm(out)))
        g = layer.feedback(out)
    return logits


def refuse_existing(target: Path) -> None:
    from specdesk.engines.torch.mtp import mtp_style

    style, count = mtp_style(open_checkpoint(target))
    if count:
        raise SpecDeskError(f"{target} has {count} MTP layer(s) already: --method mtp adds one to a target without")


def _link_or_copy(source: Path, destination: Path) -> None:
    destination.unlink(missing_ok=True)
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def export_target_with_mtp(layer: MtpLayer, target: Path, folder: Path) -> Path:
    """The target's folder plus the layer as model-mtp.safetensors and an index naming every
    shard; for a GGUF target, the layer alone (export_layer)."""
    from .gguf_target import is_gguf_target, model_config

    if is_gguf_target(target):
        return export_layer(layer, model_config(Path(target)), folder)
    checkpoint = open_checkpoint(target)
    folder.mkdir(parents=True, exist_ok=True)
    for path in sorted(Path(target).iterdir()):
        if path.is_file() and path.name not in ("config.json", INDEX_NAME) and not path.name.startswith("model-mtp"):
            _link_or_copy(path, folder / path.name)
    weights = _save_layer(layer, folder)
    weight_map = dict(checkpoint.weight_map)
    weight_map.update({name: "model-mtp.safetensors" for name in weights})
    total = sum((folder / f).stat().st_size for f in set(weight_map.values()))
    (folder / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                indent=2) + "\n", encoding="utf-8")
    config = dict(checkpoint.config, **mtp_config_keys())
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return folder


def _save_layer(layer: MtpLayer, folder: Path) -> dict[str, torch.Tensor]:
    """The layer in float16 under MiMo's names as folder/model-mtp.safetensors; returns what was written."""
    from safetensors.torch import save_file

    weights = {PREFIX + name: t.detach().to(torch.float16).contiguous().cpu() for name, t in layer.state_dict().items()}
    tmp = folder / f"model-mtp.safetensors.tmp-{os.getpid()}"
    save_file(weights, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, folder / "model-mtp.safetensors")
    return weights


def hf_config(config: ModelConfig) -> dict:
    """config.json of a target of this shape with one MTP layer, as transformers spells it."""
    return {**causal_lm_config(config), **mtp_config_keys()}


def causal_lm_config(config: ModelConfig) -> dict:
    """config.json of a causal LM of this shape, as transformers spells it (the draft model's too)."""
    return {
        "architectures": [config.architecture],
        "model_type": config.architecture.removesuffix("ForCausalLM").lower(),
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "num_hidden_layers": config.num_hidden_layers,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "max_position_embeddings": config.max_position_embeddings,
        "vocab_size": config.vocab_size,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": config.attention_bias,
        "torch_dtype": "float16",
    }


def export_layer(layer: MtpLayer, config: ModelConfig, folder: Path) -> Path:
    """The layer alone, for a target whose weights live elsewhere (a GGUF): model-mtp.safetensors,
    an index naming only it, and the target's config.json. It is the layer export_target_with_mtp
    writes; export_native_gguf.export_mtp_target_from_gguf puts it into a copy of the GGUF."""
    folder.mkdir(parents=True, exist_ok=True)
    weights = _save_layer(layer, folder)
    index = {"metadata": {"total_size": (folder / "model-mtp.safetensors").stat().st_size},
             "weight_map": {name: "model-mtp.safetensors" for name in weights}}
    (folder / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    # marked, so the model library does not list a layer without its model as a model
    config_json = dict(hf_config(config), **{LAYER_ONLY: True})
    (folder / "config.json").write_text(json.dumps(config_json, indent=2) + "\n", encoding="utf-8")
    return folder


# --- the method table's training facts (engines/methods.py: MTP's `Training`) ----------------
def plan_taps(network) -> tuple[int, ...]:
    return taps(network.config)


def plan(inputs: PlanInputs) -> Plan:
    """One MTP layer, unrolled DEPTH steps, exported inside a copy of the target."""
    network = inputs.network
    layer = new_layer(network).to(inputs.device)
    held_batch = inputs.batch(inputs.held)

    def step(rng):
        batch = inputs.sample(rng)
        return kl_loss(unroll(layer, network, batch, DEPTH), batch)

    def evaluate():
        return figures(*acceptance(unroll(layer, network, held_batch, DEPTH), held_batch))

    return Plan(inputs.method, inputs.taps, layer, step, evaluate,
                lambda folder: export_target_with_mtp(layer, inputs.target, folder))


def refuse_target(target: Path, from_gguf: bool) -> None:
    """Before anything loads: a target that has MTP layers already, or a GGUF whose copy could not
    carry the layer."""
    if from_gguf:
        from specdesk.app.demo.native_gguf_mtp import check_mtp_copy_source

        check_mtp_copy_source(target)
    else:
        refuse_existing(target)


def export_gguf(folder: Path, target_gguf: Path, path: Path, from_gguf: bool) -> Path:
    """The target with its trained layer as one GGUF: from a GGUF target, the file's own tensors
    (their types kept) and the layer; from a folder, the exported target converted."""
    from specdesk.app.demo.native_gguf_mtp import export_mtp_target, export_mtp_target_from_gguf

    if from_gguf:
        return export_mtp_target_from_gguf(folder, target_gguf, path)
    return export_mtp_target(folder, target_gguf, path)
