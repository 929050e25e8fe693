"""Draft-model proposer: a smaller GGUF model in its own context drafts k tokens
(the shared proposer of engines/speculation/drafting.py over a llama.cpp context)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..speculation.drafting import ModelDraftProposer


class DraftProposer(ModelDraftProposer):
    def _next_logits(self, tokens: Sequence[int]) -> np.ndarray:
        return self.context.decode(list(tokens), all_logits=False)[-1]
