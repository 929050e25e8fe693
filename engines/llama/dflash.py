"""DFlash and DSpark on GGUF targets: a dflash-architecture drafter GGUF, driven as
common/speculative.cpp's draft-dflash drives it.

The target outputs the *input* embeddings of the drafter's target layers
(llama_set/get_embeddings_layer_inp; the GGUF's `dflash.target_layers` are z-lab's
target_layer_ids + 1). After each verified target pass the rows of the tokens it kept, concatenated per position, go
into the drafter as embedding rows at the same positions: its graph projects them (fc,
hidden_norm) and writes them into its KV cache as context. A draft is one non-causal pass
over the block [last token, mask x n] at the next positions; rows 1..n give the drafts
(DSpark with sample_from_anchor reads rows 0..n-1 of an anchor-first block, whose logits
already carry its Markov bias: llama.cpp's graph runs the greedy chain). The block's
rows are removed right after, and a rejected draft's rows never reach it, so the
drafter's cache always mirrors the target's. Drafts are top-1 tokens: q is one-hot and
verification stays exact at any temperature.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

import numpy as np

from ..speculation.compat import check_compatible
from ..speculation.drafting import below_p_min
from ..types import SpecDeskError
from .binding import GgufContext, GgufModel
from .ext import CachedPositions, Entry, HiddenStateProposer, LayerInputDrafter, NativeContext, check_drafter, ext

def load_native(engine, path) -> "DFlashDrafter":
    """The method table's loader (engines/methods.py): a DFlash drafter GGUF over this target."""
    return DFlashDrafter(path, engine.target, engine.context, engine.n_threads,
                         model_options=engine.drafter_options(path))


class DFlashDrafter(LayerInputDrafter, CachedPositions):
    """A DFlash / DSpark drafter context over one target context; lives as long as the engine."""

    label = "DFlash"

    def __init__(self, path: str | os.PathLike, target: GgufModel, target_ctx: GgufContext, n_threads: int,
                 model_options: Optional[dict] = None):
        self.ext = ext().require("dflash")
        meta = check_drafter(path, target, "dflash")
        self.model = GgufModel(path, **(model_options or {}))  # its placement (engine.py)
        try:
            check_compatible(target, self.model)
            if self.ext.llama_model_dflash_selector_top_k(self.model._model) > 0:
                raise SpecDeskError(f"{self.model.path}: a DFlash2 selector drafter; only DFlash and DSpark drafters are supported")
            n_ids = self.ext.llama_model_target_layer_ids_n(self.model._model)
            ids = self.ext.llama_model_target_layer_ids(self.model._model)
            self.layer_ids = [int(ids[i]) for i in range(n_ids)]
            self.block_size = int(meta.get("dflash.block_size", 16))
            self.causal = bool(meta.get("dflash.attention.causal", False))
            self.is_dspark = "markov_w1.weight" in meta["__tensors__"]
            self.from_anchor = self.is_dspark and bool(meta.get("dflash.sample_from_anchor", True))
            self.mask_token = self.model._lib.llama_vocab_mask(self.model._vocab)
            if self.mask_token < 0:
                raise SpecDeskError(f"{self.model.path}: no mask token (tokenizer.ggml.mask_token_id)")
            self.max_draft = self.block_size if self.from_anchor else self.block_size - 1
            self.context = NativeContext(self.model, target_ctx.n_ctx, n_threads, target_ctx.n_batch,
                                         ctx_other=target_ctx._ctx, n_outputs_max=self.block_size)
        except Exception:
            self.model.close()
            raise
        self.ext.llama_set_embeddings_nextn(self.context.handle, True, True)
        self.model._lib.llama_set_causal_attn(self.context.handle, self.causal)
        self.target, self.target_ctx = target, target_ctx
        self.n_embd = target.n_embd
        self.n_vocab = target.n_vocab
        self.cached: list[int] = []  # tokens whose features are in the drafter's cache

    # --- hooks the engine calls -------------------------------------------------------------
    def observe(self, output, tokens: Sequence[int], start: int) -> None:
        """Inject the target's features for the kept tokens tokens[:-1] at start.. into the drafter's cache."""
        n = len(tokens) - 1
        self.rollback_to(start, "the target rows start at")
        features = np.concatenate([output.taps[layer][:n] for layer in self.layer_ids], axis=1)  # (n, L * n_embd)
        self.feed([Entry(pos=start + j, embd=row) for j, row in enumerate(features)])
        self.cached.extend(int(t) for t in tokens[:n])

    def draft(self, context: Sequence[int], k: int, p_min: float = 0.0) -> list[int]:
        pos0 = len(context) - 1
        self.rollback_to(pos0, "drafting starts at")
        n_draft = min(k, self.max_draft)
        n_block = n_draft if self.from_anchor else n_draft + 1
        block = [int(context[-1])] + [self.mask_token] * (n_block - 1)
        self.context.process([Entry(pos=pos0 + i, token=t, output=True) for i, t in enumerate(block)])
        first = 0 if self.from_anchor else 1
        out: list[int] = []
        for i in range(first, n_block):
            logits = self.context.logits(i, self.n_vocab)
            if below_p_min(logits, p_min):
                break
            out.append(int(np.argmax(logits)))
        self.context.remove_from(pos0)  # the block; the target's features for these positions come next
        return out


class DFlashProposer(HiddenStateProposer):
    """The proposer interface over a DFlashDrafter."""
