"""Verification of a draft against logits that live on the model's device.

Greedy verification runs where the logits are (one argmax per row, k + 1 integers cross to
the host). Sampling hands the (k + 1, V) rows to engines/spec/verify.py as float32 numpy,
so the torch and llama engines accept and resample by literally the same code, and the
same rng draws give the same tokens; tests/test_torch_verify.py holds both paths to it.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from ..spec.verify import VerifyResult, verify
from ..types import SamplingParams


def verify_on_device(draft_tokens: Sequence[int], draft_probs: Optional[np.ndarray], target_logits: torch.Tensor,
                     sampling: SamplingParams, rng: np.random.Generator) -> VerifyResult:
    """The same result as `verify(draft, probs, target_logits.cpu().numpy(), sampling, rng)`."""
    k = len(draft_tokens)
    if target_logits.ndim != 2 or target_logits.shape[0] != k + 1:
        raise ValueError(f"target_logits must be (k+1, V) = ({k + 1}, V) for {k} draft tokens, "
                         f"got {tuple(target_logits.shape)}")
    if not sampling.greedy:
        return verify(draft_tokens, draft_probs, target_logits.float().cpu().numpy(), sampling, rng)
    # torch.argmax returns the first maximal index, as np.argmax does.
    target_argmax = torch.argmax(target_logits, dim=1)  # (k+1,)
    if k:
        proposed = torch.as_tensor(list(draft_tokens), device=target_logits.device)
        matches = (proposed == target_argmax[:k]).to(torch.int32)  # (k,)
        accepted = int(torch.cumprod(matches, dim=0).sum())  # length of the matching prefix
    else:
        accepted = 0
    return VerifyResult(accepted, int(target_argmax[accepted]))
