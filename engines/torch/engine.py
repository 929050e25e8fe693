"""Hugging Face safetensors targets on PyTorch: the generation loop of DESIGN.md.

The same loop as the llama engine: propose up to k tokens -> one target pass over
[last, d1..dk] -> accept a prefix (verify.py semantics) -> commit accepted + one target
token -> drop the rejected tail by position. Proposers that read the target's hidden states
(MTP, DFlash, EAGLE-3) name the taps they need and get each pass's committed rows through
`observe(output, rows, following_tokens)`.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from ..spec.loop import check_prompt, commit, step_budget, step_event
from ..spec.ngram import NgramPoolProposer, PromptLookupProposer
from ..text import IncrementalDetokenizer
from ..types import Draft, GenerationRequest, SpecConfig, SpecDeskError, StepEvent
from .device import choose_device, choose_dtype, device_name, require_torch

SUPPORTED_METHODS = ("none", "ngram", "ngram-pool", "draft", "mtp", "dflash", "eagle3")
MAX_DEFAULT_CONTEXT = 4096


def supported_methods(folder: str | os.PathLike, dflash_folder: Optional[str | os.PathLike] = None,
                      eagle3_folder: Optional[str | os.PathLike] = None) -> dict[str, Optional[str]]:
    """For an HF target folder: method -> None when it can run, else the reason it cannot.

    Reads config.json and the tensor index only (no weights), so a UI can ask cheaply.
    """
    reasons: dict[str, Optional[str]] = {m: None for m in SUPPORTED_METHODS}
    try:
        require_torch()
    except SpecDeskError as e:
        return {m: str(e) for m in SUPPORTED_METHODS}
    from .dflash import dflash_problem
    from .eagle3 import eagle3_problem
    from .loader import open_checkpoint
    from .mtp import mtp_problem

    try:
        checkpoint = open_checkpoint(folder)
    except SpecDeskError as e:
        return {m: str(e) for m in SUPPORTED_METHODS}
    reasons["draft"] = None  # needs a draft folder, chosen separately
    reasons["mtp"] = mtp_problem(checkpoint)
    reasons["dflash"] = ("pick a DFlash drafter folder (z-lab DFlashDraftModel) for this target"
                         if dflash_folder is None else dflash_problem(dflash_folder, checkpoint))
    reasons["eagle3"] = ("pick an EAGLE-3 drafter folder (LlamaForCausalLMEagle3) for this target"
                         if eagle3_folder is None else eagle3_problem(eagle3_folder, checkpoint))
    return reasons


class TorchEngine:
    name = "torch"

    def __init__(self, target_path: str | os.PathLike, n_ctx: int = 0, device: str = "auto",
                 dtype: Optional[str] = "auto", n_threads: Optional[int] = None):
        torch = require_torch()
        from .context import TorchContext, TorchModel

        self.device = choose_device(device)
        self.dtype = choose_dtype(self.device, dtype)
        if n_threads is not None:
            if n_threads < 1:
                raise SpecDeskError(f"threads = {n_threads} is out of range: use 1 or more")
            torch.set_num_threads(n_threads)
        self.target = TorchModel(target_path, self.device, self.dtype)
        self.n_ctx = n_ctx or min(self.target.n_ctx_train, MAX_DEFAULT_CONTEXT)
        self.context = TorchContext(self.target, self.n_ctx)
        self._drafts: dict[str, object] = {}
        self._native: dict[str, object] = {}
        self.pool = NgramPoolProposer()
        self.last_proposer = None

    @property
    def device_description(self) -> str:
        return device_name(self.device)

    # --- models -------------------------------------------------------------
    def load_draft(self, path: str | os.PathLike):
        """Load (once) and check a draft model folder; refusals say which property differed."""
        from .context import TorchContext, TorchModel
        from .draft import incompatibilities

        key = os.path.abspath(path)
        if key not in self._drafts:
            draft = TorchModel(path, self.device, self.dtype)
            reasons = incompatibilities(self.target, draft)
            if reasons:
                raise SpecDeskError(f"draft {Path(path).name} is not compatible with target {self.target.path.name}: "
                                    + "; ".join(reasons) + " (target vs draft)")
            self._drafts[key] = TorchContext(draft, self.n_ctx)
        return self._drafts[key]

    def load_mtp(self):
        from .mtp import MtpHead

        if "mtp" not in self._native:
            self._native["mtp"] = MtpHead.from_target(self.target, self.n_ctx)
        return self._native["mtp"]

    def load_dflash(self, path: str | os.PathLike):
        from .dflash import DFlashDrafter

        key = "dflash:" + os.path.abspath(path)
        if key not in self._native:
            self._native[key] = DFlashDrafter.from_folder(path, self.target, self.n_ctx)
        return self._native[key]

    def load_eagle3(self, path: str | os.PathLike):
        from .eagle3 import Eagle3Head

        key = "eagle3:" + os.path.abspath(path)
        if key not in self._native:
            self._native[key] = Eagle3Head.from_folder(path, self.target, self.n_ctx)
        return self._native[key]

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return self.target.tokenize(text, add_bos=add_bos and self.target.vocab.add_bos)

    def detokenize(self, tokens) -> str:
        return self.target.detokenize(tokens)

    def set_threads(self, n_threads: int) -> None:
        require_torch().set_num_threads(n_threads)

    def reset_chat(self) -> None:
        self.pool.reset()

    def close(self) -> None:
        self._drafts.clear()
        self._native.clear()
        self.context.close()
        self.target.close()

    def _proposer(self, spec: SpecConfig, request: GenerationRequest, rng: np.random.Generator):
        if spec.method == "none":
            return None
        if spec.method == "ngram":
            return PromptLookupProposer(spec.ngram_min, spec.ngram_max)
        if spec.method == "ngram-pool":
            return self.pool
        if spec.method == "draft":
            from .draft import DraftModelProposer

            return DraftModelProposer(self.load_draft(spec.draft_path), request.sampling, rng, spec.draft_p_min)
        if spec.method == "mtp":
            from .mtp import MtpProposer

            return MtpProposer(self.load_mtp(), request.sampling, rng)
        if spec.method == "dflash":
            from .dflash import DFlashProposer

            if not spec.draft_path:
                raise SpecDeskError("method 'dflash' needs a DFlash drafter folder: pass --draft DIR")
            return DFlashProposer(self.load_dflash(spec.draft_path), request.sampling, rng)
        if spec.method == "eagle3":
            from .eagle3 import Eagle3Proposer

            if not spec.draft_path:
                raise SpecDeskError("method 'eagle3' needs an EAGLE-3 drafter folder: pass --draft DIR")
            return Eagle3Proposer(self.load_eagle3(spec.draft_path), request.sampling, rng)
        raise SpecDeskError(f"method {spec.method!r} is not available in the PyTorch engine: "
                            f"use one of {', '.join(SUPPORTED_METHODS)}")

    # --- generation ---------------------------------------------------------
    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[StepEvent]:
        from .verify import verify_on_device

        prompt = list(request.prompt_tokens)
        check_prompt(prompt, self.n_ctx, self.target.n_vocab)
        rng = np.random.default_rng(request.sampling.seed)
        proposer = self._proposer(request.spec, request, rng)
        self.last_proposer = proposer
        observes = hasattr(proposer, "observe")
        taps = tuple(getattr(proposer, "taps", ()))
        ctx = self.context
        # A hidden-state drafter needs the target's rows for the whole prompt: no prefix reuse.
        kept = ctx.sync_prefix(prompt[:-1]) if not observes else ctx.sync_prefix([])
        if proposer is not None:
            proposer.begin(prompt)
        if len(prompt) - 1 > kept:
            start = ctx.n_past
            out = ctx.decode(prompt[kept:-1], taps=taps, all_logits=False)
            if observes:
                proposer.observe(out, len(prompt) - 1 - kept, prompt[kept + 1:], start)
        detok = IncrementalDetokenizer(self.target.token_bytes)
        context = list(prompt)
        generated = 0
        max_k = request.spec.draft_tokens
        while not cancel.is_set():
            remaining = request.max_tokens - generated
            room = self.n_ctx - len(context)
            if room <= 0:
                return
            k = step_budget(max_k, remaining, room)
            started = time.perf_counter()
            draft = proposer.propose(context, k) if (proposer is not None and k > 0) else Draft(())
            drafted = time.perf_counter()
            n_past = ctx.n_past
            out = ctx.decode([context[-1], *draft.tokens], taps=taps)  # logits (1 + len(draft), V)
            result = verify_on_device(draft.tokens, draft.probs, out.logits, request.sampling, rng)
            accepted = result.accepted
            ctx.rollback(n_past + 1 + accepted)
            committed, from_draft, finish_reason = commit(draft.tokens, accepted, result.next_token, remaining, room,
                                                          self.target.is_eog, request.stop_at_eos)
            if observes:  # the rows of every token the target accepted, before any cut at eos or length
                proposer.observe(out, accepted + 1, [*draft.tokens[:accepted], result.next_token], n_past)
            verified = time.perf_counter()
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
