"""Whether a draft with a vocabulary of its own will pay for a target, measured before a user
commits to the pair: what `specdesk models pair` prints for it and the pairing dialog shows.

- overlap: the share of the target's tokens in a few prompts (its common tokens, counted as
  they occur) that the draft has as single tokens; sampled drafting keeps to those
  (engines/speculation/crossvocab.py), so a low overlap caps sampled acceptance;
- the cost of retokenizing per drafted token, against the draft's own step;
- acceptance on a few prompts, greedy, through the method itself;
- the expected speedup from this machine's costs as measured in those runs: the target's pass
  over one token (plain decoding) and over the draft (verification), the drafting, and the
  tokens each pass commits.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

from specdesk.engines.methods import METHODS
from specdesk.engines.speculation.crossvocab import CrossVocabDrafting
from specdesk.engines.speculation.retokenize import intersection, vocab_of
from specdesk.engines.types import GenerationRequest, SpecConfig

# The method whose proposer drafts across vocabularies, as the table names it.
CROSS_VOCAB = next(name for name, info in METHODS.items() if CrossVocabDrafting.engine_class in repr(info.proposer))
# What a refusal for the vocabulary alone says (engines/speculation/compat.py): a draft refused
# only for these is a cross-vocabulary draft.
VOCAB_REASONS = ("vocab type ", "vocab size ", "BOS id ", "EOS id ", "token ")
PROBE_PROMPTS = ("def read_lines(path):\n", "The capital of France is", "import os\n\n\ndef main():\n",
                 "Once upon a time, there was a")


def refused_for_vocabulary(reasons: Sequence[str]) -> bool:
    """A pairing refusal whose every reason is the vocabulary: the draft can still serve the
    target across vocabularies."""
    return bool(reasons) and all(r.startswith(VOCAB_REASONS) for r in reasons)


def vocab_overlap(target, draft, texts: Sequence[str]) -> float:
    """The share of the target's tokens of `texts` (as they occur) the draft has as single tokens."""
    draft_pieces = vocab_of(draft).by_bytes
    pieces = [target.token_bytes(t) for text in texts for t in target.tokenize(text, add_bos=False)]
    pieces = [p for p in pieces if p]
    return sum(p in draft_pieces for p in pieces) / len(pieces) if pieces else 0.0


@dataclass(frozen=True)
class Runs:
    tokens: int = 0
    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    wall_s: float = 0.0
    retokenize_s: float = 0.0
    draft_tokens: int = 0  # the draft model's own tokens decoded while drafting


def run_prompts(engine, prompts: Sequence[str], spec: SpecConfig, max_tokens: int) -> Runs:
    """Greedy runs of `prompts`, their counts and times added up."""
    total: dict = asdict(Runs())
    for prompt in prompts:
        request = GenerationRequest(tuple(engine.tokenize(prompt)), max_tokens=max_tokens, spec=spec)
        started = time.perf_counter()
        for event in engine.generate(request, threading.Event()):
            total["tokens"] += len(event.tokens)
            total["passes"] += 1
            total["drafted"] += event.drafted
            total["accepted"] += event.accepted
            total["draft_s"] += event.draft_s
            total["verify_s"] += event.verify_s
        total["wall_s"] += time.perf_counter() - started
        stats = engine.last_proposer.stats() if engine.last_proposer is not None else {}
        total["retokenize_s"] += stats.get("retokenize_s", 0.0)
        total["draft_tokens"] += stats.get("draft_tokens", 0)
    return Runs(**total)


@dataclass(frozen=True)
class CrossVocabPrediction:
    target: str
    draft: str
    k: int
    overlap: float  # share of the target's common tokens the draft has as single tokens
    shared_tokens: int  # tokens both vocabularies have (the same text)
    acceptance: float  # draft tokens accepted / drafted, greedy
    retokenize_ms_per_token: float  # per drafted (target) token
    draft_step_ms: float  # the draft model's own step, per token it decodes
    target_pass_ms: float  # plain decoding's pass over one token
    verify_pass_ms: float  # the target's pass over the last token and a draft
    expected_speedup: float  # from the costs and tokens per pass above
    measured_speedup: float  # wall time of the same prompts, plain over cross-vocabulary
    pays: bool
    verdict: str  # in words, saying plainly when it will not pay

    def to_json(self) -> dict:
        return {key: (round(value, 4) if isinstance(value, float) else value) for key, value in asdict(self).items()}


def predict(engine, draft_path: str, prompts: Sequence[str] = PROBE_PROMPTS, k: int = 4,
            max_tokens: int = 24) -> CrossVocabPrediction:
    """Measure a cross-vocabulary draft for `engine`'s target (a loaded LlamaEngine or TorchEngine)."""
    draft = engine.load_draft(draft_path, same_vocabulary=False).model
    shared = intersection(engine.target, draft).size
    overlap = vocab_overlap(engine.target, draft, prompts)
    plain = run_prompts(engine, prompts, SpecConfig(method="none"), max_tokens)
    cross = run_prompts(engine, prompts, SpecConfig(method=CROSS_VOCAB, k=k, draft_path=draft_path), max_tokens)
    t1 = (plain.verify_s + plain.draft_s) / max(1, plain.passes)
    verify = cross.verify_s / max(1, cross.passes)
    step = (cross.verify_s + cross.draft_s) / max(1, cross.passes)
    expected = (cross.tokens / max(1, cross.passes)) / step * t1 if step > 0 else 0.0
    measured = (plain.wall_s / max(1, plain.tokens)) / (cross.wall_s / max(1, cross.tokens)) if cross.wall_s else 0.0
    acceptance = cross.accepted / cross.drafted if cross.drafted else 0.0
    retok = cross.retokenize_s / max(1, cross.drafted) * 1e3
    draft_step = max(0.0, cross.draft_s - cross.retokenize_s) / max(1, cross.draft_tokens) * 1e3
    return CrossVocabPrediction(
        str(engine.target.path), str(draft_path), k, overlap, shared, acceptance, retok, draft_step, t1 * 1e3,
        verify * 1e3, expected, measured, expected > 1.0,
        _verdict(expected, acceptance, overlap, draft_step, t1 * 1e3, Path(draft_path).name))


def _verdict(expected: float, acceptance: float, overlap: float, draft_step_ms: float, pass_ms: float,
             name: str) -> str:
    if expected > 1.0:
        return (f"{name} as a cross-vocabulary draft: expected {expected:.2f}x here (acceptance {acceptance:.0%}, "
                f"{overlap:.0%} of the target's tokens shared)")
    why = (f"acceptance is {acceptance:.0%}" if draft_step_ms < pass_ms
           else f"a draft step costs {draft_step_ms:.1f} ms against {pass_ms:.1f} ms for a target pass")
    return (f"will not pay here: expected {expected:.2f}x with {name} as a cross-vocabulary draft ({why}; "
            f"{overlap:.0%} of the target's tokens shared)")


def predict_files(target_path: str, draft_path: str, prompts: Sequence[str] = PROBE_PROMPTS, k: int = 4,
                  max_tokens: int = 24, n_threads: Optional[int] = None) -> CrossVocabPrediction:
    """`predict` for a GGUF target and draft, loaded here and closed after."""
    from specdesk.engines.llama.engine import LlamaEngine

    engine = LlamaEngine(target_path, n_ctx=512, n_threads=n_threads)
    try:
        return predict(engine, draft_path, prompts, k, max_tokens)
    finally:
        engine.close()
