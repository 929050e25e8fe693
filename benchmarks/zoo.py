"""A real-shaped model zoo without downloads: test and benchmark tooling, not a user feature.

Each family pairs a real tokenizer (llama.cpp's `models/ggml-vocab-<name>.gguf`, with every
`tokenizer.*` key) and a real chat template (`models/templates/*.jinja`) from the
llama-cpp-python source distribution (fetched with pip once, as benchmarks/native_drivers.py
does) with the real model's architecture and shapes, and random weights:

- the output head is scaled so logits spread with a standard deviation of LOGIT_STD: the gap
  between the two best tokens is then usually above 1, so batch numerics do not flip argmax;
- the target's layers are the drafts' layers plus layers whose residual contribution
  (attention output and FFN down projection) is scaled down (measured on the small qwen2
  pair, k = 4: about 0.85 and 0.65 acceptance). `draft_gguf` holds the first
  `draft_layers` layers (high acceptance: the target only adds layers scaled by ALPHA);
  `draft_low_gguf` lacks the last of those, a layer scaled by BETA (lower acceptance). So
  agreement is set by construction, not by training.

Files: the F16 target and drafts, Q8_0 / Q4_K_M versions made by llama.cpp's
llama_model_quantize, and the same pair as Hugging Face folders (config.json, model.safetensors,
tokenizer.json converted from the GGUF vocabulary, tokenizer_config.json with the template,
generation_config.json with the end-of-generation ids). `--small` builds a few narrow layers
for the test suite. Everything is cached under <cache>/zoo/, keyed by the inputs.

Usage: python -m benchmarks.zoo build --family NAME [--quant F16|Q8_0|Q4_K_M] [--small] [--out DIR]
prints {"family", "vocab_size", "target_gguf", "draft_gguf", "draft_low_gguf", "target_hf",
"draft_hf", "draft_low_hf", "template", "vocab_gguf", "hf_note"}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import zlib
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from specdesk.app.demo.export_gguf import permute_rope_rows
from specdesk.app.models import gguf_tokenizer
from specdesk.app.models.gguf_tokenizer import eog_ids, read_vocab, vocab_values
from specdesk.app.storage.paths import building, cache_dir

ZOO_VERSION = 1
LOGIT_STD = 20.0  # logits' spread: top-2 gap ~ LOGIT_STD / sqrt(2 ln V), about 4 at 150k tokens
ALPHA = 0.017  # residual scale of the target layers no draft has, all together (each: / sqrt(count))
BETA = 0.07  # residual scale of the one layer draft_gguf has and draft_low_gguf lacks
LAYER_GAIN = 40.0  # a layer's residual output in units of an embedding's rms: the stream is then
# mostly the layers' work, not the input token's embedding (which, tied to the output head,
# would otherwise make every model repeat its last token)
from specdesk.engines.llama.binding import QUANT_TYPES as QUANTS  # noqa: E402 - name -> llama_ftype


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    draft_layers: int  # layers of the high-acceptance draft; the low one has one fewer
    context: int


@dataclass(frozen=True)
class Family:
    name: str  # the vocab file's name: models/ggml-vocab-<name>.gguf
    arch: str  # GGUF architecture llama.cpp runs
    template: Optional[str]  # file in models/templates/ (None: the vocab file's own)
    real: Shape
    small: Shape
    rope_theta: float
    norm_eps: float
    tied: bool
    qkv_bias: bool = False
    logit_scale: float = 1.0  # command-r multiplies logits by this
    hf_arch: Optional[str] = None  # what the HF folder says it is; None: no HF weights
    hf_note: str = ""


def _small(heads: int = 4, kv_heads: int = 2) -> Shape:
    return Shape(hidden=256, layers=4, heads=heads, kv_heads=kv_heads, head_dim=64, ffn=512, draft_layers=2,
                 context=4096)


FAMILIES = {
    # Qwen2.5-0.5B-Instruct
    "qwen2": Family("qwen2", "qwen2", "Qwen-Qwen2.5-7B-Instruct.jinja",
                    Shape(896, 24, 14, 2, 64, 4864, 2, 32768), _small(), 1e6, 1e-6, tied=True, qkv_bias=True,
                    hf_arch="Qwen2ForCausalLM"),
    # Llama-3.2-1B-Instruct (its llama3 rope scaling left out: it changes no shape)
    "llama-bpe": Family("llama-bpe", "llama", "meta-llama-Llama-3.2-3B-Instruct.jinja",
                        Shape(2048, 16, 32, 8, 64, 8192, 2, 131072), _small(), 5e5, 1e-5, tied=True,
                        hf_arch="LlamaForCausalLM"),
    # Phi-3-mini-4k-instruct: SentencePiece vocabulary of 32,064. Phi-3's layers are Llama's
    # with q/k/v and gate/up fused, so its HF folder is written as LlamaForCausalLM (unfused).
    "phi-3": Family("phi-3", "phi3", "microsoft-Phi-3.5-mini-instruct.jinja",
                    Shape(3072, 32, 32, 32, 96, 8192, 2, 4096), _small(4, 4), 1e4, 1e-5, tied=False,
                    hf_arch="LlamaForCausalLM"),
    # Command-R (c4ai-command-r-v01): the 256,000-token vocabulary; LayerNorm, parallel blocks
    "command-r": Family("command-r", "command-r", "CohereForAI-c4ai-command-r-plus-tool_use.jinja",
                        Shape(8192, 40, 64, 64, 128, 22528, 2, 131072), _small(4, 4), 8e6, 1e-5, tied=True,
                        logit_scale=0.0625,
                        hf_note="command-r: the HF folder holds the tokenizer only (the PyTorch engine does not "
                                "run CohereForCausalLM's LayerNorm and parallel blocks)"),
    # Gemma 4's vocabulary (262,144 tokens, tokenizer model "gemma4") and chat template on
    # llama.cpp's gemma3 architecture at Gemma-3-1B's shapes: q/k norms, post-norms on both
    # branches, GELU FFN, the input embedding scaled by sqrt(hidden). No sliding-window key is
    # written, so every layer attends globally (Gemma 3 has 5 of 6 layers on a 512-token window:
    # the same compute at the benchmarks' contexts, which are shorter than the window).
    "gemma-4": Family("gemma-4", "gemma3", "google-gemma-4-31B-it.jinja",
                      Shape(1152, 26, 4, 1, 256, 6912, 2, 32768), _small(4, 1), 1e6, 1e-6, tied=True,
                      hf_note="gemma-4: the HF folder holds the tokenizer only (the PyTorch engine does not "
                              "run Gemma's post-norms, q/k norms and scaled embeddings)"),
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def vocab_models_dir() -> Path:
    """models/ of llama.cpp as llama-cpp-python vendors it (the sdist is fetched with pip once)."""
    from benchmarks.native_drivers import vendored_source

    version = metadata.version("llama-cpp-python")
    return vendored_source(cache_dir() / "llama-native" / version, version) / "models"


# --- weights -----------------------------------------------------------------------------
def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _normal(seed: int, name: str, shape: tuple[int, ...], std: float) -> np.ndarray:
    return (_rng(seed, name).standard_normal(shape, dtype=np.float32) * np.float32(std))


def layer_scale(shape: Shape, layer: int) -> float:
    if layer < shape.draft_layers - 1:
        return 1.0
    return BETA if layer == shape.draft_layers - 1 else ALPHA / np.sqrt(shape.layers - shape.draft_layers)


def hf_tensors(family: Family, shape: Shape, vocab: int, n_layers: int, seed: int) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, float32 array) for a model of the family's first `n_layers` target layers.
    Tensors are drawn from (seed, name), so a draft's layers equal the target's."""
    d, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    embed_std = LOGIT_STD / (family.logit_scale * np.sqrt(d))  # final norm output has unit rms
    yield "model.embed_tokens.weight", _normal(seed, "embed", (vocab, d), embed_std)
    gain = LAYER_GAIN * embed_std
    if not family.tied:
        yield "lm_head.weight", _normal(seed, "lm_head", (vocab, d), embed_std)
    yield "model.norm.weight", np.ones(d, np.float32)
    if family.arch == "gemma3":
        yield from _gemma_layers(shape, n_layers, seed, embed_std)
        return
    for i in range(n_layers):
        p, s = f"model.layers.{i}.", layer_scale(shape, i)
        yield p + "input_layernorm.weight", np.ones(d, np.float32)
        if family.arch != "command-r":
            yield p + "post_attention_layernorm.weight", np.ones(d, np.float32)
        for proj, rows in (("q", q), ("k", kv), ("v", kv)):
            yield p + f"self_attn.{proj}_proj.weight", _normal(seed, p + proj, (rows, d), 1 / np.sqrt(d))
            if family.qkv_bias:
                yield p + f"self_attn.{proj}_proj.bias", _normal(seed, p + proj + "b", (rows,), 0.1)
        yield p + "self_attn.o_proj.weight", _normal(seed, p + "o", (d, q), s * gain / np.sqrt(q))
        yield p + "mlp.gate_proj.weight", _normal(seed, p + "gate", (shape.ffn, d), 1 / np.sqrt(d))
        yield p + "mlp.up_proj.weight", _normal(seed, p + "up", (shape.ffn, d), 1 / np.sqrt(d))
        yield p + "mlp.down_proj.weight", _normal(seed, p + "down", (d, shape.ffn), s * gain / np.sqrt(shape.ffn))


def _gemma_layers(shape: Shape, n_layers: int, seed: int, embed_std: float) -> Iterator[tuple[str, np.ndarray]]:
    """Gemma 3's layers (HF names; norm weights as llama.cpp multiplies by them, not HF's 1 + w).
    Each branch's output is RMS-normalised by its post-norm, so the residual scale lives in the
    post-norm weights: a branch adds rms s * LAYER_GAIN * (the scaled input embedding's rms,
    embed_std * sqrt(hidden)), the llama-style families' ratio to the embedding."""
    d, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    gain = LAYER_GAIN * embed_std * np.sqrt(d)
    for i in range(n_layers):
        p, s = f"model.layers.{i}.", layer_scale(shape, i)
        yield p + "input_layernorm.weight", np.ones(d, np.float32)
        for proj, rows in (("q", q), ("k", kv), ("v", kv)):
            yield p + f"self_attn.{proj}_proj.weight", _normal(seed, p + proj, (rows, d), 1 / np.sqrt(d))
        yield p + "self_attn.q_norm.weight", np.ones(shape.head_dim, np.float32)
        yield p + "self_attn.k_norm.weight", np.ones(shape.head_dim, np.float32)
        yield p + "self_attn.o_proj.weight", _normal(seed, p + "o", (d, q), 1 / np.sqrt(q))
        yield p + "post_attention_layernorm.weight", np.full(d, s * gain, np.float32)
        yield p + "pre_feedforward_layernorm.weight", np.ones(d, np.float32)
        yield p + "mlp.gate_proj.weight", _normal(seed, p + "gate", (shape.ffn, d), 1 / np.sqrt(d))
        yield p + "mlp.up_proj.weight", _normal(seed, p + "up", (shape.ffn, d), 1 / np.sqrt(d))
        yield p + "mlp.down_proj.weight", _normal(seed, p + "down", (d, shape.ffn), 1 / np.sqrt(shape.ffn))
        yield p + "post_feedforward_layernorm.weight", np.full(d, s * gain, np.float32)


# --- GGUF --------------------------------------------------------------------------------
def _gguf_tensors(family: Family, shape: Shape, tensors: Iterator[tuple[str, np.ndarray]]) -> Iterator[tuple[str, np.ndarray]]:
    names = {"model.embed_tokens.weight": "token_embd.weight", "lm_head.weight": "output.weight",
             "model.norm.weight": "output_norm.weight", "input_layernorm.weight": "attn_norm.weight",
             "post_attention_layernorm.weight": "ffn_norm.weight", "self_attn.o_proj.weight": "attn_output.weight",
             "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
             "mlp.down_proj.weight": "ffn_down.weight"}
    if family.arch == "gemma3":
        names.update({"post_attention_layernorm.weight": "post_attention_norm.weight",
                      "pre_feedforward_layernorm.weight": "ffn_norm.weight",
                      "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
                      "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight"})
    gate: Optional[np.ndarray] = None
    for name, data in tensors:
        if name.startswith("model.layers."):
            _, _, index, rest = name.split(".", 3)
            if rest.startswith("self_attn.") and rest[10] in "qkv" and rest[11:17] == "_proj.":
                proj, kind = rest[10], rest.rsplit(".", 1)[1]
                if family.arch == "llama" and proj in "qk":
                    data = permute_rope_rows(data, shape.heads if proj == "q" else shape.kv_heads)
                yield f"blk.{index}.attn_{proj}.{kind}", data
                continue
            if family.arch == "phi3" and rest == "mlp.gate_proj.weight":
                gate = data  # phi3 fuses gate and up: ffn_up rows are [gate; up]
                continue
            if family.arch == "phi3" and rest == "mlp.up_proj.weight":
                data, gate = np.concatenate([gate, data]), None
            if family.arch == "command-r" and rest == "post_attention_layernorm.weight":
                continue
            yield f"blk.{index}.{names[rest]}", data
        else:
            yield names[name], data


def write_gguf(family: Family, shape: Shape, n_layers: int, seed: int, vocab_path: Path,
               template: Optional[str], path: Path) -> Path:
    import gguf

    fields = read_vocab(vocab_path)
    vocab = len(fields["tokenizer.ggml.tokens"][0])
    arch = family.arch
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    writer = gguf.GGUFWriter(str(tmp), arch)
    writer.add_name(f"zoo-{family.name}")
    writer.add_block_count(n_layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(family.rope_theta)
    if arch == "command-r":
        writer.add_layer_norm_eps(family.norm_eps)
        writer.add_logit_scale(family.logit_scale)
    else:
        writer.add_layer_norm_rms_eps(family.norm_eps)
    writer.add_vocab_size(vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for name, (value, main, sub) in fields.items():  # every tokenizer.* key of the real vocabulary
        if name == "tokenizer.chat_template" and template is not None:
            value = template
        writer.add_key_value(name, value, main, sub_type=sub)
    if template is not None and "tokenizer.chat_template" not in fields:
        writer.add_chat_template(template)
    for name, data in _gguf_tensors(family, shape, hf_tensors(family, shape, vocab, n_layers, seed)):
        writer.add_tensor(name, data if data.ndim == 1 else data.astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, path)
    return path


def quantize(src: Path, dst: Path, quant: str) -> Path:
    """llama.cpp's own quantizer (llama_model_quantize) on an F16 GGUF."""
    from specdesk.engines.llama.binding import quantize_gguf

    return quantize_gguf(src, dst, quant)


# --- Hugging Face folders ----------------------------------------------------------------
def tokenizer_json(family: Family, vocab_path: Path) -> str:
    """tokenizer.json for the family's GGUF vocabulary (app/models/gguf_tokenizer.py, which the
    GGUF to Hugging Face converter uses too)."""
    return gguf_tokenizer.tokenizer_json(vocab_values(vocab_path), str(vocab_path), model_name=family.name)


def write_hf(family: Family, shape: Shape, n_layers: int, seed: int, vocab_path: Path, template: Optional[str],
             folder: Path, tokenizer_text: str) -> Path:
    from safetensors.numpy import save_file

    fields = read_vocab(vocab_path)
    tokens = list(fields["tokenizer.ggml.tokens"][0])
    types = list(fields["tokenizer.ggml.token_type"][0])

    def field(name: str, default=None):
        return fields[name][0] if name in fields else default

    bos, eos = field("tokenizer.ggml.bos_token_id"), field("tokenizer.ggml.eos_token_id")
    add_bos = bool(field("tokenizer.ggml.add_bos_token", family.name != "qwen2"))
    tmp = folder.with_name(folder.name + f".tmp-{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "tokenizer.json").write_text(tokenizer_text, encoding="utf-8")
    tok_config = {"bos_token": tokens[bos] if bos is not None else None, "eos_token": tokens[eos],
                  "add_bos_token": add_bos, "chat_template": template}
    (tmp / "tokenizer_config.json").write_text(json.dumps(tok_config, ensure_ascii=False), encoding="utf-8")
    eog = eog_ids(tokens, types, eos, field("tokenizer.ggml.eot_token_id"))
    (tmp / "generation_config.json").write_text(json.dumps({"bos_token_id": bos, "eos_token_id": eog}), encoding="utf-8")
    if family.hf_arch:
        config = {"architectures": [family.hf_arch], "model_type": "qwen2" if family.hf_arch.startswith("Qwen2") else "llama",
                  "hidden_size": shape.hidden, "num_hidden_layers": n_layers, "num_attention_heads": shape.heads,
                  "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim, "intermediate_size": shape.ffn,
                  "rms_norm_eps": family.norm_eps, "rope_theta": family.rope_theta, "vocab_size": len(tokens),
                  "max_position_embeddings": shape.context, "tie_word_embeddings": family.tied,
                  "attention_bias": family.qkv_bias, "hidden_act": "silu", "bos_token_id": bos, "eos_token_id": eos,
                  "torch_dtype": "float16"}
        (tmp / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
        tensors = {name: data.astype(np.float16) for name, data in hf_tensors(family, shape, len(tokens), n_layers, seed)}
        save_file(tensors, str(tmp / "model.safetensors"))
    if folder.exists():
        import shutil
        shutil.rmtree(folder)
    os.replace(tmp, folder)
    return folder


# --- the zoo -----------------------------------------------------------------------------
def build(family_name: str, quant: str = "F16", small: bool = False, out: Optional[Path] = None,
          seed: int = 0) -> dict:
    """Build (or find cached) one family's target, drafts and HF folders; returns the paths."""
    if family_name not in FAMILIES:
        raise SystemExit(f"zoo: unknown family {family_name!r} (known: {', '.join(FAMILIES)})")
    if quant not in QUANTS:
        raise SystemExit(f"zoo: unknown quant {quant!r} (known: {', '.join(QUANTS)})")
    family = FAMILIES[family_name]
    shape = family.small if small else family.real
    models = vocab_models_dir()
    vocab_path = models / f"ggml-vocab-{family.name}.gguf"
    template_path = models / "templates" / family.template if family.template else None
    template = template_path.read_text(encoding="utf-8") if template_path else None
    key_data = json.dumps({"v": ZOO_VERSION, "family": asdict(family), "shape": asdict(shape), "seed": seed,
                           "alpha": ALPHA, "beta": BETA, "logit_std": LOGIT_STD,
                           "llama_cpp": metadata.version("llama-cpp-python"),
                           "template": hashlib.sha256((template or "").encode()).hexdigest()}, sort_keys=True)
    key = hashlib.sha256(key_data.encode()).hexdigest()[:12]
    root = Path(out) if out else cache_dir() / "zoo" / f"{family.name}-{'small' if small else 'real'}-{key}"
    with building(root):  # another process building the same family waits, then reads its record
        return _build(family, shape, quant, small, seed, root, vocab_path, template_path, template)


def _build(family: Family, shape: Shape, quant: str, small: bool, seed: int, root: Path, vocab_path: Path,
           template_path: Optional[Path], template: Optional[str]) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    record = root / f"zoo-{quant}.json"  # the paths of a finished build: a cache hit reads no vocabulary
    if record.is_file():
        paths = json.loads(record.read_text(encoding="utf-8"))
        if all(Path(paths[f"{role}_{kind}"]).exists() for role in ("target", "draft", "draft_low")
               for kind in ("gguf", "hf")):
            return paths
    layers = {"target": shape.layers, "draft": shape.draft_layers, "draft_low": shape.draft_layers - 1}
    paths: dict = {"family": family.name, "quant": quant, "small": small}
    for role, n_layers in layers.items():
        f16 = root / f"{role}-F16.gguf"
        if not f16.is_file():
            log(f"zoo: writing {f16}")
            write_gguf(family, shape, n_layers, seed, vocab_path, template, f16)
        path = f16
        if quant != "F16":
            path = root / f"{role}-{quant}.gguf"
            if not path.is_file():
                log(f"zoo: quantizing {path.name}")
                quantize(f16, path, quant)
        paths[f"{role}_gguf"] = str(path)
    tokenizer_text = None
    for role, n_layers in layers.items():
        folder = root / f"{role}-hf"
        if not (folder / "tokenizer.json").is_file():
            log(f"zoo: writing {folder}")
            tokenizer_text = tokenizer_text or tokenizer_json(family, vocab_path)
            write_hf(family, shape, n_layers, seed, vocab_path, template, folder, tokenizer_text)
        paths[f"{role}_hf"] = str(folder)
    vocab = len(read_vocab(vocab_path)["tokenizer.ggml.tokens"][0])
    paths.update(vocab_size=vocab,
                 template=str(template_path) if template_path else None, vocab_gguf=str(vocab_path),
                 hf_note=family.hf_note, params=param_count(family, shape, vocab))
    record.write_text(json.dumps(paths), encoding="utf-8")
    return paths


def param_count(family: Family, shape: Shape, vocab: int) -> int:
    """The target's weights: layers' matrices plus the embedding (and an untied output head)."""
    d, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    per_layer = d * (q + 2 * kv) + q * d + 3 * d * shape.ffn
    return per_layer * shape.layers + vocab * d * (1 if family.tied else 2)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.zoo", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build one family (cached) and print its paths as JSON")
    b.add_argument("--family", required=True, choices=sorted(FAMILIES))
    b.add_argument("--quant", default="F16", choices=list(QUANTS))
    b.add_argument("--small", action="store_true", help="a few narrow layers, for the test suite")
    b.add_argument("--out", type=Path, help="write here instead of the cache")
    args = parser.parse_args(argv)
    print(json.dumps(build(args.family, args.quant, args.small, args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
