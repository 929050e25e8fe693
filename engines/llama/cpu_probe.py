"""The child process of cpu_variant.probe: llama.cpp's CPU backend from one module alone, and a
small Q4_0 model written here that decodes a few tokens through it. It imports nothing of
SpecDesk's binding, which runs the probe.

The child is a plain subprocess, not a multiprocessing one: the probe runs inside whatever
process loads llama.cpp first, and that may be a daemonic multiprocessing child (the engine
host, a training job), which multiprocessing forbids to start children of its own. A frozen
bundle has no `python -m`: its entry point (packaging/specdesk_main.py) runs `run` when its
first argument is FLAG.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

FLAG = "--specdesk-cpu-probe"  # the frozen bundle's entry point hands this argument to run()


def command(module: str) -> list[str]:
    """The command line of a child process that probes `module`, from this interpreter or bundle."""
    if getattr(sys, "frozen", False):
        return [sys.executable, FLAG, str(module)]
    return [sys.executable, "-m", "specdesk.engines.llama.cpu_probe", str(module)]


def write_probe_model(path: Path) -> Path:
    """A one-layer Llama with Q4_0 matrices (the type every quantized CPU kernel covers) and a
    byte vocabulary, small enough to write in milliseconds."""
    import gguf
    import numpy as np

    d, ff, heads, n_vocab = 256, 512, 4, 259
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("specdesk-cpu-probe")
    writer.add_context_length(512)
    writer.add_embedding_length(d)
    writer.add_block_count(1)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(d // heads)
    writer.add_vocab_size(n_vocab)
    writer.add_tokenizer_model("llama")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * n_vocab)
    writer.add_token_types([2, 3, 3] + [6] * 256)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)

    def quantized(name: str, rows: int, cols: int) -> None:
        data = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        writer.add_tensor(name, gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q4_0),
                          raw_dtype=gguf.GGMLQuantizationType.Q4_0)

    writer.add_tensor("token_embd.weight", (rng.standard_normal((n_vocab, d)) * 0.05).astype(np.float32))
    writer.add_tensor("output_norm.weight", np.ones(d, np.float32))
    quantized("output.weight", n_vocab, d)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(d, np.float32))
    writer.add_tensor("blk.0.ffn_norm.weight", np.ones(d, np.float32))
    for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
        quantized(f"blk.0.{name}.weight", d, d)
    quantized("blk.0.ffn_gate.weight", ff, d)
    quantized("blk.0.ffn_up.weight", ff, d)
    quantized("blk.0.ffn_down.weight", d, ff)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def run(module: str) -> None:
    """The child (a spawned process, so it works in a frozen bundle too): load `module` alone as
    llama.cpp's CPU backend and decode a few tokens; a module this machine cannot execute kills
    the process with a signal, any other failure raises."""
    import ctypes

    import llama_cpp

    lib = llama_cpp.llama_cpp._lib
    folder = Path(lib._name).parent
    candidates = [lib] + [ctypes.CDLL(str(folder / name)) for name in ("ggml.dll", "libggml.so.0", "libggml.dylib")
                          if (folder / name).is_file()]
    load = next(getattr(c, "ggml_backend_load") for c in candidates if hasattr(c, "ggml_backend_load"))
    load.restype, load.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
    if not load(str(module).encode()):
        raise RuntimeError(f"llama.cpp could not load {module}")
    with tempfile.TemporaryDirectory() as scratch:
        model = llama_cpp.Llama(str(write_probe_model(Path(scratch) / "probe-Q4_0.gguf")), n_ctx=64, n_batch=64,
                                n_threads=2, verbose=False)
        model.eval(list(range(3, 35)))
        model.close()


if __name__ == "__main__":
    run(sys.argv[1])
