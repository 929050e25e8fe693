"""Where a GGUF model's layers sit: a device and how many layers go there (llama.cpp's
`-dev` / `-ngl`, and `-devd` / `-ngld` for the draft).

llama.cpp counts a model's layers as its blocks plus the output layer (the input embedding
always stays on the CPU); n_gpu_layers = n puts the output layer and the last n - 1 blocks on
the device (llama-model.cpp, load_tensors). `auto` puts every layer that fits the device's
free memory with its KV cache, its compute buffer and a headroom; without an offload device
`auto` is the CPU.

The bytes a placement puts on its device come from the GGUF header alone (tensor sizes per
block), so the app can say where a model will sit before loading it (app/models/pairing.py), and the
engine uses the same numbers to choose `auto`'s layers.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Optional, Sequence, Union

from ..types import SpecDeskError

N_UBATCH = 512  # the engines' n_batch = n_ubatch (binding.GgufContext)
HEADROOM_BYTES = 256 * 1024 * 1024  # what `auto` leaves free on a device, at least ...
HEADROOM_FRACTION = 0.05  # ... or this share of the device's memory, if more
CPU = "CPU"
BACKEND_ALIASES = {"mps": "mtl", "metal": "mtl", "rocm": "hip"}  # --device names -> ggml's ("gpu": the first)

GpuLayers = Union[str, int]  # "auto" or a number of layers


def parse_gpu_layers(value: Union[str, int, None], option: str = "--gpu-layers") -> GpuLayers:
    """"auto" (or empty), "all", or a number of layers >= 0; anything else is one line."""
    if value is None:
        return "auto"
    text = str(value).strip().lower()
    if text in ("", "auto"):
        return "auto"
    if text == "all":
        return "all"
    try:
        number = int(text)
    except ValueError:
        raise SpecDeskError(f"{option} {value!r} is not a number of layers: use auto, all, 0 (CPU only) "
                            "or a number of layers") from None
    if number < 0:
        raise SpecDeskError(f"{option} {number} is out of range: use auto, all, 0 (CPU only) or a number of layers")
    return number


@dataclass(frozen=True)
class Placement:
    """What the user asked for: a device ("auto", "CPU", or a name `specdesk devices` lists)
    and GPU layers ("auto", "all" or a number)."""

    device: str = "auto"
    gpu_layers: GpuLayers = "auto"

    @classmethod
    def parse(cls, device: Optional[str], gpu_layers, option: str = "--gpu-layers") -> "Placement":
        return cls((device or "auto").strip() or "auto", parse_gpu_layers(gpu_layers, option))


# --- what a model puts where, from its header --------------------------------------------
@dataclass(frozen=True)
class ModelLayout:
    """A GGUF model's shape as placement needs it (from its header)."""

    blocks: tuple[int, ...]  # weight bytes of each block (blk.N.*)
    output_bytes: int  # the output layer's weights (output.weight, output_norm ...)
    input_bytes: int  # the token embedding: always on the CPU
    n_embd: int
    n_ff: int
    n_vocab: int
    kv_bytes_per_position: int  # keys and values of one position in every block (validate.kv_cache_bytes)

    @property
    def n_layers(self) -> int:
        """llama.cpp's layer count: the blocks and the output layer."""
        return len(self.blocks) + 1

    @property
    def weights_bytes(self) -> int:
        return sum(self.blocks) + self.output_bytes + self.input_bytes

    def kv_layer_bytes(self, n_ctx: int) -> int:
        """One block's KV cache at n_ctx positions (the blocks' mean where they differ)."""
        return n_ctx * self.kv_bytes_per_position // max(1, len(self.blocks))


_BLOCK = re.compile(r"blk\.(\d+)\.")


def model_layout(header) -> ModelLayout:
    """The layout of a model from its GgufHeader (engines/llama/header.py)."""
    n_block = int(header.arch_value("block_count") or 0)
    blocks = [0] * n_block
    output = input_ = 0
    tied = "output.weight" not in header.tensor_infos
    for name, info in header.tensor_infos.items():
        match = _BLOCK.match(name)
        if match and int(match.group(1)) < n_block:
            blocks[int(match.group(1))] += info.n_bytes
        elif name == "token_embd.weight":
            input_ += info.n_bytes
            if tied:  # llama.cpp loads a copy of the tied embedding as the output layer
                output += info.n_bytes
        elif name.startswith("output"):
            output += info.n_bytes
    from .validate import kv_cache_bytes

    n_embd = int(header.arch_value("embedding_length") or 0)
    n_ff = header.arch_value("feed_forward_length") or 0
    n_ff = int(max(n_ff) if isinstance(n_ff, (list, tuple)) else n_ff)
    n_vocab = int(header.arch_value("vocab_size") or header.array_lengths.get("tokenizer.ggml.tokens", 0))
    return ModelLayout(tuple(blocks), output, input_, n_embd, n_ff, n_vocab, kv_cache_bytes(header, 1))


def padded_context(n_ctx: int) -> int:
    """llama.cpp rounds the KV cache's size up to a multiple of 256."""
    return -(-n_ctx // 256) * 256


def device_compute_bytes(layout: ModelLayout, n_ctx: int, n_gpu_layers: int) -> int:
    """The compute buffer llama.cpp reserves on the device for one n_ubatch pass. With the output
    layer alone: the ubatch's logits and final-normed rows. With blocks too, fitted to what the
    RPC device allocated for the demo targets and the zoo's Llama-3 shape (within 2%): per row
    the logits, two feed-forward activations and two embeddings' worth of f16 residuals, plus
    the attention mask (f16, rows x context)."""
    if n_gpu_layers <= 0:
        return 0
    rows = min(N_UBATCH, n_ctx)
    if n_gpu_layers == 1:  # the output layer alone
        return rows * 4 * (layout.n_vocab + layout.n_embd)
    per_row = 4 * layout.n_vocab + 8 * layout.n_ff + 2 * layout.n_embd
    return rows * per_row + rows * padded_context(n_ctx) * 2


@dataclass(frozen=True)
class DeviceBytes:
    """What a placement puts on its device."""

    weights: int
    kv_cache: int
    compute: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.compute


def offload_bytes(layout: ModelLayout, n_ctx: int, n_gpu_layers: int) -> DeviceBytes:
    """Bytes on the device with the output layer and the last n_gpu_layers - 1 blocks there
    (KV cache offloaded with its layer, as llama.cpp does by default)."""
    n = max(0, min(n_gpu_layers, layout.n_layers))
    blocks = n - 1 if n > 0 else 0
    weights = (layout.output_bytes if n > 0 else 0) + sum(layout.blocks[len(layout.blocks) - blocks:] if blocks else ())
    kv = blocks * layout.kv_layer_bytes(padded_context(n_ctx))
    return DeviceBytes(weights, kv, device_compute_bytes(layout, n_ctx, n))


def fit_layers(layout: ModelLayout, n_ctx: int, free_bytes: int, total_bytes: int) -> int:
    """`auto`: the most layers whose weights, KV cache and compute buffer fit the device's free
    memory less a headroom."""
    budget = free_bytes - max(HEADROOM_BYTES, int(HEADROOM_FRACTION * total_bytes))
    for n in range(layout.n_layers, 0, -1):
        if offload_bytes(layout, n_ctx, n).total <= budget:
            return n
    return 0


# --- choosing the device and the layers -----------------------------------------------------
@dataclass(frozen=True)
class ResolvedPlacement:
    """Where a model sits: its device (ggml's name, "CPU" for none), how many of its layers are
    there, and the estimated bytes there."""

    device: str
    description: str
    n_gpu_layers: int
    n_layers: int
    estimated_device_bytes: int
    asked: str  # what was asked, e.g. "auto on auto"

    @property
    def on_cpu(self) -> bool:
        return self.device == CPU or self.n_gpu_layers == 0

    @property
    def layers_on_device(self) -> int:
        """Layers (and their KV cache) off the CPU."""
        return 0 if self.on_cpu else self.n_gpu_layers

    def key(self) -> str:
        """What the costs of this placement depend on (engines/speculation/costs.cost_key)."""
        where = CPU if self.on_cpu else f"{self.device}[{self.description}]"
        return f"{where}:{self.n_gpu_layers}/{self.n_layers}"

    def describe(self) -> str:
        if self.on_cpu:
            return "CPU"
        where = self.device if self.description in ("", self.device) else f"{self.device} ({self.description})"
        return f"{self.n_gpu_layers}/{self.n_layers} layers on {where}"

    def as_dict(self) -> dict:
        return asdict(self)


def find_device(name: str, devices: Sequence, option: str = "--device"):
    """The device called `name` (ggml's name or description, any case), or the first of a backend
    ("cuda", "metal" or "mps", "vulkan", "rpc"), else one line listing them."""
    wanted = name.strip().lower()
    for device in devices:
        if wanted in (device.name.lower(), device.description.lower()):
            return device
    prefixes = {wanted, BACKEND_ALIASES.get(wanted, wanted)}
    for device in devices:
        if device.kind != "cpu" and (wanted == "gpu" or any(
                device.backend.lower().startswith(p) or device.name.lower().startswith(p) for p in prefixes)):
            return device
    names = ", ".join(d.name if d.description in ("", d.name) or d.kind == "cpu" else f"{d.name} ({d.description})"
                      for d in devices)
    raise SpecDeskError(f"{option} {name!r} is not a device here: choose auto or one of {names} "
                        "(`specdesk devices` lists them; add --rpc HOST:PORT for a device another machine serves)")


def resolve(placement: Placement, header, n_ctx: int, devices: Sequence, what: str = "",
            option: str = "--device", layers_option: str = "--gpu-layers") -> ResolvedPlacement:
    """The device and the number of layers for `placement`; bad values are one line each."""
    layout = model_layout(header)
    n_layers = layout.n_layers
    label = what or str(getattr(header, "path", "the model"))
    asked = f"{placement.gpu_layers} on {placement.device}"
    layers = placement.gpu_layers
    if isinstance(layers, int) and layers > n_layers:
        raise SpecDeskError(f"{layers_option} {layers} is more than the {n_layers} layers of {label} "
                            f"({n_layers - 1} blocks and the output layer): use at most {n_layers}, or auto")
    if placement.device.lower() == "auto":
        offload = [d for d in devices if d.kind != "cpu"]
        device = offload[0] if offload else None
    elif placement.device.lower() in ("cpu", "none"):
        device = None
    else:
        device = find_device(placement.device, devices, option)
        if device.kind == "cpu":
            device = None
    if device is None:
        if isinstance(layers, int) and layers > 0 or layers == "all":
            why = (f"{option} {placement.device} keeps every layer on the CPU" if placement.device.lower() != "auto"
                   else "there is no offload device here (a CPU-only llama.cpp build, and no --rpc server)")
            raise SpecDeskError(f"{layers_option} {layers}: {why}: use auto or 0, or choose a device")
        return ResolvedPlacement(CPU, CPU, 0, n_layers, 0, asked)
    if layers == "auto":
        n = fit_layers(layout, n_ctx, device.free_bytes, device.total_bytes)
    elif layers == "all":
        n = n_layers
    else:
        n = int(layers)
    if n == 0:
        return ResolvedPlacement(CPU, CPU, 0, n_layers, 0, asked)
    return ResolvedPlacement(device.name, device.description, n, n_layers,
                             offload_bytes(layout, n_ctx, n).total, asked)


def buffer_device(buffer_name: str) -> str:
    """The device a llama.cpp buffer lives on, from its name: "RPC0[127.0.0.1:50052]" -> "RPC0",
    "CUDA0" -> "CUDA0"; host buffers ("CPU", "CPU_REPACK", "CUDA_Host") -> "CPU"."""
    if buffer_name.upper().startswith("CPU") or buffer_name.endswith("_Host"):
        return CPU
    return buffer_name.split("[", 1)[0]


def device_handle(name: str) -> int:
    """ggml's handle (ggml_backend_dev_t) of the device called `name`; 0 when there is none."""
    import ctypes

    from .binding import llama_lib

    by_name = llama_lib().llama_cpp._lib.ggml_backend_dev_by_name
    by_name.restype, by_name.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
    return by_name(name.encode()) or 0
