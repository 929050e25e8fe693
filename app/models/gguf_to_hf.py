"""A llama GGUF as a Hugging Face folder the PyTorch engine loads: the same model on both engines,
for a model that reaches us only as a GGUF (`specdesk models to-hf FILE.gguf`).

Every tensor is dequantized with gguf's quantization code (engines/llama/tensors.py), renamed to
LlamaForCausalLM's names, its Q and K rows put back in rotate-half order (llama.cpp's converter
interleaves each head's rotary pairs: export_gguf.permute_rope_rows, undone by
unpermute_rope_rows), and written as safetensors in float32, bfloat16 or float16, in shards of
at most SHARD_BYTES. config.json and generation_config.json come from the GGUF header,
tokenizer.json from its vocabulary (gguf_tokenizer.py: llama.cpp's pre-tokenizer in Hugging
Face's terms), tokenizer_config.json with its chat template, and generation_config.json with
the tokens llama.cpp ends a generation at (asked of llama.cpp itself). The folder is written beside its
final place and renamed into it when complete, so a crash or a full disk leaves no folder that
looks whole.

Only what LlamaForCausalLM holds is converted: another architecture, a tensor with no place in
it, RoPE scaling or a partial rotary dimension are refused with the file and the reason.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np

from specdesk.engines.types import SpecDeskError

DTYPES = ("float32", "bfloat16", "float16")
BYTES_PER_VALUE = {"float32": 4, "bfloat16": 2, "float16": 2}
SHARD_BYTES = 2 * 1024 ** 3  # per safetensors file: what is held in memory at once, too
# GGUF tensor -> LlamaForCausalLM's name, outside the blocks
TOP_LEVEL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
# GGUF block tensor -> the Hugging Face name inside model.layers.N (the .weight / .bias kept)
GGUF_TO_HF = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
              "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
              "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm",
              "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
LLAMA_BLOCK = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
ROPE_INTERLEAVED = ("llama",)  # architectures whose GGUF holds Q/K rows with each head's pairs interleaved

Progress = Callable[[str, float], None]


def gguf_model_config(path: Path, architecture: str):
    """The model's shape as the PyTorch engine's ModelConfig, read from the GGUF header of a
    Llama-style file (llama, qwen2, qwen3: the caller has checked the architecture); `architecture`
    is the Hugging Face class it is run as."""
    from specdesk.engines.llama.binding import validated_header
    from specdesk.engines.torch.config import ModelConfig

    header = validated_header(path)
    arch, infos = header.architecture, header.tensor_infos
    if "token_embd.weight" not in infos or "output_norm.weight" not in infos:
        raise SpecDeskError(f"{path}: the GGUF has no token_embd.weight or output_norm.weight tensor")

    def value(key: str, default=None):
        found = header.arch_value(key, default)
        if found is None:
            raise SpecDeskError(f"{path}: the GGUF header has no {arch}.{key}")
        return found[0] if isinstance(found, (list, tuple)) else found

    hidden, heads = int(value("embedding_length")), int(value("attention.head_count"))
    return ModelConfig(
        vocab_size=int(infos["token_embd.weight"].shape[1]),
        hidden_size=hidden,
        num_hidden_layers=int(value("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(value("attention.head_count_kv", heads)),
        head_dim=int(value("attention.key_length", hidden // heads)),
        intermediate_size=int(value("feed_forward_length")),
        rms_norm_eps=_short_float(value("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=_short_float(value("rope.freq_base", 10000.0)),
        max_position_embeddings=int(value("context_length", 4096)),
        tie_word_embeddings="output.weight" not in infos,
        attention_bias="blk.0.attn_q.bias" in infos,
        qk_norm="blk.0.attn_q_norm.weight" in infos,
        architecture=architecture,
    )


def _short_float(value) -> float:
    """A float32 header value as the shortest decimal that is the same float32 (1e-05, not
    9.999999747378752e-06): what llama.cpp computes with, as a config.json would say it."""
    return float(str(np.float32(value)))


def block_tensors(path: Path, index: int, heads: int, kv_heads: int) -> Iterator[tuple[str, np.ndarray]]:
    """(name inside model.layers.N, float32 array) for each tensor of GGUF block `index`, dequantized;
    a llama file's Q/K rows back in rotate-half order. A tensor with no place in a Llama-style
    layer is refused by name."""
    from specdesk.engines.llama.binding import gguf_header
    from specdesk.engines.llama.tensors import dequantized

    from ..demo.export_gguf import unpermute_rope_rows

    header = gguf_header(path)
    interleaved = header.architecture in ROPE_INTERLEAVED
    rotary_heads = {"attn_q": heads, "attn_k": kv_heads}
    prefix = f"blk.{index}."
    for name in header.tensor_infos:
        if not name.startswith(prefix):
            continue
        part, _, kind = name[len(prefix):].rpartition(".")
        if part not in GGUF_TO_HF:
            raise SpecDeskError(f"{path}: tensor {name} has no place in a Llama-style layer (known: "
                                f"{', '.join(GGUF_TO_HF)})")
        values = dequantized(path, name)
        if interleaved and part in rotary_heads:
            values = unpermute_rope_rows(values, rotary_heads[part])
        yield f"{GGUF_TO_HF[part]}.{kind}", values


def llama_config(path: Path):
    """The ModelConfig of a llama GGUF this converter can write, or a refusal naming the file and the problem."""
    from specdesk.engines.llama.binding import check_gguf_file, gguf_header, validated_header

    arch = gguf_header(check_gguf_file(path)).architecture  # a missing or non-GGUF file is refused here,
    if arch != "llama":  # then another architecture: the clearest refusal, before the header's checks
        raise SpecDeskError(f"{path}: architecture {arch!r} cannot be converted to a Hugging Face folder here: "
                            "only llama GGUFs (LlamaForCausalLM) are; run this model on llama.cpp, or get its "
                            "Hugging Face folder from the hub")
    header = validated_header(path)  # every problem llama.cpp would have with the file, by name
    config = gguf_model_config(path, "LlamaForCausalLM")
    scaling = header.arch_value("rope.scaling.type")
    if scaling not in (None, "none") or "rope_freqs.weight" in header.tensor_infos:
        what = f"rope.scaling.type {scaling!r}" if scaling not in (None, "none") else "a rope_freqs.weight tensor"
        raise SpecDeskError(f"{path}: the file scales RoPE ({what}), which this converter does not carry into "
                            "config.json; use the model's own Hugging Face folder")
    rotary = header.arch_value("rope.dimension_count", config.head_dim)
    if int(rotary) != config.head_dim:
        raise SpecDeskError(f"{path}: RoPE turns {rotary} of each head's {config.head_dim} dimensions; "
                            "LlamaForCausalLM turns them all, so this file cannot be converted")
    if config.qk_norm:
        raise SpecDeskError(f"{path}: the file has Q/K norms (attn_q_norm), which LlamaForCausalLM has not")
    unknown = [name for name in header.tensor_infos if gguf_to_hf_name(name) is None]
    if unknown:
        raise SpecDeskError(f"{path}: tensor {unknown[0]} has no place in LlamaForCausalLM"
                            + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
                            + "; only token_embd, output_norm, output and the blocks' "
                            + ", ".join(LLAMA_BLOCK) + " tensors are converted")
    return config


def gguf_to_hf_name(name: str) -> Optional[str]:
    """LlamaForCausalLM's name for a GGUF tensor, or None where it has none."""
    if name in TOP_LEVEL:
        return TOP_LEVEL[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in LLAMA_BLOCK \
            and parts[3] in ("weight", "bias"):
        return f"model.layers.{parts[1]}.{GGUF_TO_HF[parts[2]]}.{parts[3]}"
    return None


def expected_shapes(config) -> dict[str, tuple[int, ...]]:
    """LlamaForCausalLM's tensors for `config`, with their (PyTorch) shapes: what the engine loads."""
    d, ffn = config.hidden_size, config.intermediate_size
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, d),
                                          "model.norm.weight": (d,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, d)
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                       p + "self_attn.q_proj.weight": (q, d), p + "self_attn.k_proj.weight": (kv, d),
                       p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, q),
                       p + "mlp.gate_proj.weight": (ffn, d), p + "mlp.up_proj.weight": (ffn, d),
                       p + "mlp.down_proj.weight": (d, ffn)})
        if config.attention_bias:
            shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,)})
    return shapes


def hf_tensors(path: Path, config) -> Iterator[tuple[str, np.ndarray]]:
    """(LlamaForCausalLM name, float32 array) for every tensor of the GGUF, dequantized, each
    checked against the shape config.json will promise."""
    from specdesk.engines.llama.tensors import dequantized

    shapes = expected_shapes(config)
    found = set()

    def checked(name: str, values: np.ndarray) -> tuple[str, np.ndarray]:
        if name not in shapes:
            raise SpecDeskError(f"{path}: tensor {name} is not one of this model's LlamaForCausalLM tensors")
        if tuple(values.shape) != shapes[name]:
            raise SpecDeskError(f"{path}: {name} has shape {tuple(values.shape)}, the header implies "
                                f"{shapes[name]}")
        found.add(name)
        return name, values

    for gguf_name, hf_name in TOP_LEVEL.items():
        if hf_name in shapes:
            yield checked(hf_name, dequantized(path, gguf_name))
    for index in range(config.num_hidden_layers):
        for name, values in block_tensors(path, index, config.num_attention_heads, config.num_key_value_heads):
            yield checked(f"model.layers.{index}.{name}", values)
    missing = sorted(set(shapes) - found)
    if missing:
        raise SpecDeskError(f"{path}: the file lacks {missing[0]}'s tensor"
                            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))


# --- the folder ----------------------------------------------------------------------------
def _tokenizer_files(path: Path, config, model_name: str) -> tuple[dict[str, str], dict]:
    """(file name -> text) for tokenizer.json, tokenizer_config.json and generation_config.json
    from the GGUF vocabulary, and the special ids config.json holds."""
    from specdesk.engines.llama.binding import GgufModel

    from .gguf_tokenizer import BPE_PRE_TOKENIZERS, tokenizer_json, vocab_values

    fields = vocab_values(path)
    if "tokenizer.ggml.tokens" not in fields:
        raise SpecDeskError(f"{path}: the GGUF has no vocabulary (tokenizer.ggml.tokens)")
    tokens = list(fields["tokenizer.ggml.tokens"])
    if len(tokens) != config.vocab_size:
        raise SpecDeskError(f"{path}: the vocabulary has {len(tokens)} tokens, the embeddings "
                            f"{config.vocab_size} rows")

    def special(key: str) -> Optional[int]:
        found = fields.get(f"tokenizer.ggml.{key}_token_id")
        return int(found) if found is not None and 0 <= int(found) < len(tokens) else None

    bos, eos, unk, pad = special("bos"), special("eos"), special("unknown"), special("padding")
    kind, pre = fields["tokenizer.ggml.model"], str(fields.get("tokenizer.ggml.pre", ""))
    # llama.cpp's default where the file does not say: BOS for SentencePiece and Llama 3's BPE
    add_bos = bool(fields.get("tokenizer.ggml.add_bos_token",
                              kind == "llama" or BPE_PRE_TOKENIZERS.get(pre) == "llama3"))
    text = {t: tokens[i] if i is not None else None for t, i in
            (("bos_token", bos), ("eos_token", eos), ("unk_token", unk), ("pad_token", pad))}
    tokenizer_config = {
        "add_bos_token": add_bos,
        "add_eos_token": bool(fields.get("tokenizer.ggml.add_eos_token", False)),
        **{k: v for k, v in text.items() if v is not None},
        "chat_template": fields.get("tokenizer.chat_template"),
        "clean_up_tokenization_spaces": False,
        "model_max_length": config.max_position_embeddings,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    with GgufModel(path, vocab_only=True) as vocab:  # llama.cpp's own end-of-generation rules (texts, FIM tokens)
        ends = [token for token in range(len(tokens)) if vocab.is_eog(token)]
    generation = {"bos_token_id": bos, "eos_token_id": ends}
    if pad is not None:
        generation["pad_token_id"] = pad
    files = {"tokenizer.json": tokenizer_json(fields, str(path), model_name),
             "tokenizer_config.json": _json(tokenizer_config), "generation_config.json": _json(generation)}
    return files, {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad}


def _json(data: dict) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _config_json(config, ids: dict, dtype: str) -> str:
    from ..demo.export_hf import hf_config

    data = hf_config(config, ids["bos_token_id"], ids["eos_token_id"])
    data.update(attention_bias=config.attention_bias, tie_word_embeddings=config.tie_word_embeddings,
                torch_dtype=dtype)
    if ids["pad_token_id"] is not None:
        data["pad_token_id"] = ids["pad_token_id"]
    return _json(data)


def _save_shard(tensors: dict, path: Path, dtype: str) -> None:
    """One safetensors file of `tensors` in `dtype`. safetensors' writer does not report a failed
    write (a full disk, where it ends), so the file's length is checked against its tensors'."""
    _serialize(tensors, path, dtype)
    expected = sum(v.size for v in tensors.values()) * BYTES_PER_VALUE[dtype]
    written = path.stat().st_size
    if written < expected:
        raise OSError(errno.ENOSPC, f"{path.name} came out {written} bytes long, its tensors hold {expected}")


def _serialize(tensors: dict, path: Path, dtype: str) -> None:
    if dtype == "bfloat16":  # numpy has no bfloat16: PyTorch writes it
        from safetensors.torch import save_file

        from ..demo.export_hf import require_torch

        require_torch("writing bfloat16 weights")
        import torch

        save_file({n: torch.from_numpy(v).to(torch.bfloat16) for n, v in tensors.items()}, str(path),
                  metadata={"format": "pt"})
    else:
        from safetensors.numpy import save_file

        save_file(tensors, str(path), metadata={"format": "pt"})


def _write_weights(path: Path, config, folder: Path, dtype: str, shard_bytes: int, total: int,
                   progress: Progress) -> None:
    """model.safetensors, or shards and model.safetensors.index.json when they exceed shard_bytes."""
    per_value = BYTES_PER_VALUE[dtype]
    shards: list[list[str]] = []
    pending: dict[str, np.ndarray] = {}
    pending_bytes = done = 0

    def flush() -> None:
        nonlocal pending, pending_bytes
        if pending:
            _save_shard(pending, folder / f"shard-{len(shards)}.tmp", dtype)
            shards.append(list(pending))
            pending, pending_bytes = {}, 0

    for name, values in hf_tensors(path, config):
        size = values.size * per_value
        if pending and pending_bytes + size > shard_bytes:
            flush()
        pending[name] = values if dtype == "bfloat16" else np.ascontiguousarray(values, dtype=dtype)
        pending_bytes += size
        done += size
        progress(name, done / max(total, 1))
    flush()
    if len(shards) == 1:
        os.replace(folder / "shard-0.tmp", folder / "model.safetensors")
        return
    weight_map = {}
    for i, names in enumerate(shards):
        shard = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        os.replace(folder / f"shard-{i}.tmp", folder / shard)
        weight_map.update({name: shard for name in names})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(_json(index), encoding="utf-8")


def default_out_dir(gguf_path: Path) -> Path:
    """Where `specdesk models to-hf` writes without --out: a folder beside the file, named after it."""
    return Path(gguf_path).with_name(Path(gguf_path).stem + "-hf")


def convert(gguf_path: str | os.PathLike, out_dir: str | os.PathLike, dtype: str = "float32",
            progress: Optional[Progress] = None, overwrite: bool = False,
            shard_bytes: int = SHARD_BYTES) -> Path:
    """Write the llama GGUF at `gguf_path` as a LlamaForCausalLM folder at `out_dir` (config.json,
    safetensors in `dtype`, tokenizer and generation files); returns the folder. `progress` gets
    (what, fraction done). An existing `out_dir` is replaced only with `overwrite`."""
    from specdesk.engines.llama.binding import validated_header

    path, out = Path(gguf_path), Path(out_dir)
    if dtype not in DTYPES:
        raise SpecDeskError(f"dtype {dtype!r} is not one the converter writes: choose {', '.join(DTYPES)}")
    config = llama_config(path)
    if os.path.lexists(out) and not overwrite:
        raise SpecDeskError(f"{out} already exists: choose another folder, or replace it (--force)")
    say = progress or (lambda what, fraction: None)
    say("tokenizer", 0.0)
    model_name = str(validated_header(path).fields.get("general.name") or "")
    files, ids = _tokenizer_files(path, config, model_name)
    files["config.json"] = _config_json(config, ids, dtype)
    total = sum(int(np.prod(s)) for s in expected_shapes(config).values()) * BYTES_PER_VALUE[dtype]
    parent = out.absolute().parent
    _check_space(parent, total + sum(len(t.encode()) for t in files.values()), out)
    tmp = parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        _write_weights(path, config, tmp, dtype, shard_bytes, total, say)
        for weights in tmp.glob("*.safetensors"):  # safetensors leaves its files private (0600)
            shutil.copymode(tmp / "config.json", weights)
        if os.path.lexists(out):
            if out.is_dir() and not out.is_symlink():
                shutil.rmtree(out)
            else:
                out.unlink()
        os.replace(tmp, out)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise SpecDeskError(f"{out}: the disk filled up while writing ({_free_text(parent)} left); free "
                                f"space or choose another folder with --out") from e
        raise SpecDeskError(f"{out}: cannot write the folder ({e.strerror or e})") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _free_text(folder: Path) -> str:
    from .hub import human_bytes

    try:
        return human_bytes(shutil.disk_usage(folder).free)
    except OSError:
        return "unknown space"


def _check_space(parent: Path, needed: int, out: Path) -> None:
    from .hub import human_bytes

    probe = parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return  # nothing to say in advance: a full disk is still reported when writing
    if free < needed:
        raise SpecDeskError(f"{out}: the folder needs about {human_bytes(needed)}, and {probe} has "
                            f"{human_bytes(free)} free; free space or choose another folder with --out")
