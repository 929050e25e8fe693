"""Hugging Face safetensors targets on PyTorch: the generation loop of docs/ARCHITECTURE.md.

The step loop is engines/speculation/loop.py's, shared with the llama engine; this engine gives it
a target pass over [last, d1..dk], verification on the device (verify.py, the semantics of
engines/speculation/verify.py) and rollback of its static KV cache by position. Proposers that read the target's hidden states
(MTP, DFlash, EAGLE-3) name the taps they need and get each pass's committed rows through
`observe(output, tokens, start)` (engines/speculation/protocols.TargetObserver, the shape of both engines).
"""

from __future__ import annotations

import os
import threading
from typing import Callable, Iterator, Mapping, Optional

import numpy as np

from ..methods import method_info, method_names, resolve
from ..speculation.compat import check_compatible
from ..speculation.loop import run_steps, top_entries
from ..speculation.ngram import NgramPoolProposer
from ..speculation.proposers import load_native
from ..speculation.protocols import TargetObserver
from ..types import Draft, GenerationRequest, SamplingParams, SpecDeskError, StepEvent
from .device import choose_device, choose_dtype, device_name, require_torch

MAX_DEFAULT_CONTEXT = 4096


def supported_methods(folder: str | os.PathLike, drafters: Optional[Mapping[str, str | os.PathLike]] = None
                      ) -> dict[str, Optional[str]]:
    """For an HF target folder: method -> None when it can run, else the reason it cannot.
    `drafters`: method -> the drafter folder chosen for it (DFlash, EAGLE-3), where there is one;
    each method's row names its check on this engine (engines/methods.py).

    Reads config.json and the tensor index only (no weights), so a UI can ask cheaply.
    """
    names = method_names(TorchEngine.name)
    try:
        require_torch()
    except SpecDeskError as e:
        return {m: str(e) for m in names}
    from .loader import open_checkpoint

    try:
        checkpoint = open_checkpoint(folder)
    except SpecDeskError as e:
        return {m: str(e) for m in names}
    drafters = drafters or {}
    return {m: resolve(method_info(m).problem[TorchEngine.name])(checkpoint, drafters.get(m))
            if TorchEngine.name in method_info(m).problem else None for m in names}


class TorchEngine:
    name = "torch"
    cost_cache_dir = None  # where method auto keeps measured costs (engines/speculation/costs.py); None: memory only

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
        """The device and the weights' dtype: "CUDA NVIDIA GeForce RTX 4090 · bfloat16"."""
        return f"{device_name(self.device)} · {str(self.dtype).removeprefix('torch.')}"

    # --- models -------------------------------------------------------------
    def load_draft(self, path: str | os.PathLike, progress: Optional[Callable[[float], None]] = None,
                   same_vocabulary: bool = True):
        """Load (once) and check a draft model folder; refusals say which property differed.
        safetensors load in one go: `progress` hears only the end. `same_vocabulary=False`: a
        draft with a vocabulary of its own (cross-vocabulary drafting)."""
        from .context import TorchContext, TorchModel

        key = os.path.abspath(path)
        if key not in self._drafts:
            draft = TorchModel(path, self.device, self.dtype)
            if same_vocabulary:
                check_compatible(self.target, draft)
            self._drafts[key] = TorchContext(draft, self.n_ctx)
        elif same_vocabulary:
            check_compatible(self.target, self._drafts[key].model)
        if progress is not None:
            progress(1.0)
        return self._drafts[key]

    def load_native(self, method: str, path: str | os.PathLike | None = None):
        """The native drafter of a method over this target (its MTP layers, a DFlash or EAGLE-3
        drafter folder), loaded once by the loader its row names (engines/methods.py)."""
        key = method if path is None else f"{method}:{os.path.abspath(path)}"
        if key not in self._native:
            self._native[key] = load_native(self, method, path)
        return self._native[key]

    def method_availability(self) -> dict[str, Optional[str]]:
        """Each method of this engine: None where this target can run it now, else why not."""
        native = {key.split(":", 1)[0]: key.split(":", 1)[1] for key in self._native if ":" in key}
        return supported_methods(self.target.path, native)

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return self.target.tokenize(text, add_bos=add_bos and self.target.vocab.add_bos)

    def detokenize(self, tokens) -> str:
        return self.target.detokenize(tokens)

    @property
    def n_threads(self) -> int:
        return require_torch().get_num_threads()

    def set_threads(self, n_threads: int) -> None:
        require_torch().set_num_threads(n_threads)

    def reset_chat(self) -> None:
        self.pool.reset()

    def top_logits(self, tokens: list[int], n: int = 2) -> list[tuple[int, float]]:
        """The target's n highest logits for the token after `tokens`, from the single-token
        pass a baseline run makes there (used to explain where two runs diverged)."""
        self.prefill(list(tokens), None)
        logits = self.target_pass([tokens[-1]], None).logits[0]  # (V,)
        return top_entries(logits.detach().float().cpu().numpy(), n)

    def logit_noise(self, tokens: list[int]) -> float:
        """How far this target's logits move between a batched pass and single-token passes on
        `tokens` (engines/speculation/noise.py): what a greedy divergence is judged against."""
        from ..speculation.noise import measure_logit_noise

        return measure_logit_noise(self, tokens)

    def close(self) -> None:
        self._drafts.clear()
        self._native.clear()
        self.context.close()
        self.target.close()

    # --- the proposer factory's hooks (engines/speculation/proposers.py) -------------
    drafter_file = ("folder", "DIR")

    # --- generation: the shared loop (engines/speculation/loop.py) and its hooks -------
    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[StepEvent]:
        return run_steps(self, request, cancel)

    def prefill(self, prompt: list[int], observer) -> None:
        ctx = self.context
        observes = isinstance(observer, TargetObserver)
        # A hidden-state drafter needs the target's rows for the whole prompt: no prefix reuse.
        kept = ctx.sync_prefix(prompt[:-1]) if not observes else ctx.sync_prefix([])
        if len(prompt) - 1 > kept:
            start = ctx.n_past
            out = ctx.decode(prompt[kept:-1], taps=self._taps(observer), all_logits=False)
            self.observe(observer, out, prompt[kept:], start)

    def target_pass(self, tokens: list[int], observer):
        return self.context.decode(tokens, taps=self._taps(observer))  # logits (len(tokens), V), taps

    def verify_pass(self, draft: Draft, output, sampling: SamplingParams, rng: np.random.Generator):
        from .verify import verify_on_device

        return verify_on_device(draft.tokens, draft.probs, output.logits, sampling, rng)

    def observe(self, observer, output, tokens: list[int], start: int) -> None:
        if observer is not None and isinstance(observer, TargetObserver):
            observer.observe(output, tokens, start)

    @staticmethod
    def _taps(observer) -> tuple[int, ...]:
        return tuple(observer.taps) if observer is not None and isinstance(observer, TargetObserver) else ()
