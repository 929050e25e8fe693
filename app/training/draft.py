"""Training a draft model for a target: a smaller causal LM of the target's own architecture,
vocabulary and tokenizer, distilled from the recorded data.

The draft model is the engine's Transformer (engines/torch/model.py) with fewer layers. It
starts as a subset of the target's layers, the first ones and the last one (the way the demo
recipe starts its draft: app/demo/recipe.py `draft_from_core_layers`, train.pruned_state), and
the target's embeddings, final norm and head; a GGUF target's layers are dequantized from the
file. It then learns, by KL to the target's recorded top-k distribution at every position (the
objective of eagle3.kl_loss), what the target says next. The embeddings and head stay the
target's (frozen): training moves the layers and the final norm only.

The export is a Hugging Face folder (config.json, model.safetensors in float16, the target's
tokenizer files) that the PyTorch engine loads as a draft model, and for a GGUF target (or
--target-gguf) a GGUF that the llama.cpp engine loads as one (app/demo/export_gguf.py, with the
target GGUF's vocabulary). It shares nothing with the target at run time: `SpecConfig(method=
"draft", draft_path=...)` runs it as any other draft model.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from specdesk.engines.torch.model import ModelConfig, Transformer
from specdesk.engines.types import SpecDeskError

from .eagle3 import Batch, kl_loss
from .methods import DEPTH, Plan, PlanInputs, figures

# What a Hugging Face folder's tokenizer is made of; the draft folder gets the target's copies.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json",
                   "generation_config.json")
# The target's config.json keys a draft model keeps as they are (the special tokens)
TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def default_layers(num_layers: int) -> int:
    """About a quarter of the target's layers, at least one."""
    return max(1, round(num_layers / 4))


def layer_ids(num_layers: int, wanted: Optional[int] = None) -> tuple[int, ...]:
    """The target layers the draft model starts as: the first `wanted - 1` and the last one (which
    feeds the final norm and head). A count the target cannot give, or that would not be smaller
    than the target, is refused by value."""
    count = default_layers(num_layers) if wanted is None else wanted
    if num_layers < 2:
        raise SpecDeskError(f"the target has {num_layers} layer(s): a draft model needs fewer layers than its "
                            "target, so train another method (eagle3, dflash) for it")
    if not 1 <= count < num_layers:
        raise SpecDeskError(f"--draft-layers {count} is out of range: the target has {num_layers} layers, so use "
                            f"1 to {num_layers - 1} (default {default_layers(num_layers)})")
    return tuple(range(count - 1)) + (num_layers - 1,)


def draft_config(target: ModelConfig, layers: Sequence[int]) -> ModelConfig:
    return replace(target, num_hidden_layers=len(layers))


def _gguf_layer(path: Path, config: ModelConfig, index: int) -> dict[str, torch.Tensor]:
    """Block `index` of a GGUF target, dequantized, under Hugging Face's names within a layer
    (the converter's reading: app/models/gguf_to_hf.py)."""
    from specdesk.app.models.gguf_to_hf import block_tensors

    return {name: torch.from_numpy(values) for name, values in
            block_tensors(path, index, config.num_attention_heads, config.num_key_value_heads)}


def new_draft(target_network, layers: Sequence[int], target: Path) -> Transformer:
    """A draft model that starts as the target's `layers` (renumbered 0..), with the target's final
    norm (copied, trained) and embeddings and head (shared, frozen). A GGUF target's blocks, which
    stay in llama.cpp, are dequantized from the file."""
    from .gguf_target import is_gguf_target

    config = draft_config(target_network.config, layers)
    source = target_network.model
    device = source.embed_tokens.weight.device
    with torch.device("meta"):
        draft = Transformer(config)
    state = {"model.embed_tokens.weight": source.embed_tokens.weight.detach(),
             "model.norm.weight": source.norm.weight.detach().float().clone()}
    if not config.tie_word_embeddings:
        state["lm_head.weight"] = target_network.lm_head.weight.detach()
    for new, old in enumerate(layers):
        if is_gguf_target(target):
            weights = _gguf_layer(Path(target), target_network.config, old)
        else:
            weights = {name: t.detach() for name, t in source.layers[old].state_dict().items()}
        for name, value in weights.items():
            state[f"model.layers.{new}.{name}"] = value.float().clone().to(device)
    missing = set(draft.state_dict()) - set(state)
    if missing:
        raise SpecDeskError(f"{target}: the target's layers {list(layers)} lack {', '.join(sorted(missing))}")
    draft.load_state_dict(state, assign=True)
    draft.model.embed_tokens.requires_grad_(False)
    if not config.tie_word_embeddings:
        draft.lm_head.requires_grad_(False)
    return draft


def next_logits(draft: Transformer, batch: Batch) -> torch.Tensor:
    """(B, T-1, V) float32: row r is the draft's next-token logits at position r + 1, the row that
    eagle3.kl_loss compares (as one step) with the target's recorded distribution there."""
    hidden, _ = draft.hidden_states(batch.tokens)
    return draft.logits(hidden[:, 1:])


@torch.no_grad()
def acceptance(draft: Transformer, batch: Batch, depth: int) -> tuple[list[float], int]:
    """Per draft position s = 1..depth, the share of answer positions q whose drafts at q..q+s-1
    all equal the target's greedy tokens. Teacher forcing is exact here: the recorded answer is
    the target's greedy answer, so the draft reads what it would have drafted while it agrees."""
    hidden, _ = draft.hidden_states(batch.tokens)
    matches = draft.logits(hidden).argmax(-1) == batch.top_ids[..., 0]  # (B, T)
    T = matches.shape[1]
    q = torch.arange(T, device=matches.device)[None, :]
    alive = (q >= batch.answer_starts[:, None] - 1) & (q + depth - 1 <= batch.lengths[:, None] - 1)
    count = int(alive.sum())
    shares = []
    for s in range(depth):
        shifted = torch.zeros_like(matches)
        shifted[:, :T - s] = matches[:, s:]
        alive &= shifted
        shares.append(float(alive.sum()) / max(1, count))
    return shares, count


def hf_config(config: ModelConfig, target: Path) -> dict:
    """config.json of the draft model, as transformers spells the target's architecture; the
    target's special token ids kept."""
    from .gguf_target import is_gguf_target
    from .mtp import causal_lm_config

    raw = {**causal_lm_config(config), "rope_scaling": config.rope_scaling}
    if not is_gguf_target(target):
        theirs = json.loads((Path(target) / "config.json").read_text(encoding="utf-8"))
        raw.update({key: theirs[key] for key in TOKEN_KEYS if key in theirs})
    return raw


def export_draft(draft: Transformer, target: Path, layers: Sequence[int], folder: Path) -> Path:
    """The draft model as a Hugging Face folder: config.json, model.safetensors (float16) and the
    target's tokenizer files, which the PyTorch engine loads as a draft model. A GGUF target has
    no tokenizer files: its folder is the source of the GGUF draft only, marked so that the model
    library does not list it as a model."""
    from safetensors.torch import save_file

    from specdesk.app.models.library import LAYER_ONLY

    from .gguf_target import is_gguf_target

    folder.mkdir(parents=True, exist_ok=True)
    weights = {name: t.detach().to(torch.float16).contiguous().cpu() for name, t in draft.state_dict().items()}
    tmp = folder / f"model.safetensors.tmp-{os.getpid()}"
    save_file(weights, str(tmp), metadata={"format": "pt", "pruned_from_target_layers": json.dumps(list(layers))})
    os.replace(tmp, folder / "model.safetensors")
    config = hf_config(draft.config, target)
    if is_gguf_target(target):
        config[LAYER_ONLY] = True
    else:
        for name in TOKENIZER_FILES:
            if (Path(target) / name).is_file():
                shutil.copyfile(Path(target) / name, folder / name)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return folder


def export_gguf_draft(folder: Path, target_gguf: Path, out_path: Path) -> Path:
    """The exported folder as an F16 GGUF for the llama.cpp engine, with the target GGUF's
    vocabulary (its tokenizer fields copied verbatim) and RoPE settings."""
    from specdesk.app.demo.export_gguf import export_gguf

    return export_gguf(Path(folder), Path(out_path), f"{Path(target_gguf).stem}-draft", vocab_from=Path(target_gguf))


def held_out_figures(draft: Transformer, batches: Sequence[Batch], depth: int) -> tuple[list[float], int]:
    """acceptance over several held-out batches, weighted by their positions."""
    sums, count = np.zeros(depth), 0
    for batch in batches:
        shares, rows = acceptance(draft, batch, depth)
        sums += np.asarray(shares) * rows
        count += rows
    return [float(s) / max(1, count) for s in sums], count


# --- the method table's training facts (engines/methods.py: the draft model's `Training`) ----------
def plan_taps(network) -> tuple[int, ...]:
    return ()  # a draft model reads tokens only: the target's top-k is all it learns from


def check(config: ModelConfig, draft_layers: Optional[int]) -> None:
    """A layer count the target cannot give is refused before recording."""
    layer_ids(config.num_hidden_layers, draft_layers)


def plan(inputs: PlanInputs) -> Plan:
    """A draft model made of some of the target's layers, distilled from its recorded answers."""
    network, config = inputs.network, inputs.network.config
    layers = layer_ids(config.num_hidden_layers, inputs.draft_layers)
    model = new_draft(network, layers, inputs.target)
    held_batches = [inputs.batch(inputs.held[i:i + inputs.batch_size])
                    for i in range(0, len(inputs.held), inputs.batch_size)]

    def step(rng):
        batch = inputs.sample(rng)
        return kl_loss([next_logits(model, batch)], batch)

    def evaluate():
        return figures(*held_out_figures(model, held_batches, DEPTH))

    return Plan(inputs.method, inputs.taps, model, step, evaluate,
                lambda folder: export_draft(model, inputs.target, layers, folder))


def export_gguf(folder: Path, target_gguf: Path, path: Path, from_gguf: bool) -> Path:
    return export_gguf_draft(folder, target_gguf, path)
