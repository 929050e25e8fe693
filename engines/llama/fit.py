"""What fits llama.cpp, as pure functions of a GGUF file's metadata: the default context, the
KV cache's size, and whether a drafter made for one target fits another.

The engine asks these before llama.cpp loads anything, and the app's pairing asks them of the
library's entries (read from headers alone), so both give the same numbers and the same words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from ..methods import method_info

DEFAULT_CONTEXT = 4096  # the context a model gets unless asked: its own, at most this
KV_BYTES_PER_VALUE = 2  # llama.cpp's default f16 cache
# Target architectures whose llama.cpp graph records layer inputs (res->t_layer_inp); on
# others llama.cpp aborts when asked for them.
LAYER_INPUT_ARCHS = ("llama", "qwen3moe", "qwen3next", "gpt-oss", "lfm2")


def default_context(model_context, n_ctx: int = 0) -> int:
    """The context a model is opened with: n_ctx when given, else the model's own (its
    `context_length`), at most DEFAULT_CONTEXT."""
    return n_ctx or min(int(model_context or DEFAULT_CONTEXT), DEFAULT_CONTEXT)


def kv_bytes(n_ctx: int, layers: Iterable[tuple[int, int, int]]) -> int:
    """Keys and values of n_ctx positions in llama.cpp's f16 cache, given
    (KV heads, key length, value length) for every attention layer."""
    return n_ctx * sum(n_head_kv * (key + value) for n_head_kv, key, value in layers) * KV_BYTES_PER_VALUE


# A drafter GGUF's key for the hidden size of the target it was made for, how many target layers
# it must read (None: any number), and whether its fc layer's input width must be those layers x
# hidden, are its method's row's (engines/methods.py: gguf_width_key, gguf_target_layers,
# gguf_fc_checked).


@dataclass(frozen=True)
class DrafterShape:
    """What a drafter GGUF says of the target it was made for."""

    method: str  # dflash, eagle3: its general.architecture
    target_layers: tuple[int, ...]  # the target layers whose inputs it reads
    target_width: Optional[int]  # the target's hidden size
    fc_inputs: Optional[int] = None  # the width its fc layer takes (target layers x hidden); None: not checked


@dataclass(frozen=True)
class TargetShape:
    """What decides whether a drafter fits a target."""

    name: str  # how messages name the target
    architecture: str
    trunk_layers: int  # its blocks less the MTP (nextn) ones
    width: int  # its hidden size


def drafter_config(method: str, fields: dict, tensors: dict) -> dict:
    """A drafter GGUF's own settings, keys without the `<method>.` prefix: its scalars, the target
    layers it reads, and (`fc_inputs`) the input width of its fc layer. `tensors`: name -> shape."""
    config = {key.split(".", 1)[1]: value for key, value in fields.items()
              if key.startswith(f"{method}.") and (not isinstance(value, list) or key == f"{method}.target_layers")}
    fc = tensors.get("fc.weight")
    if fc:
        config["fc_inputs"] = int(fc[0])
    return config


def _whole(value) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def drafter_shape(method: str, config: dict) -> DrafterShape:
    """A drafter's shape from its settings (drafter_config)."""
    layers = config.get("target_layers")
    info = method_info(method)
    return DrafterShape(method, tuple(i for i in layers if _whole(i) is not None) if isinstance(layers, list) else (),
                        _whole(config.get(info.gguf_width_key)),
                        (_whole(config.get("fc_inputs")) or 0) if info.gguf_fc_checked else None)


def drafter_misfit(drafter: DrafterShape, target: TargetShape) -> Optional[str]:
    """Why this drafter cannot run on this target, or None when it fits."""
    label = method_info(drafter.method).short or drafter.method
    if target.architecture not in LAYER_INPUT_ARCHS:
        return (f"llama.cpp cannot hand out layer inputs of a {target.architecture!r} model, so {label} cannot "
                f"run on it (it can on {', '.join(LAYER_INPUT_ARCHS)})")
    layers, n_layer = list(drafter.target_layers), target.trunk_layers
    if not layers:
        return f"no {drafter.method}.target_layers: it does not say which target layers it reads"
    count = method_info(drafter.method).gguf_target_layers
    if (count is not None and len(layers) != count) or not all(0 <= i < n_layer for i in layers):
        needed = f", {count} needed" if count is not None and len(layers) != count else ""
        return (f"reads target layers {layers} but {target.name} has {n_layer} layers (0..{n_layer - 1}{needed}): "
                "it is a drafter for a different target")
    fc_expected = len(layers) * target.width
    if drafter.target_width != target.width or drafter.fc_inputs not in (None, fc_expected):
        fc = (f" (fc takes {drafter.fc_inputs} = {len(layers)} layers x hidden)"
              if drafter.fc_inputs is not None else "")
        return (f"made for a target with hidden size {drafter.target_width}{fc}, but {target.name} has hidden size "
                f"{target.width}: it is a drafter for a different target")
    return None
