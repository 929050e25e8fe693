"""MTP on GGUF targets: llama.cpp's NextN layers as a drafter, driven as common/speculative.cpp's
draft-mtp drives them.

A second llama_context over the target model (loaded with load_mtp) with ctx_type MTP runs
only the NextN block, with its own KV cache. Its row at position p pairs token x_p with the
target's hidden state h_{p-1} (llama_get_embeddings_nextn: final-normed, every row of every
target batch). Catch-up: after each verified target pass the tokens it kept go through the MTP
context, paired with the previous rows' h. Drafting: from (x_last, h_{last-1}) the MTP block
gives logits for the next token and its own h, which feeds the next draft step. Drafts are
the top-1 token (engines/speculation/drafting.py, the rule of both engines).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..speculation.drafting import below_p_min
from ..types import SpecDeskError
from .binding import GgufContext, GgufModel
from .ext import CachedPositions, Entry, HiddenStateProposer, NativeContext, ext, gguf_metadata, rows

LLAMA_CONTEXT_TYPE_MTP = 1


def nextn_layers(path) -> int:
    """How many NextN (MTP) layers a GGUF declares, from its metadata alone (0 for a file
    that cannot be read: loading it then reports what is wrong)."""
    try:
        meta = gguf_metadata(path)
    except Exception:
        return 0
    arch = meta.get("general.architecture", "")
    return int(meta.get(f"{arch}.nextn_predict_layers", 0) or 0)


class MtpDrafter(CachedPositions):
    """The MTP context of one target context; lives as long as the engine."""

    label = "MTP"

    def __init__(self, target: GgufModel, target_ctx: GgufContext, n_threads: int):
        self.ext = ext().require("mtp")
        if not target.load_mtp:
            raise SpecDeskError(f"{target.path}: this GGUF has no MTP (NextN) layers, so method 'mtp' cannot run: "
                                "use a GGUF exported with its MTP layers (e.g. `python -m specdesk.app.demo.export_native_gguf`)")
        n_nextn = target._lib.llama_model_n_layer_nextn(target._model)
        if n_nextn <= 0:
            raise SpecDeskError(f"{target.path}: this GGUF has no MTP (NextN) layers, so method 'mtp' cannot run")
        self.target, self.target_ctx = target, target_ctx
        self.n_embd = target.n_embd_out
        self.n_vocab = target.n_vocab
        self.context = NativeContext(target, target_ctx.n_ctx, n_threads, target_ctx.n_batch,
                                     ctx_type=LLAMA_CONTEXT_TYPE_MTP, ctx_other=target_ctx._ctx,
                                     n_outputs_max=1, n_outputs_max_per_seq=1)
        self.ext.llama_set_embeddings_nextn(self.context.handle, True, True)
        # h_hist[p]: the target's h at position p, to pair with x_{p+1} after a rollback.
        self.h_hist = np.zeros((target_ctx.n_ctx + 1, self.n_embd), dtype=np.float32)
        self.cached: list[int] = []  # tokens whose MTP rows are in the MTP context

    # --- hooks the engine calls -------------------------------------------------------------
    taps: tuple[int, ...] = ()  # reads the target's final-normed rows

    def observe(self, output, tokens: Sequence[int], start: int) -> None:
        """Catch-up on the rows the target kept: rows (x_p, h_{p-1}) for the kept tokens
        tokens[:-1] at start.. (`output.hidden`: the target's h for those positions)."""
        n = len(tokens) - 1
        h = output.hidden[:n]
        self.rollback_to(start, "the target rows start at")
        entries = []
        for j in range(n):
            h_prev = (self.h_hist[start - 1] if start > 0 else self.h_hist[-1]) if j == 0 else h[j - 1]
            entries.append(Entry(pos=start + j, token=int(tokens[j]), embd=np.array(h_prev, copy=True)))
        self.h_hist[start:start + n] = h
        self.feed(entries)
        self.cached.extend(int(t) for t in tokens[:n])

    def draft(self, context: Sequence[int], k: int, p_min: float = 0.0) -> list[int]:
        pos0 = len(context) - 1
        self.rollback_to(pos0, "drafting starts at")
        h = self.h_hist[pos0 - 1] if pos0 > 0 else self.h_hist[-1]
        token = int(context[-1])
        out: list[int] = []
        for i in range(k):
            self.context.process([Entry(pos=pos0 + i, token=token, embd=np.array(h, copy=True), output=True)])
            logits = self.context.logits(0, self.n_vocab)
            token = int(np.argmax(logits))
            if below_p_min(logits, p_min):
                break
            out.append(token)
            if i + 1 < k:
                h = rows(self.ext.llama_get_embeddings_nextn_ith(self.context.handle, 0), 1, self.n_embd)[0].copy()
        self.context.remove_from(pos0)  # the draft region; catch-up rewrites it from the target
        return out

    def set_threads(self, n_threads: int) -> None:
        self.context.set_threads(n_threads)

    def close(self) -> None:
        self.context.close()


class MtpProposer(HiddenStateProposer):
    """The proposer interface over an MtpDrafter."""
