"""Cross-vocabulary drafting on this engine: engines/speculation/crossvocab.py over the
draft-model method's context and logits (draft.py)."""

from __future__ import annotations

from ..speculation.crossvocab import CrossVocabDrafting
from .draft import DraftProposer


class CrossVocabProposer(CrossVocabDrafting, DraftProposer):
    pass
