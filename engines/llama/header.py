"""A bounded reader of GGUF headers: metadata and tensor descriptions, never tensor data.

The `gguf` package's GGUFReader builds one numpy view and one list entry per array element,
so a 75-byte file whose array claims 2^62 elements makes it allocate without end. Here every
count a file states is checked against the bytes that remain before anything is read for it
(each element takes at least its smallest encoding), strings and arrays have explicit caps,
arrays of arrays (which llama.cpp cannot read either) are refused, and the whole parse is a loop over the file's own bytes:
time and memory are bounded by the file's size. Only small arrays keep their values (layer
lists, drafter settings); the vocabulary's arrays are walked for their length only, since
llama.cpp reads the vocabulary itself.

The format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any, Optional

from ..files import require_regular_file
from ..types import SpecDeskError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
# Limits, far above any real model (vocabularies are ~262k tokens, merges ~500k, chat
# templates tens of KB, tensor counts a few thousand) and far below what would hurt.
MAX_STRING_BYTES = 64 * 1024 * 1024
MAX_ARRAY_ELEMENTS = 64 * 1024 * 1024
MAX_KV_COUNT = 1 << 20
MAX_TENSORS = 1 << 20
MAX_VOCAB_TOKENS = 1 << 22  # tokens whose texts are read to find duplicates (real vocabularies: ~262k)
MAX_DIMS = 4  # GGML_MAX_DIMS
KEPT_ARRAY_VALUES = 4096  # arrays up to this length keep their values (per-layer settings)
DEFAULT_ALIGNMENT = 32

STRING, ARRAY = 8, 9
# value type -> (struct code, size); strings and arrays are handled apart
SCALARS = {0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4), 6: ("f", 4),
           7: ("?", 1), 10: ("Q", 8), 11: ("q", 8), 12: ("d", 8)}
TYPE_NAMES = {0: "uint8", 1: "int8", 2: "uint16", 3: "int16", 4: "uint32", 5: "int32", 6: "float32",
              7: "bool", 8: "string", 9: "array", 10: "uint64", 11: "int64", 12: "float64"}


class GgufFormatError(SpecDeskError):
    """The file is not a well-formed GGUF header (the message names the file and the byte)."""


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]  # GGUF order: ne0 (the row length) first
    ggml_type: int
    type_name: str
    n_elements: int
    n_bytes: int
    offset: int  # absolute byte offset of its data in the file

    @property
    def end(self) -> int:
        return self.offset + self.n_bytes


@dataclass(frozen=True)
class GgufHeader:
    """What a GGUF file's header says. `fields` holds every scalar and string value and the
    values of arrays of at most KEPT_ARRAY_VALUES elements; `array_lengths` every array's length."""

    path: str
    size: int  # of the file, bytes
    version: int
    fields: dict  # key -> value
    array_lengths: dict  # key -> number of elements
    tensor_infos: dict  # name -> TensorInfo
    data_offset: int  # where tensor data starts
    # the first token whose text an earlier token already has, as (index, earlier index, text):
    # llama.cpp maps texts to ids and asserts that every text is unique (llama-vocab.cpp)
    duplicate_token: Optional[tuple[int, int, str]] = None

    @property
    def tensors(self) -> dict:
        """Tensor name -> shape (GGUF order)."""
        return {name: t.shape for name, t in self.tensor_infos.items()}

    @property
    def tensor_ends(self) -> dict:
        """Tensor name -> byte offset just past its data."""
        return {name: t.end for name, t in self.tensor_infos.items()}

    @property
    def architecture(self) -> str:
        return str(self.fields.get("general.architecture") or "")

    def arch_value(self, key: str, default: Any = None) -> Any:
        """`{architecture}.{key}`, e.g. arch_value("block_count")."""
        return self.fields.get(f"{self.architecture}.{key}", default)


class _Cursor:
    """Reads little- or big-endian values from a byte buffer, refusing reads past its end."""

    def __init__(self, path: str, data, order: str):
        self.path, self.data, self.order, self.pos = path, data, order, 0
        self.size = len(data)

    def fail(self, what: str) -> GgufFormatError:
        return GgufFormatError(f"{self.path}: corrupt GGUF file: {what} (at byte {self.pos} of {self.size}); "
                               "download or convert it again")

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(f"{what} needs {n} bytes but only {self.size - self.pos} remain (truncated file?)")

    def scalar(self, code: str, size: int, what: str):
        self.need(size, what)
        (value,) = struct.unpack_from(self.order + code, self.data, self.pos)
        self.pos += size
        return value

    def u32(self, what: str) -> int:
        return self.scalar("I", 4, what)

    def u64(self, what: str) -> int:
        return self.scalar("Q", 8, what)

    def string_length(self, what: str) -> int:
        n = self.u64(what)
        if n > MAX_STRING_BYTES:
            raise self.fail(f"{what} claims {n} bytes (the limit is {MAX_STRING_BYTES})")
        self.need(n, what)
        return n

    def string(self, what: str) -> str:
        n = self.string_length(what)
        raw = bytes(self.data[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", "replace")

    def skip_string(self, what: str) -> None:
        n = self.string_length(what)  # moves pos past the length first
        self.pos += n


def _min_encoded_size(value_type: int) -> int:
    """The fewest bytes one value of this type takes: the bound for a claimed element count."""
    if value_type == STRING:
        return 8  # its length
    return SCALARS[value_type][1]


def _check_type(cur: _Cursor, value_type: int, key: str) -> None:
    if value_type not in SCALARS and value_type not in (STRING, ARRAY):
        raise cur.fail(f"metadata {key!r} has unknown value type {value_type}")


def _read_value(cur: _Cursor, value_type: int, key: str, keep: bool) -> Any:
    """One value; arrays return their values when `keep` and short, else None (walked, not kept)."""
    if value_type == STRING:
        if keep:
            return cur.string(f"metadata {key!r}")
        cur.skip_string(f"metadata {key!r}")
        return None
    if value_type != ARRAY:
        code, size = SCALARS[value_type]
        return cur.scalar(code, size, f"metadata {key!r}")
    element_type = cur.u32(f"metadata {key!r} array type")
    _check_type(cur, element_type, key)
    if element_type == ARRAY:  # so no nesting depth to bound, and no recursion
        raise cur.fail(f"metadata {key!r} is an array of arrays, which llama.cpp cannot read")
    count = cur.u64(f"metadata {key!r} array length")
    if count > MAX_ARRAY_ELEMENTS:
        raise cur.fail(f"metadata array {key!r} claims {count} elements (the limit is {MAX_ARRAY_ELEMENTS})")
    # Checked before reading any element: a claimed count the file cannot hold is refused at once.
    cur.need(count * _min_encoded_size(element_type), f"metadata array {key!r} of {count} {TYPE_NAMES[element_type]} values")
    keep = keep and count <= KEPT_ARRAY_VALUES
    if element_type in SCALARS:  # fixed size: kept values are unpacked at once, others skipped
        code, size = SCALARS[element_type]
        values = list(struct.unpack_from(f"{cur.order}{count}{code}", cur.data, cur.pos)) if keep else None
        cur.pos += count * size
        return values
    values = [] if keep else None
    for _ in range(count):
        value = _read_value(cur, element_type, key, keep)
        if keep:
            values.append(value)
    return values


def _first_duplicate_token(cur: _Cursor, key: str) -> Optional[tuple[int, int, str]]:
    """Walks the string array at cur.pos (the token list) and returns its first text seen
    twice, as llama.cpp's loader sees texts: an empty one stands for "[EMPTY_<index>]"."""
    start = cur.pos
    element_type = cur.u32(f"metadata {key!r} array type")
    count = cur.u64(f"metadata {key!r} array length")
    if element_type != STRING or count > MAX_VOCAB_TOKENS:
        cur.pos = start
        return None
    cur.need(count * 8, f"metadata array {key!r} of {count} string values")
    seen: dict[bytes, int] = {}
    found = None
    for index in range(count):
        n = cur.string_length(f"metadata {key!r}")
        text = bytes(cur.data[cur.pos:cur.pos + n]) or f"[EMPTY_{index}]".encode()
        cur.pos += n
        earlier = seen.setdefault(text, index)
        if earlier != index:
            found = (index, earlier, text.decode("utf-8", "replace"))
            break
    cur.pos = start
    return found


def _array_length_at(cur: _Cursor) -> int:
    """The element count of the array value that starts at cur.pos (without moving)."""
    return struct.unpack_from(cur.order + "Q", cur.data, cur.pos + 4)[0]


def _tensor_bytes(cur: _Cursor, name: str, ggml_type: int, shape: tuple[int, ...]) -> tuple[str, int, int]:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        quant = GGMLQuantizationType(ggml_type)
        block, type_size = GGML_QUANT_SIZES[quant]
    except (ValueError, KeyError):
        raise cur.fail(f"tensor {name!r} has unknown type {ggml_type}") from None
    n_elements = math.prod(shape)
    if shape and shape[0] % block:
        raise cur.fail(f"tensor {name!r} rows of {shape[0]} are not a multiple of its {quant.name} block of {block}")
    return quant.name, n_elements, n_elements * type_size // block


def parse_gguf_header(path: str, data) -> GgufHeader:
    """Parse a GGUF header from `data` (bytes or a memory map of the whole file)."""
    if len(data) < 24 or bytes(data[:4]) != GGUF_MAGIC:
        start = bytes(data[:4])
        if start != GGUF_MAGIC:
            raise GgufFormatError(f"{path}: not a GGUF file (it starts with {start!r}, a GGUF file starts "
                                  "with b'GGUF'); choose a .gguf model file")
        raise GgufFormatError(f"{path}: corrupt GGUF file: {len(data)} bytes is too short for a header")
    (version,) = struct.unpack_from("<I", data, 4)
    order = "<"
    if version & 0xFFFF == 0:  # written on a big-endian machine
        order, (version,) = ">", struct.unpack_from(">I", data, 4)
    cur = _Cursor(path, data, order)
    cur.pos = 8
    if version not in SUPPORTED_VERSIONS:
        raise cur.fail(f"GGUF version {version} is not supported (supported: {', '.join(map(str, SUPPORTED_VERSIONS))})")
    n_tensors, n_kv = cur.u64("tensor count"), cur.u64("metadata count")
    if n_tensors > MAX_TENSORS:
        raise cur.fail(f"it claims {n_tensors} tensors (the limit is {MAX_TENSORS})")
    if n_kv > MAX_KV_COUNT:
        raise cur.fail(f"it claims {n_kv} metadata keys (the limit is {MAX_KV_COUNT})")
    cur.need(n_kv * 13 + n_tensors * 24, f"{n_kv} metadata keys and {n_tensors} tensor descriptions")
    fields: dict = {}
    array_lengths: dict = {}
    duplicate_token = None
    for _ in range(n_kv):
        key = cur.string("metadata key")
        if key in fields or key in array_lengths:
            raise cur.fail(f"metadata key {key!r} appears twice")
        value_type = cur.u32(f"metadata {key!r} type")
        _check_type(cur, value_type, key)
        if value_type == ARRAY:
            cur.need(12, f"metadata {key!r} array header")
            array_lengths[key] = _array_length_at(cur)
            if key == "tokenizer.ggml.tokens":
                duplicate_token = _first_duplicate_token(cur, key)
        # The vocabulary's arrays are walked for their length only: llama.cpp reads them itself.
        value = _read_value(cur, value_type, key, keep=not (value_type == ARRAY and key.startswith("tokenizer.")))
        if value is not None:
            fields[key] = value
    alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 or alignment & (alignment - 1):
        raise cur.fail(f"general.alignment {alignment!r} is not a power of two")
    described = []
    for _ in range(n_tensors):
        name = cur.string("tensor name")
        n_dims = cur.u32(f"tensor {name!r} dimension count")
        if n_dims > MAX_DIMS:
            raise cur.fail(f"tensor {name!r} has {n_dims} dimensions (GGML allows at most {MAX_DIMS})")
        shape = tuple(cur.u64(f"tensor {name!r} shape") for _ in range(n_dims))
        if any(d == 0 for d in shape) or math.prod(shape) >= 1 << 63:
            raise cur.fail(f"tensor {name!r} has an impossible shape {shape}")
        ggml_type = cur.u32(f"tensor {name!r} type")
        relative = cur.u64(f"tensor {name!r} offset")
        if relative % alignment:
            raise cur.fail(f"tensor {name!r} data offset {relative} is not aligned to {alignment}")
        described.append((name, shape, ggml_type, relative))
    data_offset = -(-cur.pos // alignment) * alignment
    tensor_infos: dict = {}
    for name, shape, ggml_type, relative in described:
        if name in tensor_infos:
            raise cur.fail(f"tensor {name!r} appears twice")
        type_name, n_elements, n_bytes = _tensor_bytes(cur, name, ggml_type, shape)
        tensor_infos[name] = TensorInfo(shape, ggml_type, type_name, n_elements, n_bytes, data_offset + relative)
    return GgufHeader(path, len(data), version, fields, array_lengths, tensor_infos, data_offset, duplicate_token)


def read_gguf_header(path: str | os.PathLike) -> GgufHeader:
    """The header of the GGUF file at `path` (a regular file; its pages are mapped, and only
    the header's are touched)."""
    p = require_regular_file(path, "GGUF model file")
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                return parse_gguf_header(str(p), f.read())
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return parse_gguf_header(str(p), data)
    except OSError as e:
        raise SpecDeskError(f"{p}: cannot read it ({e.strerror or e})") from None
