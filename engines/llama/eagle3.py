"""EAGLE-3 on GGUF targets: an eagle3-architecture drafter GGUF, driven as
common/speculative.cpp's draft-eagle3 drives it.

The target outputs the inputs of three of its layers (`eagle3.target_layers`, low, middle,
high). After each verified target pass the drafter's encoder graph fuses the kept rows per position,
g_P = fc(cat3) (llama_get_embeddings_nextn of the drafter). Its one decoder layer then
takes, at position P, the pair (token x_{P+1}, g_P) and predicts x_{P+2}; so row P can be
written once x_{P+1} is known, and the row for the last committed position waits for the
token the target picked. Drafting writes that row with the newest token, then feeds each
draft token back with the layer's pre-norm output in place of g. Drafts are the top-1
token: q is one-hot and verification stays exact at any temperature.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

import numpy as np

from ..speculation.compat import check_compatible
from ..speculation.drafting import below_p_min
from ..types import SpecDeskError
from .binding import GgufContext, GgufModel, common_prefix
from .ext import Entry, HiddenStateProposer, LayerInputDrafter, NativeContext, check_drafter, ext, rows


def load_native(engine, path) -> "Eagle3Drafter":
    """The method table's loader (engines/methods.py): an EAGLE-3 drafter GGUF over this target."""
    return Eagle3Drafter(path, engine.target, engine.context, engine.n_threads,
                         model_options=engine.drafter_options(path))


class Eagle3Drafter(LayerInputDrafter):
    """An EAGLE-3 drafter context over one target context; lives as long as the engine."""

    def __init__(self, path: str | os.PathLike, target: GgufModel, target_ctx: GgufContext, n_threads: int,
                 model_options: Optional[dict] = None):
        self.ext = ext().require("eagle3")
        check_drafter(path, target, "eagle3")
        self.model = GgufModel(path, **(model_options or {}))  # its placement (engine.py)
        try:
            check_compatible(target, self.model)
            n_ids = self.ext.llama_model_target_layer_ids_n(self.model._model)
            ids = self.ext.llama_model_target_layer_ids(self.model._model)
            self.layer_ids = [int(ids[i]) for i in range(n_ids)]
            self.context = NativeContext(self.model, target_ctx.n_ctx, n_threads, target_ctx.n_batch,
                                         ctx_other=target_ctx._ctx)
        except Exception:
            self.model.close()
            raise
        self.ext.llama_set_embeddings_nextn(self.context.handle, True, True)
        self.target, self.target_ctx = target, target_ctx
        self.n_embd_tgt = target.n_embd
        self.n_embd = self.model.n_embd
        self.n_vocab = target.n_vocab
        self.g_hist = np.zeros((target_ctx.n_ctx + 1, self.n_embd), dtype=np.float32)  # g_P by position
        self.tokens: list[int] = []  # the target's tokens by position, as observed
        self.n_rows = 0  # decoder rows 0..n_rows-1 are in the drafter's cache
        self.boundary: tuple[int, int] | None = None  # (P + 1, token): row P was written by draft() with that token

    # --- hooks the engine calls -------------------------------------------------------------
    def valid_prefix(self, tokens: Sequence[int]) -> int:
        n = common_prefix(self.tokens, tokens)
        self.rollback(n)
        return n

    def rollback(self, n_keep: int, next_token: int | None = None) -> None:
        """Keep the first n_keep target positions; row P needs x_{P+1}, so rows < n_keep - 1
        stay, and row n_keep - 1 too when draft() wrote it with the token that does follow."""
        del self.tokens[n_keep:]
        rows_keep = max(0, n_keep - 1)
        if self.boundary is not None and self.boundary == (n_keep, next_token):
            rows_keep = n_keep
        self.boundary = None
        if self.n_rows > rows_keep:
            self.context.remove_from(rows_keep)
            self.n_rows = rows_keep

    def observe(self, output, tokens: Sequence[int], start: int) -> None:
        """Fuse the target's features for the kept tokens tokens[:-1] at start.. (g_P), then
        write the decoder rows whose next token is known."""
        n = len(tokens) - 1
        self.rollback(start, int(tokens[0]))
        if len(self.tokens) != start:
            raise SpecDeskError(f"EAGLE-3 context out of step: it holds {len(self.tokens)} positions, the target rows start at {start}")
        features = np.concatenate([output.taps[layer][:n] for layer in self.layer_ids], axis=1)  # (n, 3 * n_embd_tgt)
        step = self.context.n_batch
        for first in range(0, n, step):
            chunk = features[first:first + step]
            pos = self.context.pos_max() + 1  # the encoder ignores positions; llama.cpp wants them to follow the cache
            self.context.process([Entry(pos=pos + j, embd=row, output=True) for j, row in enumerate(chunk)],
                                 encode=True)
            self.g_hist[start + first:start + first + len(chunk)] = rows(
                self.ext.llama_get_embeddings_nextn(self.context.handle), len(chunk), self.n_embd)
        self.tokens.extend(int(t) for t in tokens[:n])
        self._fill_rows(len(self.tokens) - 1)

    def _fill_rows(self, upto: int) -> None:
        """Decoder rows (x_{P+1}, g_P) for P in [n_rows, upto)."""
        for start in range(self.n_rows, upto, self.context.n_batch):
            stop = min(upto, start + self.context.n_batch)
            self.context.process([Entry(pos=p, token=self.tokens[p + 1], embd=self.g_hist[p].copy())
                                  for p in range(start, stop)])
        self.n_rows = max(self.n_rows, upto)

    def draft(self, context: Sequence[int], k: int, p_min: float = 0.0) -> list[int]:
        pos0 = len(context) - 1
        self.rollback(pos0)
        if len(self.tokens) != pos0:
            raise SpecDeskError(f"EAGLE-3 context out of step: it holds {len(self.tokens)} positions, drafting starts at {pos0}")
        if pos0 == 0:
            return []  # no target features yet
        entry = Entry(pos=pos0 - 1, token=int(context[-1]), embd=self.g_hist[pos0 - 1].copy(), output=True)
        out: list[int] = []
        for i in range(k):
            self.context.process([entry])
            logits = self.context.logits(0, self.n_vocab)
            token = int(np.argmax(logits))
            if below_p_min(logits, p_min):
                break
            out.append(token)
            prenorm = rows(self.ext.llama_get_embeddings_nextn_ith(self.context.handle, 0), 1, self.n_embd)[0].copy()
            entry = Entry(pos=pos0 + i, token=token, embd=prenorm, output=True)
        self.context.remove_from(pos0)  # the draft rows; row pos0 - 1 holds the committed last token
        self.n_rows = pos0
        self.boundary = (pos0, int(context[-1]))
        return out


class Eagle3Proposer(HiddenStateProposer):
    """The proposer interface over an Eagle3Drafter."""
