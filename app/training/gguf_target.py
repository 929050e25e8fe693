"""A GGUF target for the trainer: llama.cpp answers the prompts and hands out the hidden states
the drafter reads (the layer inputs its native drafters read, engines/llama/ext.py, and the
final-normed rows that MTP reads), and the weights the drafter trains against (token
embeddings, final norm, output head) are dequantized from the file with gguf's quantization
code. The rest of the trainer is the same as for a Hugging Face target: the recorded sequences
have the same format and the drafter trains in PyTorch; it is exported as a Hugging Face folder
and for llama.cpp: EAGLE-3 and DFlash as a GGUF drafter beside the target, an MTP layer inside a
glm4moe copy of the target whose own tensors are the file's, byte for byte
(export_native_gguf.export_mtp_target_from_gguf).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from specdesk.engines.llama.tensors import dequantized
from specdesk.engines.types import SpecDeskError

# GGUF architectures whose blocks are the PyTorch engine's Llama block (the drafter only needs
# the target's shape, embeddings, final norm and head, but its export must describe the target)
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# llama.cpp's qwen2 graph (src/models/qwen2.cpp) does not mark its layer inputs, and asking it to
# keep them aborts the process: EAGLE-3 and DFlash cannot be recorded from such a file
NO_LAYER_INPUTS = ("qwen2",)
CHUNK = 256  # tokens per llama_decode while recording: each decode's layer inputs are read before the next


def is_gguf_target(path: Path) -> bool:
    return Path(path).suffix.lower() == ".gguf"


def model_config(path: Path):
    """The target's shape as the PyTorch engine's ModelConfig, read from the GGUF header; a GGUF
    of another architecture is refused by name."""
    from specdesk.app.models.gguf_to_hf import gguf_model_config
    from specdesk.engines.llama.binding import gguf_header

    arch = gguf_header(path).architecture  # the architecture first: the clearest refusal
    if arch not in ARCHITECTURES:
        raise SpecDeskError(f"{path}: a drafter cannot be trained here for a GGUF of architecture {arch!r} "
                            f"(supported: {', '.join(ARCHITECTURES)}); train it from the model's Hugging Face "
                            "folder instead")
    return gguf_model_config(Path(path), ARCHITECTURES[arch])


def heads_network(path: Path, device: str):
    """The target as the trainer's Transformer with only what a drafter trains against filled in
    (token embeddings, final norm, output head, dequantized); its blocks stay on the meta device,
    since llama.cpp runs the target."""
    import torch

    from specdesk.engines.torch.model import Transformer

    config = model_config(path)
    with torch.device("meta"):
        network = Transformer(config)
    state = {"model.embed_tokens.weight": dequantized(path, "token_embd.weight"),
             "model.norm.weight": dequantized(path, "output_norm.weight")}
    if not config.tie_word_embeddings:
        state["lm_head.weight"] = dequantized(path, "output.weight")
    network.load_state_dict({k: torch.from_numpy(v).to(device) for k, v in state.items()}, strict=False, assign=True)
    return network.eval().requires_grad_(False)


def unnormed(normed: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Rows x whose RMSNorm times `weight` is `normed`: normed / weight, rows of unit RMS (n, d).

    The final norm keeps only a row's direction, so this is the last layer's output up to its
    scale, which the norm removes again: the final norm of these rows is `normed`, up to the
    norm's epsilon. A component whose weight is 0 was lost by the norm; it gets the share of
    the unit RMS the others leave, so the rows keep unit RMS."""
    normed = np.asarray(normed, dtype=np.float32)
    weight = np.asarray(weight, dtype=np.float32)
    kept = weight != 0
    rows = np.zeros_like(normed)
    rows[:, kept] = normed[:, kept] / weight[kept]
    if not kept.all():
        left = np.maximum(weight.shape[0] - (rows ** 2).sum(axis=-1, keepdims=True), 0.0)  # (n, 1)
        rows[:, ~kept] = np.sqrt(left / (~kept).sum())
    return rows


class LlamaPass:
    """The recording pass on llama.cpp: one context over the engine's target that keeps the
    rows of the taps; `__call__(tokens)` returns what record.Recorded holds for them (features,
    top-k ids, top-k log-probabilities).

    Taps below the layer count are layer inputs, which llama.cpp keeps per decode. Tap L (the
    layer count), the last layer's output that MTP reads through the final norm, llama.cpp never
    hands out for these architectures; it hands out the final-normed rows (its embeddings), and
    `unnormed` turns them into rows the trainer's final norm maps back onto them."""

    def __init__(self, engine, taps: Sequence[int], top_k: int, n_ctx: int):
        from specdesk.engines.llama.binding import GgufContext
        from specdesk.engines.llama.ext import ext, keep_target_rows
        from specdesk.engines.methods import LAYER_INPUTS

        path = Path(engine.target.path)
        self.n_layer = model_config(path).num_hidden_layers
        self.taps, self.top_k = tuple(taps), top_k
        if any(not 0 <= t <= self.n_layer for t in self.taps):
            raise SpecDeskError(f"{path}: taps {list(self.taps)} are outside the target's layers 0..{self.n_layer}")
        self.layer_taps = tuple(t for t in self.taps if t < self.n_layer)
        arch = engine.target.header.architecture
        if self.layer_taps and arch in NO_LAYER_INPUTS:
            raise SpecDeskError(f"{path}: llama.cpp hands out no layer inputs for architecture {arch!r}, which "
                                "EAGLE-3 and DFlash read: train them from the model's Hugging Face folder, or train "
                                "an MTP layer from this file")
        self.final_norm = dequantized(path, "output_norm.weight") if self.n_layer in self.taps else None
        if self.layer_taps:
            ext().require_symbols(LAYER_INPUTS, "recording layer inputs")  # what DFlash and EAGLE-3 read
        self.context = GgufContext(engine.target, n_ctx, engine.n_threads, n_batch=CHUNK)
        if self.layer_taps:
            keep_target_rows(self.context, self.layer_taps, True)
        if self.final_norm is not None:
            self.context._lib.llama_set_embeddings(self.context._ctx, True)

    def __call__(self, tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        from specdesk.engines.llama.ext import HiddenRows, rows

        ctx = self.context
        ctx.rollback(0)
        features, top_ids, top_logp = [], [], []
        for start in range(0, len(tokens), CHUNK):
            logits = ctx.decode(list(tokens[start:start + CHUNK]))  # (n, V), then this decode's hidden rows
            hidden = HiddenRows(ctx) if self.layer_taps else None
            parts = [np.zeros((len(logits), 0), dtype=np.float32)]  # a draft model reads no hidden states
            for layer in self.taps:
                if layer == self.n_layer:  # (n, d) final-normed, one row per token (every row is an output)
                    normed = rows(ctx._lib.llama_get_embeddings(ctx._ctx), ctx.n_last, ctx.model.n_embd_out)
                    parts.append(unnormed(normed, self.final_norm))
                else:
                    parts.append(hidden.taps[layer])
            features.append(np.concatenate(parts, axis=-1).astype(np.float16))
            logp = logits - logits.max(axis=-1, keepdims=True)
            logp -= np.log(np.exp(logp).sum(axis=-1, keepdims=True))
            k = min(self.top_k, logp.shape[-1])
            ids = np.argpartition(-logp, k - 1, axis=-1)[:, :k]
            order = np.argsort(-np.take_along_axis(logp, ids, axis=-1), axis=-1, kind="stable")
            ids = np.take_along_axis(ids, order, axis=-1)
            top_ids.append(ids.astype(np.int32))
            top_logp.append(np.take_along_axis(logp, ids, axis=-1).astype(np.float16))
        return np.concatenate(features), np.concatenate(top_ids), np.concatenate(top_logp)

    def close(self) -> None:
        self.context.close()
