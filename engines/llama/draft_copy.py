"""A draft model stored in floats (F32, F16, BF16) runs on the CPU from a Q8_0 copy.

On a CPU a draft model's pass is paced by reading its weights, and the first draft pass of every
step reads them from memory again: the target's pass has pushed them out of the caches. Q8_0
halves the bytes of an F16 draft at the same acceptance (llama.cpp's speculative examples pair
Q8_0 and Q4 drafts for the same reason); on the demo pair the speculative runs went 2-20% faster
with it (median 8%, six pairs of runs), every output identical to plain decoding
(docs/benchmarks.md, "A draft model from a Q8_0 copy"). Verification is the target's, so the
output does not depend on the draft's weights.

The copy is made once with llama.cpp's quantizer and kept in the cache folder under the source
file's identity (path, size, modification time); a draft already quantized, or placed on a GPU,
runs from its own file. When the copy cannot be made (a full disk, a read-only cache folder) the
draft runs from its own file and the engine says why in one line.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from ..files import cache_dir
from .header import GgufHeader

FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})
COPY_TYPE = "Q8_0"
COPY_BLOCK = 32  # Q8_0 holds rows whose length is a multiple of its block; the quantizer keeps others as they are
# Most of the matrices' bytes must be floats Q8_0 can hold: a quantized file with a few float
# tensors (norms are 1-D and not counted; some keep the output layer in F16), or a model whose
# rows Q8_0's blocks do not divide, runs as it is.
MIN_FLOAT_SHARE = 0.5
QUANTIZE_BYTES_PER_S = 150e6  # the quantizer's pace on two cores, for the progress shown meanwhile
DRAFT_WEIGHTS = ("q8", "file")  # LlamaEngine's draft_weights: a Q8_0 copy of a float draft on the CPU, or the file


def float_share(header: GgufHeader) -> float:
    """The share of the weight matrices' bytes stored as F32, F16 or BF16 in rows Q8_0 can hold."""
    matrices = [t for t in header.tensor_infos.values() if len(t.shape) >= 2]
    total = sum(t.n_bytes for t in matrices)
    return sum(t.n_bytes for t in matrices
               if t.type_name in FLOAT_TYPES and t.shape[0] % COPY_BLOCK == 0) / total if total else 0.0


def wants_copy(header: GgufHeader) -> bool:
    return float_share(header) > MIN_FLOAT_SHARE


def copies_folder() -> Path:
    """Where the copies are kept: the cache folder (SPECDESK_CACHE_DIR, else the user's)."""
    return cache_dir() / "draft-copies"


def copy_path(source: Path, folder: Path) -> Path:
    """The copy's name: the source's stem and a digest of its identity, so an edited or
    replaced file gets a copy of its own."""
    st = source.stat()
    key = hashlib.sha256(f"{source.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return folder / f"{source.stem}-{key}-{COPY_TYPE}.gguf"


def q8_copy(source: str | os.PathLike, progress: Optional[Callable[[float], None]] = None,
            folder: Optional[Path] = None, n_threads: int = 2) -> tuple[Path, bool]:
    """The Q8_0 copy of `source` and whether it was made now (it was not in `folder`,
    copies_folder()).
    `progress(fraction)` is called from this thread while the quantizer runs (its pace
    estimated from the file's size: llama.cpp's quantizer reports none). Raises SpecDeskError
    (the quantizer refused) or OSError (the folder could not be written); a copy is whole or
    absent."""
    from .binding import quantize_gguf

    source = Path(source)
    folder = folder or copies_folder()
    target = copy_path(source, folder)
    if target.is_file():
        return target, False
    folder.mkdir(parents=True, exist_ok=True)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            quantize_gguf(source, target, COPY_TYPE, n_threads=n_threads)
        except BaseException as e:  # handed to the caller's thread
            failure.append(e)

    worker = threading.Thread(target=run, name="specdesk-draft-copy", daemon=True)
    started = time.perf_counter()
    expected = max(source.stat().st_size / QUANTIZE_BYTES_PER_S, 0.1)
    worker.start()
    while worker.is_alive():
        if progress is not None:
            progress(min(0.95, (time.perf_counter() - started) / expected))
        worker.join(0.1)
    if failure:
        raise failure[0]
    if progress is not None:
        progress(1.0)
    return target, True
