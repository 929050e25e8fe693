"""Shared helpers for tests that drive the llama.cpp engine on the small demo family."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

import numpy as np

from specdesk.engines.types import GenerationRequest, SamplingParams, SpecConfig


def generate_tokens(engine, prompt_tokens, spec: SpecConfig, sampling: SamplingParams = SamplingParams(),
                    max_tokens: int = 32, stop_at_eos: bool = True) -> list[int]:
    request = GenerationRequest(tuple(prompt_tokens), max_tokens=max_tokens, sampling=sampling, spec=spec,
                                stop_at_eos=stop_at_eos)
    out: list[int] = []
    for event in engine.generate(request, threading.Event()):
        out.extend(event.tokens)
    return out


def rewrite_gguf(src: str | Path, dst: str | Path, edit_tokens: Callable[[list[str]], list[str]] | None = None,
                 eos_id: int | None = None, extra_tokens: int = 0) -> Path:
    """Copy a GGUF file, editing its token texts, its EOS id, or growing its vocabulary by
    `extra_tokens` (with zero embedding and output rows), to make incompatible drafts."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(str(dst), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = field.contents()
        if name == "tokenizer.ggml.tokens" and edit_tokens is not None:
            value = edit_tokens(list(value))
        if name == "tokenizer.ggml.tokens" and extra_tokens:
            value = list(value) + [f"<|extra_{i}|>" for i in range(extra_tokens)]
        if name == "tokenizer.ggml.token_type" and extra_tokens:
            value = list(value) + [1] * extra_tokens
        if name == "tokenizer.ggml.eos_token_id" and eos_id is not None:
            value = eos_id
        main_type = field.types[0]
        sub_type = field.types[-1] if main_type == GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, main_type, sub_type=sub_type)
    for tensor in reader.tensors:
        data = np.asarray(tensor.data)
        if extra_tokens and tensor.name in ("token_embd.weight", "output.weight"):
            data = np.concatenate([data, np.zeros((extra_tokens, data.shape[1]), data.dtype)])
        writer.add_tensor(tensor.name, data, raw_shape=list(data.shape), raw_dtype=tensor.tensor_type)
    return _finish(writer, dst)


def copy_gguf(src: str | Path, dst: str | Path, overrides: dict[str, Any],
              extra_tensors: dict[str, np.ndarray] | None = None) -> Path:
    """A copy of a GGUF file with some metadata values replaced: "{arch}" in a key stands for the
    file's architecture, the value None drops the key, and a key the file lacks is added (a str as
    a string, a bool, int or float as such); `extra_tensors` are added after the file's own."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    changes = {key.replace("{arch}", arch): value for key, value in overrides.items()}
    writer = GGUFWriter(str(dst), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = changes.pop(name, field.contents())
        if value is None:
            continue
        main_type = field.types[0]
        writer.add_key_value(name, value, main_type,
                             sub_type=field.types[-1] if main_type == GGUFValueType.ARRAY else None)
    added_types = {str: GGUFValueType.STRING, bool: GGUFValueType.BOOL, int: GGUFValueType.INT64,
                   float: GGUFValueType.FLOAT32}
    for name, value in changes.items():
        if value is not None:
            writer.add_key_value(name, value, added_types[type(value)])
    for tensor in reader.tensors:
        data = np.asarray(tensor.data)
        writer.add_tensor(tensor.name, data, raw_shape=list(data.shape), raw_dtype=tensor.tensor_type)
    for name, data in (extra_tensors or {}).items():
        writer.add_tensor(name, data)
    return _finish(writer, dst)


def _finish(writer, dst: str | Path) -> Path:
    """Write a GGUFWriter's header, metadata and tensors, and close it."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(dst)
