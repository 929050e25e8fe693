"""MTP on GGUF targets: llama.cpp's NextN layers as a drafter, driven as common/speculative.cpp's
draft-mtp drives them.

A second llama_context over the target model (loaded with load_mtp) with ctx_type MTP runs
only the NextN block, with its own KV cache. Its row at position p pairs token x_p with the
target's hidden state h_{p-1} (llama_get_embeddings_nextn: final-normed, every row of every
target batch). Catch-up: after each verified target pass the tokens it kept go through the MTP
context, paired with the previous rows' h. Drafting: from (x_last, h_{last-1}) the MTP block
gives logits for the next token and its own h, which feeds the next draft step. Drafts are
the top-1 token (engines/speculation/drafting.py, the rule of both engines).

The first draft row rides with the catch-up: it is the row right after the kept ones, and
everything it reads (x_last, the target's h before it) is known once the target has verified,
so the catch-up batch computes it too, with its logits and h kept for the draft that follows.
That saves one MTP decode per step (a decode of one row costs about what a batch of three
does on a CPU). A draft that does not follow, or starts elsewhere, drops the primed row.

The row drafting starts from, (x_last, h_{last-1}), is the first row the next catch-up would
write: its inputs are the target's, not the drafter's. So it stays in the MTP context after
the draft (the rows after it, computed from the block's own h, go), and the catch-up starts
one row later: a row less in every catch-up, and a catch-up of one row, when no draft token
was accepted, has the shape of a draft decode, whose graph llama.cpp then reuses.
"""

from __future__ import annotations

from typing import Optional, Sequence

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


def load_native(engine, path=None) -> "MtpDrafter":
    """The method table's loader (engines/methods.py): the target's own MTP layers."""
    return MtpDrafter(engine.target, engine.context, engine.n_threads)


def native_problem(engine) -> Optional[str]:
    """Why this target cannot run MTP (the method table's check), or None."""
    return None if engine.target.load_mtp else f"{engine.target.path.name} has no MTP (NextN) layers"


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
        # Unmasked: the block's h of every row of a batch, by batch index (masked, llama.cpp copies the
        # first n_outputs rows of a batch, which is the output row only when the batch is one row).
        self.ext.llama_set_embeddings_nextn(self.context.handle, True, False)
        # h_hist[p]: the target's h at position p, to pair with x_{p+1} after a rollback.
        self.h_hist = np.zeros((target_ctx.n_ctx + 1, self.n_embd), dtype=np.float32)
        self.cached: list[int] = []  # tokens whose MTP rows are in the MTP context
        # the first draft row computed with the catch-up: (position, token, logits, the block's h), its
        # row in the MTP context beyond `cached`
        self.primed: tuple[int, int, np.ndarray, np.ndarray] | None = None

    # --- hooks the engine calls -------------------------------------------------------------
    taps: tuple[int, ...] = ()  # reads the target's final-normed rows

    def observe(self, output, tokens: Sequence[int], start: int) -> None:
        """Catch-up on the rows the target kept: rows (x_p, h_{p-1}) for the kept tokens
        tokens[:-1] at start.. (`output.hidden`: the target's h for those positions)."""
        n = len(tokens) - 1
        h = output.hidden[:n]
        kept = self._keep_first_row(start, int(tokens[0])) if n > 0 else 0
        self.rollback_to(start + kept, "the target rows start at")
        entries = []
        for j in range(kept, n):
            h_prev = (self.h_hist[start - 1] if start > 0 else self.h_hist[-1]) if j == 0 else h[j - 1]
            entries.append(Entry(pos=start + j, token=int(tokens[j]), embd=np.array(h_prev, copy=True)))
        self.h_hist[start:start + n] = h
        pos0 = start + n  # the first draft row: the last token, paired with the h before it
        h_last = self.h_hist[pos0 - 1] if pos0 > 0 else self.h_hist[-1]
        entries.append(Entry(pos=pos0, token=int(tokens[n]), embd=np.array(h_last, copy=True), output=True))
        self.feed(entries)
        self.cached.extend(int(t) for t in tokens[kept:n])
        last = (len(entries) - 1) % self.context.n_batch  # the primed row's index in the last batch fed
        self.primed = (pos0, int(tokens[n]), self.context.logits(last, self.n_vocab).copy(),
                       rows(self.ext.llama_get_embeddings_nextn_ith(self.context.handle, last), 1, self.n_embd)[0].copy())

    def _keep_first_row(self, start: int, token: int) -> int:
        """1 when the row (token, h_{start-1}) at `start` is already in the MTP context (the row a
        draft started from, or a primed row no draft used), else 0."""
        if len(self.cached) > start and self.cached[start] == token:
            return 1
        if self.primed is not None and self.primed[:2] == (start, token) and len(self.cached) == start:
            self.primed = None  # its row stays, now as a cached one
            self.cached.append(token)
            return 1
        return 0

    def rollback(self, n_keep: int) -> None:
        self._drop_primed()
        super().rollback(n_keep)

    def _drop_primed(self) -> None:
        if self.primed is not None:
            self.context.remove_from(self.primed[0])
            self.primed = None

    def draft(self, context: Sequence[int], k: int, p_min: float = 0.0) -> list[int]:
        pos0 = len(context) - 1
        token = int(context[-1])
        primed = self.primed if self.primed is not None and self.primed[:2] == (pos0, token) else None
        if primed is None:
            self.rollback_to(pos0, "drafting starts at")  # drops a primed row for another position
        elif len(self.cached) != pos0:
            raise SpecDeskError(f"MTP context out of step: it holds {len(self.cached)} positions, "
                                f"drafting starts at {pos0}")
        self.primed = None
        h = self.h_hist[pos0 - 1] if pos0 > 0 else self.h_hist[-1]
        out: list[int] = []
        for i in range(k):
            if i == 0 and primed is not None:  # computed with the catch-up
                logits, h_next = primed[2], primed[3]
            else:
                self.context.process([Entry(pos=pos0 + i, token=token, embd=np.array(h, copy=True), output=True)])
                logits, h_next = self.context.logits(0, self.n_vocab), None
            token = int(np.argmax(logits))
            if below_p_min(logits, p_min):
                break
            out.append(token)
            if i + 1 < k:
                h = h_next if h_next is not None else \
                    rows(self.ext.llama_get_embeddings_nextn_ith(self.context.handle, 0), 1, self.n_embd)[0].copy()
        # Any draft wrote row pos0 (here or, primed, in the catch-up), and it read only the
        # target's rows: it stays, and the next catch-up starts after it.
        self.context.remove_from(pos0 + 1 if k > 0 else pos0)
        if k > 0:
            self.cached.append(int(context[-1]))
        return out

    def set_threads(self, n_threads: int) -> None:
        self.context.set_threads(n_threads)

    def close(self) -> None:
        self.context.close()


class MtpProposer(HiddenStateProposer):
    """The proposer interface over an MtpDrafter."""
