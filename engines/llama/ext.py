"""The hidden-state functions of libllama that llama-cpp-python does not bind.

llama.cpp declares them in src/llama-ext.h as plain C++ functions, so libllama exports them
under Itanium-mangled names (no C linkage). They are bound here by those names, for the
libllama that llama-cpp-python 0.3.36 ships; `nm -D --defined-only libllama.so | c++filt`
lists them. A different build may lack some: every symbol is looked up once, and a method
whose symbols are missing is refused with a message naming them, never a crash.
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..methods import METHODS, method_info
from ..speculation.stats import ProposerCounters
from ..types import Draft, SamplingParams, SpecDeskError
from .binding import ContextHandle, GgufContext, GgufModel, check_gguf_file, common_prefix, gguf_header, llama_lib
from .fit import TargetShape, drafter_config, drafter_misfit, drafter_shape

_c_ctx = ctypes.c_void_p
_c_model = ctypes.c_void_p
_f32_p = ctypes.POINTER(ctypes.c_float)

# name -> (mangled name, restype, argtypes); signatures from vendor src/llama-ext.h.
SYMBOLS: dict[str, tuple[str, object, list]] = {
    "llama_set_embeddings_nextn": ("_Z26llama_set_embeddings_nextnP13llama_contextbb", None,
                                   [_c_ctx, ctypes.c_bool, ctypes.c_bool]),
    "llama_set_nextn_layer_offset": ("_Z28llama_set_nextn_layer_offsetP13llama_contexti", None,
                                     [_c_ctx, ctypes.c_int32]),
    "llama_get_embeddings_nextn": ("_Z26llama_get_embeddings_nextnP13llama_context", _f32_p, [_c_ctx]),
    "llama_get_embeddings_nextn_ith": ("_Z30llama_get_embeddings_nextn_ithP13llama_contexti", _f32_p,
                                       [_c_ctx, ctypes.c_int32]),
    "llama_set_embeddings_layer_inp": ("_Z30llama_set_embeddings_layer_inpP13llama_contextjb", None,
                                       [_c_ctx, ctypes.c_uint32, ctypes.c_bool]),
    "llama_get_embeddings_layer_inp": ("_Z30llama_get_embeddings_layer_inpP13llama_contextj", _f32_p,
                                       [_c_ctx, ctypes.c_uint32]),
    "llama_get_ctx_other": ("_Z19llama_get_ctx_otherP13llama_context", _c_ctx, [_c_ctx]),
    "llama_model_target_layer_ids": ("_Z28llama_model_target_layer_idsPK11llama_model",
                                     ctypes.POINTER(ctypes.c_int32), [_c_model]),
    "llama_model_target_layer_ids_n": ("_Z30llama_model_target_layer_ids_nPK11llama_model", ctypes.c_uint32,
                                       [_c_model]),
    "llama_model_dflash_selector_top_k": ("_Z33llama_model_dflash_selector_top_kPK11llama_model", ctypes.c_int32,
                                          [_c_model]),
}

# What each model-based method calls is its row's `symbols` (engines/methods.py); a method is
# available when all of them resolve.
def method_symbols() -> dict[str, tuple[str, ...]]:
    return {name: info.symbols for name, info in METHODS.items() if info.symbols}


class Ext:
    """The resolved functions (attributes by their C++ name) and the names that did not resolve."""

    def __init__(self, lib: ctypes.CDLL, symbols: dict[str, tuple[str, object, list]] = SYMBOLS):
        self.missing: list[str] = []
        for name, (mangled, restype, argtypes) in symbols.items():
            try:
                fn = getattr(lib, mangled)
            except AttributeError:
                self.missing.append(name)
                continue
            fn.restype, fn.argtypes = restype, argtypes
            setattr(self, name, fn)

    def unavailable(self, method: str) -> list[str]:
        return [name for name in method_symbols().get(method, ()) if name in self.missing]

    def require(self, method: str) -> "Ext":
        return self.require_symbols(method_symbols().get(method, ()), f"method {method!r}")

    def require_symbols(self, names, what: str) -> "Ext":
        """These functions, or the project's error saying `what` is disabled without them."""
        missing = [name for name in names if name in self.missing]
        if missing:
            raise SpecDeskError(
                f"{what} is disabled: this libllama does not export {', '.join(missing)} "
                "(SpecDesk binds the llama-ext.h symbols of llama-cpp-python 0.3.36; install that version)"
            )
        return self


_ext: Optional[Ext] = None
_ext_lock = threading.Lock()


def ext() -> Ext:
    """Resolve every symbol once, at first use (start-up of the first native method)."""
    global _ext
    with _ext_lock:
        if _ext is None:
            lib = llama_lib()
            _ext = Ext(lib.llama_cpp._lib)
    return _ext


def available_methods() -> dict[str, list[str]]:
    """method -> missing symbols (empty when the method can run)."""
    resolved = ext()
    return {method: resolved.unavailable(method) for method in method_symbols()}


def gguf_metadata(path) -> dict:
    """Metadata (without the vocabulary) and tensor shapes of a GGUF file, read without
    loading tensors, so a drafter can be refused before llama.cpp loads it."""
    header = gguf_header(path)
    return {**header.fields, "__tensors__": header.tensors}


def check_drafter(path, target: GgufModel, method: str) -> dict:
    """Refuse a file that is not a drafter of this method made for this target, before
    llama.cpp loads it (fit.drafter_misfit: the rule the app's pairing applies too).
    Returns the file's metadata."""
    p = check_gguf_file(path)
    meta = gguf_metadata(p)
    info, found = method_info(method), meta.get("general.architecture")
    if found != method:
        raise SpecDeskError(f"{p}: not {info.drafter} (its architecture is {found!r}, {info.drafter}'s is {method!r})")
    target_arch = target.meta("general.architecture")
    n_layer = int(target.meta(f"{target_arch}.block_count") or 0) - int(
        target.meta(f"{target_arch}.nextn_predict_layers") or 0)
    misfit = drafter_misfit(drafter_shape(method, drafter_config(method, meta, meta["__tensors__"])),
                            TargetShape(target.path.name, target_arch, n_layer, target.n_embd))
    if misfit:
        raise SpecDeskError(f"{p}: {misfit}")
    return meta


@dataclass(frozen=True)
class Entry:
    """One row of an extended batch: a token, a token plus a hidden-state row, or a feature row."""

    pos: int
    token: int = -1  # -1: an embedding-only row
    embd: Optional[np.ndarray] = None  # (n,) float32
    output: bool = False


class NativeContext(ContextHandle):
    """A llama_context with its own llama_batch_ext, for drafters that take hidden states.

    It holds sequence 0 only; positions are explicit, so rolling back is llama_memory_seq_rm.
    """

    def __init__(self, model: GgufModel, n_ctx: int, n_threads: int, n_batch: int, *,
                 ctx_type: int = 0, ctx_other=None, n_outputs_max: int = 0, n_outputs_max_per_seq: int = 0):
        lib = model._lib
        self._lib, self.model = lib, model
        extra = dict(ctx_type=ctx_type, n_rs_seq=0, n_outputs_max=n_outputs_max,
                     n_outputs_max_per_seq=n_outputs_max_per_seq)
        if ctx_other is not None:
            extra["ctx_other"] = ctx_other
        self._open(n_ctx, n_threads, n_batch, "a drafter context", **extra)
        self._batch = lib.llama_batch_ext_init(self._ctx)
        self._keep: list = []  # embedding buffers llama.cpp reads during llama_process

    @property
    def handle(self):
        return self._ctx

    def _free(self) -> None:
        self._lib.llama_batch_ext_free(self._batch)
        self._lib.llama_free(self._ctx)

    def remove_from(self, pos: int) -> None:
        self._lib.llama_memory_seq_rm(self._memory, 0, pos, -1)

    def pos_max(self) -> int:
        return self._lib.llama_memory_seq_pos_max(self._memory, 0)

    def process(self, entries: Sequence[Entry], encode: bool = False) -> None:
        """One llama_process call (the caller keeps len(entries) <= n_batch); `encode` runs
        the model's encoder graph (EAGLE-3's feature fusion) instead of its decoder."""
        lib, batch = self._lib, self._batch
        lib.llama_batch_ext_clear(batch)
        self._keep = []
        pos = ctypes.c_int32()
        for i, entry in enumerate(entries):
            embd = None
            if entry.embd is not None:
                row = np.ascontiguousarray(entry.embd, dtype=np.float32)
                self._keep.append(row)
                embd = lib.llama_embd(row.ctypes.data_as(_f32_p), 1, row.shape[-1])
            if entry.token >= 0:
                idx = lib.llama_batch_ext_add_token(batch, 0, entry.token)
                if idx >= 0 and embd is not None and not lib.llama_batch_ext_set_embd_token(batch, idx, embd):
                    raise SpecDeskError(f"{self.model.path}: the drafter refused a hidden-state row at batch index {i}")
            else:
                idx = lib.llama_batch_ext_add_embd(batch, 0, embd)
            if idx != i:
                raise SpecDeskError(f"{self.model.path}: could not add row {i} to the drafter batch (error {idx})")
            pos.value = entry.pos
            lib.llama_batch_ext_set_pos(batch, idx, ctypes.byref(pos))
            if entry.output:
                lib.llama_batch_ext_set_output_logits(batch, idx, True)
        status = lib.llama_process(self._ctx, 0 if encode else 1, batch)  # LLAMA_PROCESS_TYPE_ENCODE / _DECODE
        if status != 0:
            raise SpecDeskError(f"{self.model.path}: the drafter's llama_process failed with status {status}")

    def logits(self, i: int, n_vocab: int) -> np.ndarray:
        pointer = self._lib.llama_get_logits_ith(self._ctx, i)
        return np.ctypeslib.as_array(pointer, shape=(n_vocab,))


def rows(pointer, n_rows: int, n_embd: int) -> np.ndarray:
    """A (n_rows, n_embd) view of a float buffer owned by llama.cpp; copy before the next decode."""
    if not pointer:
        raise SpecDeskError("llama.cpp returned no hidden states for this batch")
    return np.ctypeslib.as_array(pointer, shape=(n_rows, n_embd))


class CachedPositions:
    """A drafter context that holds one row per committed position (`cached` tokens): it keeps
    the prefix it shares with a new context and forgets the rest by position."""

    label = "drafter"  # how its errors name it

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How much of `tokens` the drafter holds; the target re-decodes the rest."""
        n = common_prefix(self.cached, tokens)
        self.rollback(n)
        return n

    def rollback(self, n_keep: int) -> None:
        if n_keep < len(self.cached):
            self.context.remove_from(n_keep)
            del self.cached[n_keep:]

    def rollback_to(self, position: int, what: str) -> None:
        """Forget the rows from `position` on, which must leave every row before it."""
        self.rollback(position)
        if len(self.cached) != position:
            raise SpecDeskError(f"{self.label} context out of step: it holds {len(self.cached)} positions, "
                                f"{what} {position}")

    def feed(self, entries: Sequence[Entry]) -> None:
        """Rows into the drafter's context, a batch at a time."""
        for first in range(0, len(entries), self.context.n_batch):
            self.context.process(entries[first:first + self.context.n_batch])


class HiddenRows:
    """The hidden states of the target context's newest decode, where llama.cpp keeps them,
    in the shape the PyTorch engine's pass output has: `hidden`, the final-normed rows (what
    MTP reads), and `taps[t]`, the input rows of layer t (what DFlash and EAGLE-3 read). Views:
    valid until the target's next decode, so a drafter copies what it keeps."""

    def __init__(self, target_ctx: GgufContext):
        self._ctx, self._n = target_ctx._ctx, target_ctx.n_last
        model = target_ctx.model
        self._width = model.n_embd
        self._width_out = model.n_embd_out
        self.taps = _LayerInputs(self)

    @property
    def hidden(self) -> np.ndarray:
        return rows(ext().llama_get_embeddings_nextn(self._ctx), self._n, self._width_out)


class _LayerInputs:
    def __init__(self, target: HiddenRows):
        self._target = target

    def __getitem__(self, layer: int) -> np.ndarray:
        t = self._target
        return rows(ext().llama_get_embeddings_layer_inp(t._ctx, layer), t._n, t._width)


def keep_target_rows(target_ctx: GgufContext, taps: Sequence[int], on: bool) -> None:
    """Make the target context keep (or stop keeping) the rows a hidden-state drafter reads:
    the inputs of the layers in `taps`, or with no taps its final-normed rows. Switching costs
    llama.cpp a graph rebuild."""
    if taps:
        for layer in taps:
            ext().llama_set_embeddings_layer_inp(target_ctx._ctx, layer, on)
    else:
        ext().llama_set_embeddings_nextn(target_ctx._ctx, on, False)


class LayerInputDrafter:
    """What drafters that read the target's layer inputs (DFlash, EAGLE-3) share: their taps
    are those layers, and each owns its GGUF `model` and its `context` over it."""

    layer_ids: list[int]

    @property
    def taps(self) -> tuple[int, ...]:
        return tuple(self.layer_ids)

    def set_threads(self, n_threads: int) -> None:
        self.context.set_threads(n_threads)

    def close(self) -> None:
        self.context.close()
        self.model.close()


class HiddenStateProposer:
    """The proposer interface (begin / propose / accept, and observe with taps: the
    TargetObserver shape of engines/speculation/protocols.py) over a drafter that reads the
    target's hidden states (MTP, DFlash, EAGLE-3). The engine hands it the rows of the tokens
    the target kept, after each pass, as the PyTorch engine does."""

    def __init__(self, drafter, sampling: SamplingParams, rng: np.random.Generator, p_min: float = 0.0):
        # Drafts are top-1 tokens (q one-hot) at any temperature, so sampling and rng go unused.
        self.drafter = drafter
        self.taps = tuple(drafter.taps)
        self.p_min = p_min
        self.counters = ProposerCounters()

    def observe(self, output, tokens: Sequence[int], start: int) -> None:
        self.drafter.observe(output, tokens, start)

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        return self.drafter.valid_prefix(tokens)

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def propose(self, context: Sequence[int], k: int) -> Draft:
        started = time.perf_counter()
        tokens = self.drafter.draft(context, k, self.p_min)
        self.counters.record_proposal(len(tokens), time.perf_counter() - started)
        return Draft(tuple(tokens))

    def accept(self, n_accepted: int, committed: Sequence[int]) -> None:
        self.counters.record_accepted(n_accepted)  # the drafter already holds only the kept rows

    def stats(self) -> dict:
        return self.counters.as_dict()
