"""One validation pass over a GGUF file's metadata before anything uses it.

`gguf_problems` returns the reasons a file cannot serve as a model (an empty list when it
can): the values llama.cpp asserts on or throws over while loading (layer counts, head
counts that do not divide, per-layer arrays of the wrong length, a missing vocabulary), the
ones that load but produce garbage (a NaN or non-positive norm epsilon), tensors past the end
of the file, and, for a context size, a KV cache that cannot fit in free memory. The engine's
loader, `models list`, `models pair`, the library scanner and the Models tab all ask it, so a
file refused in one place is refused everywhere, with the same words.
"""

from __future__ import annotations

import math
import os
import re
from typing import Optional

from ..methods import drafter_methods
from ..types import SpecDeskError
from .fit import kv_bytes
from .header import MAX_VOCAB_TOKENS, GgufHeader

MAX_LAYERS = 512  # LLAMA_MAX_LAYERS: llama.cpp refuses more
MAX_CONTEXT = (1 << 31) - 1  # llama.cpp keeps context sizes in 32-bit integers
# Recurrent architectures have no attention heads in some or all layers.
# llama.cpp's load refuses a rope dimension count other than the head size for these
EQUAL_ROPE_ARCHITECTURES = ("llama", "deci", "falcon", "llama-embed")
# The BOS id llama.cpp falls back on when a vocabulary names none, and whether it adds BOS
# unless tokenizer.ggml.add_bos_token says otherwise (llama-vocab.cpp, load): SentencePiece's.
DEFAULT_BOS = {"llama": (1, True), "gpt2": (11, False)}
RECURRENT_ARCHITECTURES = ("mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7")
TOKENIZER_MODELS = ("no_vocab", "none", "llama", "gpt2", "hybriddna", "whitespace", "bert", "t5", "rwkv", "test",
                    "plamo2", "gemma4")  # llama-vocab.cpp's list
_BLOCK_TENSOR = re.compile(r"blk\.(\d+)\.")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _per_layer(header: GgufHeader, key: str, n_layer: int, problems: list[str]) -> Optional[list[int]]:
    """A value that is either one integer or one per layer (llama.cpp's get_key_or_arr)."""
    full = f"{header.architecture}.{key}"
    value = header.fields.get(full)
    if value is None:
        if full in header.array_lengths:  # too long to keep: certainly not one per layer
            problems.append(f"{full} has {header.array_lengths[full]} values for {n_layer} layers")
        return None
    values = value if isinstance(value, list) else [value]
    if not all(_is_int(v) for v in values):
        problems.append(f"{full} is {value!r}, expected whole numbers")
        return None
    if isinstance(value, list) and len(values) != n_layer:
        problems.append(f"{full} has {len(values)} values for {n_layer} layers")
        return None
    return values if isinstance(value, list) else values * n_layer


def _check_layers(header: GgufHeader, problems: list[str]) -> int:
    key = f"{header.architecture}.block_count"
    n_layer = header.fields.get(key)
    if n_layer is None:
        problems.append(f"{key} is missing")
        return 0
    if not _is_int(n_layer) or not 1 <= n_layer <= MAX_LAYERS:
        problems.append(f"{key} is {n_layer!r}; llama.cpp accepts 1 to {MAX_LAYERS} layers")
        return 0
    indices = {int(m.group(1)) for name in header.tensor_infos if (m := _BLOCK_TENSOR.match(name))}
    if indices and max(indices) + 1 != n_layer:
        problems.append(f"{key} is {n_layer} but the file holds tensors for {max(indices) + 1} layers")
    return n_layer


def _check_attention(header: GgufHeader, n_layer: int, problems: list[str]) -> None:
    arch = header.architecture
    n_embd = header.arch_value("embedding_length")
    if not _is_int(n_embd) or n_embd < 1:
        problems.append(f"{arch}.embedding_length is {n_embd!r}; expected a positive whole number")
        n_embd = None
    if not n_layer:
        return
    heads = _per_layer(header, "attention.head_count", n_layer, problems)
    heads_kv = _per_layer(header, "attention.head_count_kv", n_layer, problems)
    key_length = header.arch_value("attention.key_length")
    recurrent = arch in RECURRENT_ARCHITECTURES
    if heads is None:  # missing, or already named by _per_layer
        key = f"{arch}.attention.head_count"
        if not recurrent and key not in header.fields and key not in header.array_lengths:
            problems.append(f"{key} is missing")
        return
    if not recurrent and not any(heads):
        problems.append(f"{arch}.attention.head_count is 0: a transformer needs attention heads")
    heads_kv = heads_kv if heads_kv is not None else heads
    for layer, (n_head, n_head_kv) in enumerate(zip(heads, heads_kv)):
        where = f" (layer {layer})" if len(set(heads)) > 1 or len(set(heads_kv)) > 1 else ""
        if n_head < 0 or n_head_kv < 0:
            problems.append(f"{arch}.attention head counts {n_head}/{n_head_kv}{where} are negative")
            break
        if n_head and not n_head_kv:
            problems.append(f"{arch}.attention.head_count_kv is 0{where} while head_count is {n_head}")
            break
        if n_head_kv and n_head % n_head_kv:
            problems.append(f"{arch}.attention.head_count {n_head} is not a multiple of head_count_kv {n_head_kv}{where}")
            break
        if n_head and key_length is None and n_embd and n_embd % n_head:
            problems.append(f"{arch}.embedding_length {n_embd} is not a multiple of head_count {n_head}{where} "
                            "(and no attention.key_length says otherwise)")
            break
    for name in ("attention.key_length", "attention.value_length"):
        value = header.arch_value(name)
        if value is not None and (not _is_int(value) or value < 1):
            problems.append(f"{arch}.{name} is {value!r}; expected a positive whole number")
    _check_rope(header, max(heads), key_length, n_embd, problems)


def _check_rope(header: GgufHeader, n_head: int, key_length, n_embd: Optional[int], problems: list[str]) -> None:
    """Rotary dimensions fit in a head (llama.cpp requires them equal for the llama family,
    and a larger count makes its rope kernels read past each head)."""
    arch = header.architecture
    rope = header.arch_value("rope.dimension_count")
    if rope is None or not n_head:
        return
    head_size = key_length if _is_int(key_length) and key_length > 0 else (n_embd // n_head if n_embd else None)
    if not _is_int(rope) or rope < 0:
        problems.append(f"{arch}.rope.dimension_count is {rope!r}; expected a whole number")
    elif head_size and rope > head_size:
        problems.append(f"{arch}.rope.dimension_count {rope} is larger than the head size {head_size}")
    elif head_size and arch in EQUAL_ROPE_ARCHITECTURES and rope != head_size:
        problems.append(f"{arch}.rope.dimension_count {rope} is not the head size {head_size}, as llama.cpp requires "
                        f"for {arch}")


def _check_floats(header: GgufHeader, problems: list[str]) -> None:
    arch = header.architecture
    for name in ("attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon"):
        value = header.arch_value(name)
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            problems.append(f"{arch}.{name} is {value!r}; it must be a small positive number (like 1e-6)")
    value = header.arch_value("rope.freq_base")
    if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        problems.append(f"{arch}.rope.freq_base is {value!r}; it must be a positive number")


def _check_vocabulary(header: GgufHeader, problems: list[str]) -> None:
    model = header.fields.get("tokenizer.ggml.model")
    if model is None:
        problems.append("tokenizer.ggml.model is missing: the file has no vocabulary")
        return
    if model in ("no_vocab", "none"):
        if header.architecture not in drafter_methods():  # a drafter reads its target's vocabulary
            problems.append(f'tokenizer.ggml.model is "{model}": the file has no vocabulary to chat with')
        return
    if model not in TOKENIZER_MODELS:
        problems.append(f"tokenizer.ggml.model {model!r} is not a vocabulary type llama.cpp knows")
        return
    n_tokens = header.array_lengths.get("tokenizer.ggml.tokens")
    if not n_tokens:
        problems.append("tokenizer.ggml.tokens is missing or empty")
        return
    _check_bos(header, model, n_tokens, problems)
    if header.duplicate_token is not None:
        index, earlier, text = header.duplicate_token
        problems.append(f"tokenizer.ggml.tokens has token {index} with the same text as token {earlier} "
                        f"({text[:40]!r}); llama.cpp requires every token text to be unique")
    elif n_tokens > MAX_VOCAB_TOKENS:
        problems.append(f"tokenizer.ggml.tokens has {n_tokens:,} tokens, more than the {MAX_VOCAB_TOKENS:,} "
                        "whose texts are checked")
    embedding = header.tensor_infos.get("token_embd.weight")
    if n_tokens and embedding is not None and len(embedding.shape) == 2 and embedding.shape[1] != n_tokens:
        problems.append(f"token_embd.weight has rows for {embedding.shape[1]} tokens but the vocabulary has {n_tokens}")


def _check_bos(header: GgufHeader, model: str, n_tokens: int, problems: list[str]) -> None:
    """A vocabulary that adds BOS must have one: llama.cpp asserts on it (the process
    aborts) the first time it tokenizes. An id past the vocabulary falls back on the type's
    default, which is dropped in turn when it is past the vocabulary too."""
    default_id, default_add = DEFAULT_BOS.get(model, (None, False))
    add = header.fields.get("tokenizer.ggml.add_bos_token", default_add)
    if add is not True:
        return
    given = header.fields.get("tokenizer.ggml.bos_token_id")
    resolved = given if _is_int(given) and 0 <= given < n_tokens else default_id
    if resolved is None or not 0 <= resolved < n_tokens:
        named = f"tokenizer.ggml.bos_token_id is {given!r}" if given is not None else "no tokenizer.ggml.bos_token_id"
        problems.append(f"the vocabulary adds a BOS token but has none ({named}, {n_tokens} tokens): llama.cpp "
                        "aborts when it tokenizes")


def _check_required_tensors(header: GgufHeader, n_layer: int, problems: list[str]) -> None:
    """The tensors llama.cpp's loader requires (it refuses a file without them, but only when
    loading weights: a vocabulary-only load, as pairing makes, would pass it). Known for the
    dense llama architecture, which the demo family and most small drafts use."""
    names = header.tensor_infos
    if header.architecture != "llama" or header.arch_value("expert_count") or not n_layer \
            or not any(name.startswith("blk.") for name in names):  # a vocabulary-only file has no weights
        return
    missing = [name for name in ("token_embd.weight", "output_norm.weight") if name not in names]
    for i in range(n_layer):
        needed = ["attn_norm", "attn_output", "ffn_norm", "ffn_gate", "ffn_down", "ffn_up"]
        if f"blk.{i}.attn_qkv.weight" not in names:
            needed[1:1] = ["attn_q", "attn_k", "attn_v"]
        missing += [f"blk.{i}.{kind}.weight" for kind in needed if f"blk.{i}.{kind}.weight" not in names]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        problems.append(f"tensor{'s' if len(missing) > 1 else ''} {shown} missing: llama.cpp cannot load the model")


def _check_tensors(header: GgufHeader, problems: list[str]) -> None:
    for name, tensor in header.tensor_infos.items():
        if tensor.end > header.size:
            problems.append(f"corrupt or truncated GGUF file (an interrupted download?): tensor {name} ends at "
                            f"byte {tensor.end} but the file has {header.size} bytes; download it again")
            return


def kv_layers(header: GgufHeader) -> list[tuple[int, int, int]]:
    """(KV heads, key length, value length) of every layer, as llama.cpp reads them (per-layer
    head counts included; head dims default to embedding_length / head_count)."""
    n_layer = header.arch_value("block_count")
    if not _is_int(n_layer) or n_layer < 1:
        return []
    ignored: list[str] = []
    heads = _per_layer(header, "attention.head_count", n_layer, ignored) or [0] * n_layer
    heads_kv = _per_layer(header, "attention.head_count_kv", n_layer, ignored) or heads
    n_embd = header.arch_value("embedding_length") or 0
    layers = []
    for n_head, n_head_kv in zip(heads, heads_kv):
        default = n_embd // n_head if n_head else 0
        key = header.arch_value("attention.key_length") or default
        value = header.arch_value("attention.value_length") or default
        layers.append((n_head_kv, int(key), int(value)))
    return layers


def kv_cache_bytes(header: GgufHeader, n_ctx: int) -> int:
    """Keys and values of n_ctx positions in every attention layer, in llama.cpp's f16 cache."""
    return kv_bytes(n_ctx, kv_layers(header))


def context_problems(header: GgufHeader, n_ctx: int, available_bytes: Optional[int],
                     layers_on_device: int = 0) -> list[str]:
    """Why a context of n_ctx tokens cannot be made for this model (empty when it can). The KV
    cache of the `layers_on_device` layers offloaded to a GPU sits there (llama.cpp offloads it
    with its layers; the placement counted it), so only the rest must fit `available_bytes` of RAM."""
    if n_ctx < 0 or n_ctx > MAX_CONTEXT:
        return [f"a context of {n_ctx} tokens is out of range: use 1 to {MAX_CONTEXT} (or 0 for the model's own)"]
    need = kv_cache_bytes(header, n_ctx)
    n_layer = header.arch_value("block_count")
    if layers_on_device and _is_int(n_layer) and n_layer > 0:
        need = need * max(0, n_layer - layers_on_device) // n_layer
    if available_bytes is not None and need > available_bytes:
        return [f"a context of {n_ctx} tokens needs {need:,} bytes of KV cache but {available_bytes:,} bytes "
                "of memory are free: use a smaller --ctx"]
    return []


def gguf_problems(header: GgufHeader, n_ctx: int = 0, available_bytes: Optional[int] = None) -> list[str]:
    """Every reason this GGUF file cannot serve as a model, in one pass (empty: it can). With
    n_ctx, also whether its KV cache fits in available_bytes."""
    problems: list[str] = []
    if not header.architecture:
        problems.append("general.architecture is missing")
        return problems
    _check_tensors(header, problems)
    n_layer = _check_layers(header, problems)
    _check_required_tensors(header, n_layer, problems)
    _check_attention(header, n_layer, problems)
    _check_floats(header, problems)
    _check_vocabulary(header, problems)
    context = header.arch_value("context_length")
    if context is not None and (not _is_int(context) or not 1 <= context <= MAX_CONTEXT):
        problems.append(f"{header.architecture}.context_length is {context!r}; expected 1 to {MAX_CONTEXT}")
    if n_ctx and not problems:
        problems += context_problems(header, n_ctx, available_bytes)
    return problems


def describe_problems(path: str | os.PathLike, problems: list[str]) -> str:
    """The one-line refusal for a file with problems."""
    return f"{path}: cannot use this GGUF file: {'; '.join(problems)}"


def check_gguf(header: GgufHeader, n_ctx: int = 0, available_bytes: Optional[int] = None) -> GgufHeader:
    """The header, or a SpecDeskError listing every problem gguf_problems finds."""
    problems = gguf_problems(header, n_ctx, available_bytes)
    if problems:
        raise SpecDeskError(describe_problems(header.path, problems))
    return header


def check_context(header: GgufHeader, n_ctx: int, layers_on_device: int = 0) -> None:
    """Refuse, before llama.cpp allocates it, a context whose KV cache (its part on the CPU)
    exceeds free RAM."""
    from ..memory import ram_available

    problems = context_problems(header, n_ctx, ram_available() or None, layers_on_device)
    if problems:
        raise SpecDeskError(f"{header.path}: {problems[0]}")
