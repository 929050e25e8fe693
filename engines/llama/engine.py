"""GGUF targets on llama.cpp: the generation loop of docs/ARCHITECTURE.md.

The step loop is engines/speculation/loop.py's, shared with the PyTorch engine; this engine gives
it a target pass with logits for every row of [last, d1..dk], verification on those rows
(engines/speculation/verify.py) and rollback of llama.cpp's KV cache by position.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import numpy as np

from ..methods import method_info, method_names
from ..methods import resolve as resolve_ref
from ..speculation.compat import check_compatible
from ..speculation.loop import run_steps, top_entries
from ..speculation.ngram import NgramPoolProposer
from ..speculation.proposers import load_native
from ..speculation.protocols import TargetObserver
from ..speculation.verify import VerifyResult, verify
from ..types import Draft, GenerationRequest, SamplingParams, SpecDeskError, StepEvent
from .binding import GgufContext, GgufModel, validated_header
from .draft_copy import DRAFT_WEIGHTS, q8_copy, wants_copy
from .ext import HiddenRows, keep_target_rows
from .fit import default_context
from .placement import CPU, Placement, ResolvedPlacement, buffer_device, device_handle, resolve
from .validate import check_context


def default_threads() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


class LlamaEngine:
    name = "llama.cpp"
    cost_cache_dir = None  # where method auto keeps measured costs (engines/speculation/costs.py); None: memory only

    def __init__(self, target_path: str | os.PathLike, n_ctx: int = 0, n_threads: Optional[int] = None,
                 n_batch: int = 512, progress: Optional[Callable[[float], None]] = None,
                 placement: Placement = Placement(), draft_placement: Placement = Placement(),
                 rpc: Sequence[str] = (), draft_weights: str = "q8"):
        """`placement` puts the target's layers on a device (engines/llama/placement.py),
        `draft_placement` a draft model's or drafter GGUF's; `rpc` adds the devices of RPC
        servers (HOST:PORT) first, as llama.cpp's --rpc does. `draft_weights`: "q8" runs a
        draft model stored in floats from a Q8_0 copy where it sits on the CPU
        (engines/llama/draft_copy.py), "file" from its own file."""
        self.n_threads = n_threads or default_threads()
        if self.n_threads < 1:
            raise SpecDeskError(f"threads = {self.n_threads} is out of range: use 1 or more")
        if draft_weights not in DRAFT_WEIGHTS:
            raise SpecDeskError(f"draft weights {draft_weights!r} is not one of {', '.join(DRAFT_WEIGHTS)}")
        self.draft_weights = draft_weights
        from .mtp import nextn_layers

        header = validated_header(target_path)
        self.n_ctx = default_context(header.arch_value("context_length"), n_ctx)
        if rpc:
            from .rpc import add_servers

            add_servers(list(rpc))
        self.draft_placement = draft_placement
        self.placements: dict[str, ResolvedPlacement] = {}  # "target" and each draft's path
        target_place = self._place(header, placement, "target")
        check_context(header, self.n_ctx, target_place.layers_on_device)  # before any weights load
        self.target = GgufModel(target_path, load_mtp=nextn_layers(target_path) > 0, progress=progress,
                                **self._model_options(target_place))
        self.placements["target"] = target_place
        self.notes: list[str] = []  # one line each for the user: what loaded otherwise than the file asks
        self._drop_undecodable_template(target_path)
        self.context = GgufContext(self.target, self.n_ctx, self.n_threads, n_batch)
        self._drafts: dict[str, GgufContext] = {}
        self._native: dict = {}  # MTP / DFlash drafters over this target, created on first use
        self._observer = None  # the proposer the target hands its hidden states to
        self.pool = NgramPoolProposer()  # learns across the turns of a chat
        self.last_proposer = None

    # --- models -----------------------------------------------------------
    def _drop_undecodable_template(self, path) -> None:
        """A chat template that is not valid UTF-8 cannot be rendered: the model loads without
        it (chats use the default chat format) and one line says so."""
        try:
            self.target.chat_template()
        except UnicodeDecodeError as e:
            self.target.chat_template = lambda: None  # the binding decodes the template strictly
            self.notes.append(f"{path}: its chat template is not valid UTF-8 (byte {e.start}): "
                              "chatting in the default format instead")

    def load_draft(self, path: str | os.PathLike, progress: Optional[Callable[[float], None]] = None,
                   same_vocabulary: bool = True) -> GgufContext:
        """Load (once) and check a draft model; refusals say which property differed.
        `same_vocabulary=False`: a draft with a vocabulary of its own (cross-vocabulary drafting)."""
        key = os.path.abspath(path)
        if key not in self._drafts:
            draft_header = validated_header(path)
            place = self._place(draft_header, self.draft_placement, "draft")
            check_context(draft_header, self.n_ctx, place.layers_on_device)  # before any weights load
            source = path
            if self.draft_weights == "q8" and place.on_cpu and wants_copy(draft_header):
                source, progress = self._q8_copy(path, progress)
            try:
                draft = GgufModel(source, progress=progress, **self._model_options(place))
            except SpecDeskError as e:
                if source == path:
                    raise
                self.notes.append(f"{path}: running the draft model from its own file: its Q8_0 copy did not load ({e})")
                draft = GgufModel(path, progress=progress, **self._model_options(place))
            try:
                if same_vocabulary:
                    check_compatible(self.target, draft)
            except SpecDeskError:
                draft.close()
                raise
            self._drafts[key] = GgufContext(draft, self.n_ctx, self.n_threads, self.context.n_batch)
            self.placements[key] = place
        elif same_vocabulary:
            check_compatible(self.target, self._drafts[key].model)
        return self._drafts[key]

    def _q8_copy(self, path, progress):
        """(the file to load for a float draft model on the CPU, the progress of its load): its
        Q8_0 copy, made now when missing (the first half of `progress`), or the file itself with
        a note when the copy cannot be made."""
        halves = (None, None) if progress is None else (lambda f: progress(0.5 * f), lambda f: progress(0.5 + 0.5 * f))
        try:
            copy, made = q8_copy(path, progress=halves[0], n_threads=self.n_threads)
        except (SpecDeskError, OSError) as e:
            self.notes.append(f"{path}: running the draft model from its own file: its Q8_0 copy could not be made "
                              f"({getattr(e, 'strerror', None) or e})")
            return path, progress
        return copy, (halves[1] if made else progress)

    # --- placement -----------------------------------------------------------
    def _place(self, header, placement: Placement, role: str) -> ResolvedPlacement:
        """The device and layers for a model (the devices' free memory read now, so a draft
        counts what the target already took)."""
        from .devices import llama_devices

        options = ("--device", "--gpu-layers") if role == "target" else ("--draft-device", "--draft-gpu-layers")
        return resolve(placement, header, self.n_ctx, llama_devices(), what=f"{Path(header.path).name}",
                       option=options[0], layers_option=options[1])

    @staticmethod
    def _model_options(place: ResolvedPlacement) -> dict:
        if place.on_cpu:
            return {}
        return {"n_gpu_layers": place.n_gpu_layers, "device": device_handle(place.device)}

    @property
    def placement_key(self) -> str:
        """Where the target and its drafts sit, for the costs measured on them."""
        return ";".join([f"{Path(role).name}={place.key()}" for role, place in sorted(self.placements.items())]
                        + [f"draft-weights={self.draft_weights}"])

    @property
    def device_description(self) -> str:
        """Where the models sit, in words: "target 9/9 layers on RPC0 (…) · draft CPU"."""
        parts = [f"target {self.placements['target'].describe()}"]
        parts += [f"draft {place.describe()}" for role, place in self.placements.items() if role != "target"]
        return " · ".join(parts)

    def placement_report(self) -> dict:
        """Each model's placement and what llama.cpp allocated on each device (bytes)."""
        models = {"target": (self.target, [self.context])}
        for key, ctx in self._drafts.items():
            models[key] = (ctx.model, [ctx])
        for key, drafter in self._native.items():
            model = getattr(drafter, "model", None)
            contexts = [c for c in [getattr(drafter, "context", None)] if c is not None]
            if model is not None and model is not self.target:
                models.setdefault(getattr(model, "path", key).__str__(), (model, contexts))
            else:
                models["target"][1].extend(contexts)
        report = {}
        for role, (model, contexts) in models.items():
            allocated: dict[str, int] = {}
            for name, size in [*model.buffers, *(b for c in contexts for b in getattr(c, "buffers", []))]:
                device = buffer_device(name)
                allocated[device] = allocated.get(device, 0) + size
            place = self.placements.get(role) or self.placements.get(os.path.abspath(role))
            report[role] = {**(place.as_dict() if place else {"device": CPU}), "allocated_bytes": allocated}
        return report

    def load_native(self, method: str, path: str | os.PathLike | None = None):
        """The native drafter of a method over this target (its MTP layers, a DFlash or EAGLE-3
        drafter GGUF), loaded once by the loader its row names (engines/methods.py)."""
        key = method if path is None else f"{method}:{os.path.abspath(path)}"
        if key not in self._native:
            self._native[key] = load_native(self, method, path)
        return self._native[key]

    def drafter_options(self, path) -> dict:
        """A drafter GGUF (DFlash, EAGLE-3) sits where the draft placement says."""
        place = self._place(validated_header(path), self.draft_placement, "draft")
        self.placements[os.path.abspath(path)] = place
        return self._model_options(place)

    def method_availability(self) -> dict[str, Optional[str]]:
        """Each method of this engine: None where this target can run it now, else why not (its
        row's check for this engine; a drafter file not chosen yet; llama-ext.h symbols missing)."""
        reasons: dict[str, Optional[str]] = {m: None for m in method_names(self.name)}
        for method in reasons:
            info = method_info(method)
            if self.name in info.problem:
                reasons[method] = resolve_ref(info.problem[self.name])(self)
            elif info.takes == "drafter_file" and not any(key.startswith(f"{method}:") for key in self._native):
                reasons[method] = (f"needs {info.drafter} GGUF made for this target: choose one as the draft "
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

    def top_logits(self, tokens: list[int], n: int = 2) -> list[tuple[int, float]]:
        """The target's n highest logits for the token after `tokens`, from the single-token
        pass a baseline run makes there (used to explain where two runs diverged)."""
        self.prefill(list(tokens), None)
        return top_entries(self.target_pass([tokens[-1]], None)[0], n)

    def logit_noise(self, tokens: list[int]) -> float:
        """How far this target's logits move between a batched pass and single-token passes on
        `tokens` (engines/speculation/noise.py): what a greedy divergence is judged against."""
        from ..speculation.noise import measure_logit_noise

        return measure_logit_noise(self, tokens)

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

    # --- the proposer factory's hooks (engines/speculation/proposers.py) -------------
    drafter_file = ("GGUF", "PATH")

    def _route_hidden_states(self, observer) -> None:
        """Only an active hidden-state proposer (MTP, DFlash, EAGLE-3: a TargetObserver) makes
        the target keep the rows of its taps (switching costs llama.cpp a graph rebuild, so the
        same taps stay on)."""
        if observer is self._observer:
            return  # every pass names it: the usual case costs one comparison
        wanted = observer if isinstance(observer, TargetObserver) else None
        previous = self._observer
        self._observer = wanted
        if previous is not None and wanted is not None and previous.taps == wanted.taps:
            return
        if previous is not None:
            keep_target_rows(self.context, previous.taps, False)
        if wanted is not None:
            keep_target_rows(self.context, wanted.taps, True)

    # --- generation: the shared loop (engines/speculation/loop.py) and its hooks -----
    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[StepEvent]:
        return run_steps(self, request, cancel)

    def prefill(self, prompt: list[int], observer) -> None:
        self._route_hidden_states(observer)
        ctx = self.context
        kept = ctx.sync_prefix(prompt[:-1])
        observer = self._observer
        if observer is None:
            ctx.decode(prompt[kept:-1], all_logits=False)
            return
        kept = observer.valid_prefix(prompt[:kept])  # it can only catch up from target rows it saw
        ctx.rollback(kept)
        # Chunk by chunk: llama.cpp holds one decode's hidden states, until the next decode.
        for start in range(kept, len(prompt) - 1, ctx.n_batch):
            chunk = prompt[start:min(start + ctx.n_batch, len(prompt) - 1)]
            ctx.decode(chunk, all_logits=False)
            self.observe(observer, None, prompt[start:start + len(chunk) + 1], start)

    def target_pass(self, tokens: list[int], observer) -> np.ndarray:
        self._route_hidden_states(observer)  # the observer may go between passes (auto lets a losing one go)
        return self.context.decode(tokens)  # logits (len(tokens), V)

    def verify_pass(self, draft: Draft, output: np.ndarray, sampling: SamplingParams,
                    rng: np.random.Generator) -> VerifyResult:
        return verify(draft.tokens, draft.probs, output, sampling, rng)  # output: the pass's logits

    def observe(self, observer, output, tokens: list[int], start: int) -> None:
        if self._observer is not None:  # the routed one (target_pass names it each pass)
            self._observer.observe(HiddenRows(self.context), tokens, start)
