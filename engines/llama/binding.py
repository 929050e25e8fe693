"""Thin, typed wrappers over llama-cpp-python's low-level C API (pinned to 0.3.36).

llama_cpp is imported lazily so that importing the engines package costs nothing and a
missing install becomes a clear message, not an ImportError deep in a worker thread.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import re
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from ..files import require_regular_file
from ..types import SpecDeskError
from .header import GgufHeader, read_gguf_header
from .validate import check_gguf, kv_cache_bytes

_init_lock = threading.Lock()
_initialised = False
_log_callback = None  # kept alive for as long as llama.cpp may call it
_recent_errors: deque[str] = deque(maxlen=8)
# llama.cpp's "<buffer> model/KV/compute buffer size = N MiB" lines: what each load and context
# allocated on each device (placement.buffer_device), read after it returns
_buffer_lines: deque[tuple[str, str, int]] = deque(maxlen=64)
_BUFFER_LINE = re.compile(r"^\w+: +(\S+) +(model|KV|compute|output|RS) buffer size = +([\d.]+) MiB")

GGUF_MAGIC = b"GGUF"
VOCAB_TYPE_NAMES = {0: "none", 1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2", 7: "test"}


def llama_lib():
    """The llama_cpp module, with the backend initialised once and its log captured."""
    global _initialised, _log_callback
    try:
        import llama_cpp
    except ImportError as e:  # pragma: no cover - depends on the install
        raise SpecDeskError("llama-cpp-python is not installed: run the README's set-up command") from e
    with _init_lock:
        if not _initialised:
            @llama_cpp.llama_log_callback
            def on_log(level, text, user_data):
                # Errors are kept to explain a failed load; everything else is dropped so
                # llama.cpp's chatter never interleaves with our output.
                if level == 4 and text:  # GGML_LOG_LEVEL_ERROR
                    _recent_errors.append(text.decode("utf-8", "replace").strip())
                elif level == 2 and text and b"buffer size =" in text:  # GGML_LOG_LEVEL_INFO
                    match = _BUFFER_LINE.match(text.decode("utf-8", "replace").strip())
                    if match:
                        _buffer_lines.append((match.group(1), match.group(2),
                                              int(float(match.group(3)) * 1024 * 1024)))
            _log_callback = on_log
            if not os.environ.get("SPECDESK_LLAMA_LOG"):
                llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
            load_backend_modules(llama_cpp.llama_cpp._lib)
            llama_cpp.llama_backend_init()
            _initialised = True
    return llama_cpp


def ggml_function(name: str, restype, argtypes: list, lib: Optional[ctypes.CDLL] = None):
    """A function of ggml's C API, typed. On Linux and macOS it resolves through libllama's handle
    (the loader searches a library's dependencies); on Windows a DLL offers only its own exports,
    so ggml.dll and ggml-base.dll beside it are asked next. `lib`: libllama's handle (default:
    llama-cpp-python's)."""
    lib = lib if lib is not None else llama_lib().llama_cpp._lib
    for library in (lib, *_ggml_libraries(lib)):
        try:
            function = getattr(library, name)
        except AttributeError:
            continue
        function.restype, function.argtypes = restype, argtypes
        return function
    raise SpecDeskError(f"llama.cpp's libraries in {Path(lib._name).parent} have no {name}: install again with "
                        "the README's set-up command")


@functools.lru_cache(maxsize=4)
def _ggml_libraries(lib: ctypes.CDLL) -> tuple[ctypes.CDLL, ...]:
    """ggml and ggml-base from libllama's folder, by the names each platform gives them."""
    folder = Path(lib._name).parent
    found = []
    for stem in ("ggml", "ggml-base"):
        for name in (f"{stem}.dll", f"lib{stem}.so.0", f"lib{stem}.so", f"lib{stem}.0.dylib", f"lib{stem}.dylib"):
            if (folder / name).is_file():
                found.append(ctypes.CDLL(str(folder / name)))
                break
    return tuple(found)


def load_backend_modules(lib: ctypes.CDLL) -> list[str]:
    """Load the backends of a build that keeps them in modules (GGML_BACKEND_DL), as llama.cpp's
    own tools do and llama-cpp-python does not (its issue #2069: "no backends are loaded").

    Such a build carries one CPU module per instruction-set level (libggml-cpu-sse42,
    -haswell, -skylakex ... with GGML_CPU_ALL_VARIANTS): ggml scores each against this CPU and
    keeps the best, so one install runs on an old CPU and uses AVX-512 where there is some.
    The GPU and RPC backends are modules too. They are read from the folder of llama.cpp's
    library. A build with its backends linked in (the registry is already filled) is left as
    it is. Returns the names of the registered backends."""
    count = ggml_function("ggml_backend_reg_count", ctypes.c_size_t, [], lib)
    folder = Path(lib._name).parent
    if count() == 0:
        ggml_function("ggml_backend_load_all_from_path", None, [ctypes.c_char_p], lib)(os.fsencode(folder))
        _replace_cpu_module(lib, folder)
    get = ggml_function("ggml_backend_reg_get", ctypes.c_void_p, [ctypes.c_size_t], lib)
    name = ggml_function("ggml_backend_reg_name", ctypes.c_char_p, [ctypes.c_void_p], lib)
    names = [(name(get(i)) or b"").decode("utf-8", "replace") for i in range(count())]
    if "CPU" not in names:
        raise SpecDeskError(f"llama.cpp found no CPU backend in {folder} (its libggml-cpu*.so files are missing "
                            "or none runs on this CPU): install again with the README's set-up command")
    return names


def _replace_cpu_module(lib: ctypes.CDLL, folder: Path) -> None:
    """When the CPU module ggml chose by score does not run here (cpu_variant.py), the best one
    that does takes its place."""
    from . import cpu_variant

    chosen, instead, skipped = cpu_variant.choose(folder)
    if instead is None:
        if skipped:
            raise SpecDeskError(f"none of llama.cpp's CPU modules in {folder} runs on this machine ("
                                + "; ".join(skipped) + "): build one fixed level with SPECDESK_LLAMA_CPU=x86-64-v2 "
                                "and the README's set-up command")
        return
    by_name = ggml_function("ggml_backend_reg_by_name", ctypes.c_void_p, [ctypes.c_char_p], lib)
    reg = by_name(b"CPU")
    if reg:
        ggml_function("ggml_backend_unload", None, [ctypes.c_void_p], lib)(reg)
    if not ggml_function("ggml_backend_load", ctypes.c_void_p, [ctypes.c_char_p], lib)(os.fsencode(instead)):
        raise SpecDeskError(f"llama.cpp could not load its CPU module {instead}: install again with the README's "
                            "set-up command")
    if skipped:
        logging.getLogger(__name__).info("llama.cpp's CPU module %s instead of %s: %s", instead.name, chosen.name,
                                         "; ".join(skipped))


def check_gguf_file(path: str | os.PathLike) -> Path:
    """Reject a missing, empty, special (FIFO, device) or non-GGUF file before llama.cpp sees it."""
    p = Path(path)
    if not p.exists():  # stat only: never blocks
        raise SpecDeskError(f"{p}: no such file (check the path, or choose another model)")
    require_regular_file(p, "GGUF model file")
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise SpecDeskError(f"{p}: not a GGUF file (it starts with {magic!r}, a GGUF file starts with b'GGUF'); "
                           "choose a .gguf model file")
    return p


def gguf_header(path: str | os.PathLike) -> GgufHeader:
    """The header of a GGUF file (bounded read, header.py), parsed once per (size, modification
    time): the validation, the MTP and drafter checks and the app all ask for it."""
    p = require_regular_file(path, "GGUF model file")
    st = p.stat()
    return _read_header(os.path.abspath(p), st.st_size, st.st_mtime_ns)  # messages name the path as given


@functools.lru_cache(maxsize=16)
def _read_header(path: str, size: int, mtime_ns: int) -> GgufHeader:
    return read_gguf_header(path)


def validated_header(path: str | os.PathLike) -> GgufHeader:
    """The header of a GGUF file that passed validate.py's checks, else a one-line SpecDeskError
    naming the file and every problem."""
    return check_gguf(gguf_header(check_gguf_file(path)))


@dataclass(frozen=True)
class VocabInfo:
    vocab_type: str
    n_tokens: int
    bos: int
    eos: int
    add_bos: bool


class NativeHandle:
    """A wrapper of a llama.cpp object that frees it once: on close(), or when collected.
    `_handle` names the attribute holding the pointer; `_free` releases what it owns."""

    _handle = "_ctx"

    def _free(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        if getattr(self, self._handle, None):
            self._free()
            setattr(self, self._handle, None)

    def __del__(self):  # pragma: no cover - finaliser
        try:
            self.close()
        except Exception:
            pass


class ContextHandle(NativeHandle):
    """A llama_context wrapper over `self.model`: creating it, its threads."""

    def _open(self, n_ctx: int, n_threads: int, n_batch: int, what: str, **extra) -> None:
        """Create the context over self.model for sequence 0, with `extra` context parameters."""
        lib, model = self._lib, self.model
        params = lib.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = 1
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.no_perf = True
        for name, value in extra.items():
            setattr(params, name, value)
        _buffer_lines.clear()
        self._ctx = lib.llama_init_from_model(model._model, params)
        self.buffers = [(name, size) for name, kind, size in _buffer_lines if kind != "model"]
        if not self._ctx:
            raise SpecDeskError(f"{model.path}: could not create {what} of {n_ctx} tokens (out of memory?)")
        self.n_batch = n_batch
        self._memory = lib.llama_get_memory(self._ctx)

    def set_threads(self, n_threads: int) -> None:
        """The threads its decodes use."""
        self._lib.llama_set_n_threads(self._ctx, n_threads, n_threads)


class GgufModel(NativeHandle):
    """A loaded GGUF model: weights, vocabulary, tokenizer."""

    def __init__(self, path: str | os.PathLike, n_gpu_layers: Optional[int] = None, load_mtp: bool = False,
                 progress: Optional[Callable[[float], None]] = None, vocab_only: bool = False,
                 device: Optional[int] = None, extra_buffers: bool = True):
        """progress(fraction) is called from this thread while the weights load; vocab_only
        reads the vocabulary and metadata without the weights (for compatibility checks).
        extra_buffers: let the CPU backend keep weights in its reordered ("repacked") layouts
        where it has kernels for them (llama.cpp's default; --no-repack turns it off).
        n_gpu_layers of its layers go to `device` (a ggml_backend_dev_t, placement.py; None:
        llama.cpp's own default, every layer); without a device the model stays on the CPU,
        whatever devices the backends offer. The engine passes the number its placement chose
        (placement.py: "auto" is every layer that fits)."""
        self.path = check_gguf_file(path)
        self.header = validated_header(self.path)
        lib = llama_lib()
        self._lib = lib
        params = lib.llama_model_default_params()
        if not device:
            params.n_gpu_layers = 0
        elif n_gpu_layers is not None:
            params.n_gpu_layers = n_gpu_layers
        # A NULL-terminated device list: [] keeps every layer on the CPU (NULL would mean "every GPU").
        self._device_list = (ctypes.c_void_p * 2)(device or None, None)
        params.devices = ctypes.cast(self._device_list, ctypes.c_void_p)
        params.load_mtp = load_mtp  # NextN layers, for an MTP drafter context over this model
        params.vocab_only = vocab_only
        params.use_extra_bufts = extra_buffers
        self.load_mtp = load_mtp
        if progress is not None:
            def on_progress(fraction, user_data):
                try:
                    progress(float(fraction))
                except Exception:  # an exception must not unwind through C
                    pass
                return True  # keep loading
            callback = lib.llama_progress_callback(on_progress)
            params.progress_callback = callback  # referenced by `callback` until the load returns
        _recent_errors.clear()
        _buffer_lines.clear()
        self._model = lib.llama_model_load_from_file(str(self.path).encode(), params)
        self.buffers = [(name, size) for name, kind, size in _buffer_lines if kind == "model"]
        if not self._model:
            detail = "; ".join(_recent_errors) or "llama.cpp could not load it"
            raise SpecDeskError(f"{self.path}: cannot load this GGUF file ({detail})")
        self._vocab = lib.llama_model_get_vocab(self._model)
        self.n_vocab = lib.llama_vocab_n_tokens(self._vocab)
        self.n_ctx_train = lib.llama_model_n_ctx_train(self._model)
        self.n_embd = lib.llama_model_n_embd(self._model)
        self.n_embd_out = lib.llama_model_n_embd_out(self._model)  # the width of its final-normed rows
        self.size_bytes = lib.llama_model_size(self._model)
        self.n_params = lib.llama_model_n_params(self._model)
        self.vocab = VocabInfo(
            vocab_type=VOCAB_TYPE_NAMES.get(lib.llama_vocab_type(self._vocab), "unknown"),
            n_tokens=self.n_vocab,
            bos=lib.llama_vocab_bos(self._vocab),
            eos=lib.llama_vocab_eos(self._vocab),
            add_bos=bool(lib.llama_vocab_get_add_bos(self._vocab)),
        )
        self._piece_cache: dict[int, bytes] = {}

    _handle = "_model"

    def _free(self) -> None:
        self._lib.llama_model_free(self._model)

    def __enter__(self) -> "GgufModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- vocabulary -------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool | None = None, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        add = self.vocab.add_bos if add_bos is None else add_bos
        capacity = len(data) + 8
        buf = (self._lib.llama_token * capacity)()
        n = self._lib.llama_tokenize(self._vocab, data, len(data), buf, capacity, add, parse_special)
        if n < 0:
            capacity = -n
            buf = (self._lib.llama_token * capacity)()
            n = self._lib.llama_tokenize(self._vocab, data, len(data), buf, capacity, add, parse_special)
        return list(buf[:n])

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token stands for; control tokens render as nothing."""
        piece = self._piece_cache.get(token)
        if piece is None:
            buf = ctypes.create_string_buffer(64)
            n = self._lib.llama_token_to_piece(self._vocab, token, buf, 64, 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = self._lib.llama_token_to_piece(self._vocab, token, buf, -n, 0, False)
            piece = buf.raw[:n]
            self._piece_cache[token] = piece
        return piece

    def token_text(self, token: int) -> str:
        """The vocabulary entry as stored (used to compare vocabularies)."""
        raw = self._lib.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", "replace") if raw else ""

    def is_eog(self, token: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self._vocab, token))

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", "replace")

    def chat_template(self) -> str | None:
        raw = self._lib.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8") if raw else None

    def kv_cache_bytes(self, n_ctx: int) -> int:
        """Keys and values of n_ctx positions in llama.cpp's default f16 cache (validate.kv_cache_bytes)."""
        return kv_cache_bytes(self.header, n_ctx)

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = self._lib.llama_model_meta_val_str(self._model, key.encode(), buf, 4096)
        return buf.value.decode("utf-8", "replace") if n >= 0 else None


QUANT_TYPES = {"F16": 1, "BF16": 32, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q4_K_M": 15}  # llama_ftype values


def quantize_gguf(src: str | os.PathLike, dst: str | os.PathLike, quant: str, n_threads: int = 2) -> Path:
    """llama.cpp's own quantizer (llama_model_quantize) from a GGUF to `quant`; the file
    appears whole or not at all. A quantized source is requantized (llama.cpp refuses that
    unless asked): the weights keep the source's rounding, so SmolLM2's Q4_1 file made into
    F16 is the Q4_1 model stored in F16, which is what the pass-cost comparisons of weight
    types want (the same numbers, another kernel)."""
    if quant not in QUANT_TYPES:
        raise SpecDeskError(f"quantization {quant!r} is not one of {', '.join(QUANT_TYPES)}")
    lib = llama_lib()
    params = lib.llama_model_quantize_default_params()
    params.ftype = QUANT_TYPES[quant]
    params.nthread = n_threads
    params.allow_requantize = True
    dst = Path(dst)
    tmp = dst.with_name(dst.name + f".tmp-{os.getpid()}")
    if lib.llama_model_quantize(str(src).encode(), str(tmp).encode(), params) != 0:
        tmp.unlink(missing_ok=True)
        raise SpecDeskError(f"{src}: llama.cpp could not quantize it to {quant}")
    os.replace(tmp, dst)
    return dst


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    limit = min(len(a), len(b))
    if list(a[:limit]) == list(b[:limit]):  # the usual case, compared at C speed
        return limit
    n = 0
    while a[n] == b[n]:
        n += 1
    return n


DECODE_ERRORS = {  # llama_decode's documented return codes
    1: "no room left in the context for this batch: use a larger context (--ctx) or a shorter prompt",
    2: "decoding was aborted",
    -1: "llama.cpp refused the batch (a token id outside the vocabulary?)",
}


class GgufContext(ContextHandle):
    """One inference context (its own KV cache) over a GgufModel, for sequence 0.

    The KV cache is sized once (n_ctx); rolling back a rejected draft removes positions
    from the cache with llama_memory_seq_rm, it never reallocates.
    """

    def __init__(self, model: GgufModel, n_ctx: int, n_threads: int, n_batch: int = 512, **context_params):
        """context_params: further fields of llama_context_params (n_ubatch, flash_attn_type, ...)."""
        lib = model._lib
        self._lib, self.model = lib, model
        self._open(n_ctx, n_threads, n_batch, "a context", **context_params)
        self.n_ctx = lib.llama_n_ctx(self._ctx)
        self._batch = lib.llama_batch_init(n_batch, 0, 1)
        self.n_past = 0  # tokens whose keys and values are in the cache
        self.cached: list[int] = []  # those tokens, for prefix reuse
        self.n_last = 0  # tokens in the newest llama_decode (its hidden-state rows: ext.HiddenRows)

    def _free(self) -> None:
        self._lib.llama_batch_free(self._batch)
        self._lib.llama_free(self._ctx)

    def rollback(self, n_keep: int) -> None:
        """Forget every position from n_keep on."""
        if n_keep < self.n_past:
            self._lib.llama_memory_seq_rm(self._memory, 0, n_keep, -1)
            self.n_past = n_keep
            del self.cached[n_keep:]

    def decode(self, tokens: Sequence[int], all_logits: bool = True) -> np.ndarray:
        """Append tokens at n_past; returns logits (len(tokens), V), or (1, V) for the last
        token only when all_logits is False. Long inputs go in n_batch chunks."""
        if self.n_past + len(tokens) > self.n_ctx:
            raise SpecDeskError(
                f"context overflow: {self.n_past + len(tokens)} tokens do not fit in the context of {self.n_ctx}"
            )
        rows: list[np.ndarray] = []
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start:start + self.n_batch]
            last_chunk = start + self.n_batch >= len(tokens)
            want = [all_logits or (last_chunk and i == len(chunk) - 1) for i in range(len(chunk))]
            rows.append(self._decode_chunk(chunk, want))
        return np.concatenate([r for r in rows if len(r)], axis=0) if rows else np.zeros((0, self.model.n_vocab))

    def _decode_chunk(self, tokens: Sequence[int], want_logits: list[bool]) -> np.ndarray:
        batch, n = self._batch, len(tokens)
        batch.n_tokens = n
        for i, token in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = self.n_past + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = want_logits[i]
        status = self._lib.llama_decode(self._ctx, batch)
        if status != 0:
            raise SpecDeskError(f"{self.model.path}: {DECODE_ERRORS.get(status, f'llama_decode failed with status {status} (out of memory or a backend error): try a smaller context or model')}")
        self.n_past += n
        self.cached.extend(tokens)
        self.n_last = n
        n_out = sum(want_logits)
        if n_out == 0:
            return np.zeros((0, self.model.n_vocab), dtype=np.float32)
        pointer = self._lib.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(pointer, shape=(n_out, self.model.n_vocab)).copy()  # (n_out, V)

    def sync_prefix(self, tokens: Sequence[int]) -> int:
        """Keep the longest cached prefix of `tokens` and drop the rest; returns its length."""
        common = common_prefix(self.cached, tokens)
        self.rollback(common)
        return common
