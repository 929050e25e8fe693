"""One tensor's data from a GGUF file, dequantized with gguf's quantization code: what the trainer
reads a GGUF target's weights with, and the draft exporter copies a target's rope_freqs with."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..types import SpecDeskError


def dequantized(path: Path, name: str) -> np.ndarray:
    """Tensor `name` of the GGUF as float32 in PyTorch's (rows, columns) order, whatever its
    quantization (gguf.quants)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from .binding import validated_header

    info = validated_header(path).tensor_infos[name]
    shape = tuple(reversed(info.shape))  # GGUF lists the row length first
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=info.offset, shape=(info.n_bytes,))
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    try:
        values = dequantize(np.array(raw).reshape(rows, -1), GGMLQuantizationType(info.ggml_type))
    except NotImplementedError as e:
        raise SpecDeskError(f"{path}: tensor {name} is stored as {info.type_name}, which gguf cannot dequantize "
                            f"({e}); use a GGUF whose embeddings and head are another type") from None
    return np.ascontiguousarray(values, dtype=np.float32).reshape(shape)
