"""GGUF targets on llama.cpp: the generation loop of DESIGN.md.

One step: propose up to k tokens -> one target pass over [last, d1..dk] with logits for
every row -> accept a prefix (engines/spec/verify.py) -> commit accepted + one target
token -> roll the KV cache back past the rejected tail. Baseline is the same loop with
k = 0, so baseline and speculative numbers come from the same code.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Iterator, Optional

import numpy as np

from ..spec.loop import check_prompt, commit, step_budget, step_event
from ..spec.ngram import NgramPoolProposer, PromptLookupProposer
from ..spec.verify import verify
from ..text import IncrementalDetokenizer
from ..types import Draft, GenerationRequest, SpecConfig, SpecDeskError, StepEvent
from .binding import GgufContext, GgufModel, validated_header
from .compat import describe, incompatibilities
from .draft import DraftModelProposer
from .validate import check_context

SUPPORTED_METHODS = ("none", "ngram", "ngram-pool", "draft", "mtp", "dflash", "eagle3")


def default_threads() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


class LlamaEngine:
    name = "llama.cpp"

    def __init__(self, target_path: str | os.PathLike, n_ctx: int = 0, n_threads: Optional[int] = None,
                 n_batch: int = 512, progress: Optional[Callable[[float], None]] = None):
        self.n_threads = n_threads or default_threads()
        if self.n_threads < 1:
            raise SpecDeskError(f"threads = {self.n_threads} is out of range: use 1 or more")
        from .mtp import nextn_layers

        header = validated_header(target_path)
        self.n_ctx = n_ctx or min(int(header.arch_value("context_length") or 4096), 4096)
        check_context(header, self.n_ctx)  # before any weights load
        self.target = GgufModel(target_path, load_mtp=nextn_layers(target_path) > 0, progress=progress)
        self.context = GgufContext(self.target, self.n_ctx, self.n_threads, n_batch)
        self._drafts: dict[str, GgufContext] = {}
        self._native: dict = {}  # MTP / DFlash drafters over this target, created on first use
        self._observer = None  # the proposer the target hands its hidden states to
        self.pool = NgramPoolProposer()  # learns across the turns of a chat
        self.last_proposer = None

    # --- models -----------------------------------------------------------
    def load_draft(self, path: str | os.PathLike,
                   progress: Optional[Callable[[float], None]] = None) -> GgufContext:
        """Load (once) and check a draft model; refusals say which property differed."""
        key = os.path.abspath(path)
        if key not in self._drafts:
            check_context(validated_header(path), self.n_ctx)  # before any weights load
            draft = GgufModel(path, progress=progress)
            reasons = incompatibilities(self.target, draft)
            if reasons:
                draft.close()
                raise SpecDeskError(describe(self.target, draft, reasons))
            self._drafts[key] = GgufContext(draft, self.n_ctx, self.n_threads, self.context.n_batch)
        return self._drafts[key]

    def load_native(self, method: str, path: str | os.PathLike | None = None):
        """The MTP drafter of this target, or a DFlash drafter GGUF for it (created once)."""
        key = method if path is None else f"{method}:{os.path.abspath(path)}"
        if key not in self._native:
            if method == "mtp":
                from .mtp import MtpDrafter

                self._native[key] = MtpDrafter(self.target, self.context, self.n_threads)
            elif method == "eagle3":
                from .eagle3 import Eagle3Drafter

                self._native[key] = Eagle3Drafter(path, self.target, self.context, self.n_threads)
            else:
                from .dflash import DFlashDrafter

                self._native[key] = DFlashDrafter(path, self.target, self.context, self.n_threads)
        return self._native[key]

    def method_availability(self) -> dict[str, Optional[str]]:
        """Each method of this engine: None where this target can run it now, else why not."""
        reasons: dict[str, Optional[str]] = {m: None for m in SUPPORTED_METHODS}
        if "mtp" in reasons and not self.target.load_mtp:
            reasons["mtp"] = f"{self.target.path.name} has no MTP (NextN) layers"
        if "dflash" in reasons and not any(key.startswith("dflash:") for key in self._native):
            reasons["dflash"] = ("needs a DFlash drafter GGUF made for this target: choose one as the draft "
                                 "(or pass --draft FILE)")
        if "eagle3" in reasons and not any(key.startswith("eagle3:") for key in self._native):
            reasons["eagle3"] = ("needs an EAGLE-3 drafter GGUF made for this target: choose one as the draft "
                                 "(or pass --draft FILE)")
        from .ext import available_methods  # resolves the llama-ext.h symbols once

        for method, missing in available_methods().items():
            if method in reasons and missing:
                reasons[method] = f"disabled: this libllama does not export {', '.join(missing)}"
        return reasons

    def set_threads(self, n_threads: int) -> None:
        self.n_threads = n_threads
        self.context.set_threads(n_threads)
        for ctx in [*self._drafts.values(), *self._native.values()]:
            ctx.set_threads(n_threads)

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return self.target.tokenize(text, add_bos=add_bos and self.target.vocab.add_bos)

    def detokenize(self, tokens) -> str:
        return self.target.detokenize(tokens)

    def close(self) -> None:
        for drafter in self._native.values():
            drafter.close()
        self._native.clear()
        for ctx in self._drafts.values():
            ctx.close()
            ctx.model.close()
        self._drafts.clear()
        self.context.close()
        self.target.close()

    def reset_chat(self) -> None:
        """A new conversation: the n-gram pool forgets what it learned."""
        self.pool.reset()

    def _proposer(self, spec: SpecConfig, request: GenerationRequest, rng: np.random.Generator):
        if spec.method == "none":
            return None
        if spec.method == "ngram":
            return PromptLookupProposer(spec.ngram_min, spec.ngram_max)
        if spec.method == "ngram-pool":
            return self.pool
        if spec.method == "draft":
            return DraftModelProposer(self.load_draft(spec.draft_path), request.sampling, rng, spec.draft_p_min)
        if spec.method == "mtp":
            from .mtp import MtpProposer

            return MtpProposer(self.load_native("mtp"), spec.draft_p_min)
        if spec.method == "dflash":
            if not spec.draft_path:
                raise SpecDeskError("method 'dflash' needs a DFlash drafter GGUF: pass --draft PATH")
            from .dflash import DFlashProposer

            return DFlashProposer(self.load_native("dflash", spec.draft_path), spec.draft_p_min)
        if spec.method == "eagle3":
            if not spec.draft_path:
                raise SpecDeskError("method 'eagle3' needs an EAGLE-3 drafter GGUF: pass --draft PATH")
            from .eagle3 import Eagle3Proposer

            return Eagle3Proposer(self.load_native("eagle3", spec.draft_path), spec.draft_p_min)
        raise SpecDeskError(
            f"method {spec.method!r} is not available for GGUF targets yet: use one of {', '.join(SUPPORTED_METHODS)}"
        )

    def _route_hidden_states(self, proposer) -> None:
        """Only an active MTP / DFlash / EAGLE-3 proposer makes the target output its hidden
        states (switching costs llama.cpp a graph rebuild, so the same drafter stays attached)."""
        wanted = proposer if getattr(proposer, "needs_hidden_states", False) else None
        previous = self._observer
        self._observer = wanted
        if previous is not None and wanted is not None and previous.drafter is wanted.drafter:
            return
        if previous is not None:
            previous.detach()
        if wanted is not None:
            wanted.attach()

    # --- generation -------------------------------------------------------
    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[StepEvent]:
        prompt = list(request.prompt_tokens)
        check_prompt(prompt, self.n_ctx, self.target.n_vocab)
        rng = np.random.default_rng(request.sampling.seed)
        proposer = self._proposer(request.spec, request, rng)
        self.last_proposer = proposer
        self._route_hidden_states(proposer)
        ctx = self.context
        kept = ctx.sync_prefix(prompt[:-1])
        if self._observer is not None:  # it can only catch up from target batches it saw
            kept = self._observer.valid_prefix(prompt[:kept])
            ctx.rollback(kept)
        ctx.decode(prompt[kept:-1], all_logits=False)
        if proposer is not None:
            proposer.begin(prompt)
        detok = IncrementalDetokenizer(self.target.token_bytes)
        context = list(prompt)
        generated = 0
        max_k = request.spec.draft_tokens
        while not cancel.is_set():
            remaining = request.max_tokens - generated
            room = self.n_ctx - len(context)  # tokens the sequence may still grow by
            if room <= 0:
                return
            k = step_budget(max_k, remaining, room)
            started = time.perf_counter()
            draft = proposer.propose(context, k) if (proposer is not None and k > 0) else Draft(())
            drafted = time.perf_counter()
            n_past = ctx.n_past
            logits = ctx.decode([context[-1], *draft.tokens])  # (1 + len(draft), V)
            result = verify(draft.tokens, draft.probs, logits, request.sampling, rng)
            accepted = result.accepted
            ctx.rollback(n_past + 1 + accepted)
            verified = time.perf_counter()
            committed, from_draft, finish_reason = commit(draft.tokens, accepted, result.next_token, remaining, room,
                                                          self.target.is_eog, request.stop_at_eos)
            if proposer is not None:
                proposer.accept(accepted, committed)
            context.extend(committed)
            generated += len(committed)
            text = detok.push(committed)
            if finish_reason is not None:
                text += detok.flush()
            yield step_event(len(draft.tokens), accepted, committed, from_draft, text, drafted - started,
                             verified - drafted, finish_reason)
            if finish_reason is not None:
                return
