"""Verification of a draft against logits that live on the model's device.

Both greedy and sampled verification run where the logits are, with the semantics of
engines/speculation/verify.py: the same transform (temperature, then top-k, then top-p with ties
to the lower id), computed on the device, and the same acceptance loop, verify.accept_walk
itself, over the device's rows (`_DeviceRows`): the same test u * q(x) < p(x), residual and
rng draws, so a seeded run commits the same tokens as the shared code. Only k probabilities
and one token cross to the host per step, not the (k + 1, V) rows. Float64 is used for the
probabilities as in verify.py; on a device without float64 (Apple's MPS) the rows go to the
host and through verify.py itself. tests/test_torch_verify.py holds every path to verify.py
draw for draw.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from ..speculation.verify import _TOP_P_SLACK, VerifyResult, _fit_width, accept_walk, verify
from ..types import SamplingParams


def verify_on_device(draft_tokens: Sequence[int], draft_probs: Optional[np.ndarray], target_logits: torch.Tensor,
                     sampling: SamplingParams, rng: np.random.Generator) -> VerifyResult:
    """The same result as `verify(draft, probs, target_logits.cpu().numpy(), sampling, rng)`."""
    k = len(draft_tokens)
    if target_logits.ndim != 2 or target_logits.shape[0] != k + 1:
        raise ValueError(f"target_logits must be (k+1, V) = ({k + 1}, V) for {k} draft tokens, "
                         f"got {tuple(target_logits.shape)}")
    if not sampling.greedy:
        if target_logits.device.type == "mps":  # no float64 there: the shared code on the host
            return verify(draft_tokens, draft_probs, target_logits.float().cpu().numpy(), sampling, rng)
        return _verify_sampled(draft_tokens, draft_probs, target_logits, sampling, rng)
    # torch.argmax returns the first maximal index, as np.argmax does.
    target_argmax = torch.argmax(target_logits, dim=1)  # (k+1,)
    if k:
        proposed = torch.as_tensor(list(draft_tokens), device=target_logits.device)
        matches = (proposed == target_argmax[:k]).to(torch.int32)  # (k,)
        accepted = int(torch.cumprod(matches, dim=0).sum())  # length of the matching prefix
    else:
        accepted = 0
    return VerifyResult(accepted, int(target_argmax[accepted]))


def sampling_probs_on_device(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """verify.sampling_probs for (n, V) logits on their device, in float64."""
    rows = logits.to(torch.float64)
    n_rows, vocab = rows.shape
    if 0 < sampling.top_k < vocab:
        top_idx = torch.topk(rows, sampling.top_k, dim=1).indices.sort(dim=1).values  # token-id order
        top = _softmax(rows.gather(1, top_idx), sampling.temperature)
        if sampling.top_p < 1.0:
            top = _nucleus(top, sampling.top_p)
        return torch.zeros_like(rows).scatter_(1, top_idx, top)
    probs = _softmax(rows, sampling.temperature)
    return _nucleus(probs, sampling.top_p) if sampling.top_p < 1.0 else probs


def _softmax(rows: torch.Tensor, temperature: float) -> torch.Tensor:
    scaled = rows / temperature
    scaled = torch.exp(scaled - scaled.max(dim=1, keepdim=True).values)
    return scaled / scaled.sum(dim=1, keepdim=True)


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep each row's smallest highest-probability set with mass >= top_p (ties: lower id first)."""
    ordered, order = torch.sort(probs, dim=1, descending=True, stable=True)
    cumulative = torch.cumsum(ordered, dim=1)
    target = torch.full((probs.shape[0], 1), top_p - _TOP_P_SLACK, dtype=probs.dtype, device=probs.device)
    keep = (torch.searchsorted(cumulative, target, right=False) + 1).clamp_(max=probs.shape[1])  # (n, 1)
    ranks = torch.arange(probs.shape[1], device=probs.device).expand_as(ordered)
    kept = torch.where(ranks < keep, ordered, torch.zeros_like(ordered))
    kept = kept / kept.sum(dim=1, keepdim=True)
    return torch.zeros_like(probs).scatter_(1, order, kept)


def _sample_on_device(probs: torch.Tensor, rng: np.random.Generator) -> int:
    """verify.sample on the device: one rng.random() draw, the same inverse-CDF rule."""
    cumulative = torch.cumsum(probs, dim=0)
    total = float(cumulative[-1])
    if not total > 0:
        raise ValueError("cannot sample from a distribution with no mass")
    point = torch.tensor([rng.random() * total], dtype=cumulative.dtype, device=cumulative.device)
    index = int(torch.searchsorted(cumulative, point, right=True)[0])
    if index >= cumulative.numel():  # u * total rounded up to total: the last token with mass
        index = int(torch.nonzero(probs > 0)[-1, 0])
    return index


class _DeviceRows:
    """verify.TargetRows over the target's rows on their device, in float64: the probability of
    each draft token crosses to the host in one transfer; rows stay on the device."""

    def __init__(self, logits: torch.Tensor, draft_tokens: Sequence[int], sampling: SamplingParams):
        self._p = sampling_probs_on_device(logits, sampling)  # (k + 1, V)
        k, vocab = len(draft_tokens), logits.shape[1]
        inside = [t if 0 <= t < vocab else 0 for t in draft_tokens]
        self._p_at_draft = (self._p[torch.arange(k, device=self._p.device),
                                    torch.tensor(inside, device=self._p.device)].cpu().numpy() if k else [])  # (k,)

    def row(self, position: int) -> torch.Tensor:
        return self._p[position]

    def token_prob(self, position: int, token: int) -> float:
        return float(self._p_at_draft[position]) if 0 <= token < self._p.shape[1] else 0.0

    def residual(self, position: int, token: int, q_row: Optional[np.ndarray]) -> torch.Tensor:
        if q_row is None:
            residual = self._p[position].clone()
            if 0 <= token < self._p.shape[1]:
                residual[token] = 0.0
            return residual
        q = torch.from_numpy(_fit_width(q_row, self._p.shape[1])).to(device=self._p.device, dtype=self._p.dtype)
        return (self._p[position] - q).clamp_(min=0.0)

    def mass(self, row: torch.Tensor) -> float:
        return float(row.sum())

    def sample(self, row: torch.Tensor, rng: np.random.Generator) -> int:
        return _sample_on_device(row, rng)


def _verify_sampled(draft_tokens: Sequence[int], draft_probs: Optional[np.ndarray], logits: torch.Tensor,
                    sampling: SamplingParams, rng: np.random.Generator) -> VerifyResult:
    tokens = [int(t) for t in draft_tokens]
    return accept_walk(tokens, draft_probs, _DeviceRows(logits, tokens, sampling), rng)
