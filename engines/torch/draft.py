"""Draft-model proposer: a second, smaller Hugging Face model on the same device drafts k tokens
(the shared proposer of engines/speculation/drafting.py over a TorchContext)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..speculation.drafting import ModelDraftProposer


class DraftProposer(ModelDraftProposer):
    def _next_logits(self, tokens: Sequence[int]) -> np.ndarray:
        return self.context.decode(tokens, all_logits=False).logits[-1].float().cpu().numpy()
