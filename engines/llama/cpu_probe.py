"""The child process of cpu_variant.probe: binding.llama_lib loads the CPU module named in
SPECDESK_LLAMA_CPU_MODULE (alone, unprobed), then a small Q4_0 model written here decodes a few tokens.
Exit status 0: the module runs on this machine."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path


def write_probe_model(path: Path) -> Path:
    """A one-layer Llama with Q4_0 matrices (the type every quantized CPU kernel covers) and a
    byte vocabulary, small enough to write in milliseconds."""
    import gguf
    import numpy as np

    d, ff, heads, n_vocab = 256, 512, 4, 259
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("specdesk-cpu-probe")
    writer.add_context_length(64)
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


def main() -> int:
    """The child: load the module named in SPECDESK_LLAMA_CPU (binding.llama_lib does) and decode."""
    from .binding import GgufContext, GgufModel

    with tempfile.TemporaryDirectory() as folder:
        model = GgufModel(write_probe_model(Path(folder) / "probe-Q4_0.gguf"))
        try:
            context = GgufContext(model, n_ctx=64, n_threads=2, n_batch=64)
            context.decode(list(range(3, 35)))
            context.close()
        finally:
            model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
