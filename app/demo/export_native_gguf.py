"""GGUF files for llama.cpp's native drafters: an MTP-carrying target and a DFlash drafter.

MTP. llama.cpp's `llama` architecture has no NextN layers, so the demo target is written a
second time as `glm4moe`, an architecture whose loader and MTP graph take them (vendor
src/models/glm4-moe.cpp, conversion/glm.py). With every trunk layer dense
(leading_dense_block_count = num_hidden_layers), no Q/K norm, full rotary dimension and
NeoX RoPE on HF-ordered Q/K rows, a glm4moe trunk computes exactly the LlamaForCausalLM the
demo target is: the same weights, the same function. The NextN block needs a mixture of
experts; one routed expert plus one shared expert whose halves of the intermediate units
sum to the block's dense MLP is that MLP exactly (the one routed weight normalises to 1).
The NextN block computes h = eh_proj([enorm(emb(x_{p+1})), hnorm(h_p)]) -> decoder block ->
shared_head_norm -> lm head, where h_p is the target's final-normed hidden state.

DFlash. A z-lab DFlashDraftModel folder becomes a `dflash` GGUF as conversion/qwen.py's
DFlashModel writes it: Qwen3 layers (NeoX RoPE, Q/K norm), fc, enc.output_norm (the
hidden_norm), output_norm, `dflash.target_layers` = target_layer_ids + 1 (llama.cpp reads
the *input* of those layers, z-lab the output of the layer before), the target's vocabulary
and mask token; the token embeddings and lm head are the target's, shared at run time.

Without trained weights (no MTP tensors in the checkpoint, no DFlash folder) both are
initialised from a fixed seed: losslessness holds for any drafter weights, so tests can run
before a trained drafter exists; the benchmark should use trained ones.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Mapping, Optional

import gguf
import numpy as np
from safetensors.numpy import load_file

from specdesk.app.storage.paths import building
from specdesk.engines.types import SpecDeskError

from .export_hf import atomic_path

NATIVE_EXPORT_VERSION = 1
MTP_ARCH = "glm4moe"
DFLASH_ARCH = "dflash"
DEFAULT_BLOCK_SIZE = 8


# --- shared pieces -----------------------------------------------------------------------
def _copy_vocab(writer: gguf.GGUFWriter, target_gguf: Path, mask_token_id: Optional[int] = None) -> None:
    """The target GGUF's tokenizer fields, verbatim: drafter and target share one vocabulary."""
    reader = gguf.GGUFReader(str(target_gguf))
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        main_type = field.types[0]
        sub_type = field.types[-1] if main_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), main_type, sub_type=sub_type)
    if mask_token_id is not None:
        writer.add_mask_token_id(mask_token_id)


def _read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise SpecDeskError(f"{folder}: no config.json, so this is not a Hugging Face model folder")
    return json.loads(path.read_text(encoding="utf-8"))


def _weights(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of the folder: model.safetensors and any further shards (an MTP layer may
    live in its own shard, named by model.safetensors.index.json)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    weights: dict[str, np.ndarray] = {}
    for shard in shards:
        if not (folder / shard).is_file():
            raise SpecDeskError(f"{folder}: no {shard}")
        weights.update(load_file(str(folder / shard)))
    return weights


def _add(writer: gguf.GGUFWriter, name: str, data: np.ndarray) -> None:
    # 1-D tensors (norms, biases) stay F32 as llama.cpp's kernels expect; matrices are F16.
    dtype = np.float32 if data.ndim <= 1 or name.endswith("ffn_gate_inp.weight") else np.float16
    writer.add_tensor(name, np.ascontiguousarray(np.asarray(data, dtype=np.float32).astype(dtype)))


def _finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _rng(seed: int, *parts: str) -> np.random.Generator:
    digest = hashlib.sha256(("/".join(parts) + f"/{seed}").encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


# --- MTP ---------------------------------------------------------------------------------
BLOCK_SUFFIXES = (
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)


def find_mtp_layer(weights: Mapping[str, np.ndarray], n_layer: int) -> Optional[dict[str, np.ndarray]]:
    """The first MTP layer in an HF state dict, in DeepSeek-V3 names (eh_proj/enorm/hnorm/shared_head
    at model.layers.{n_layer}) or MiMo names (model.mtp_layers.0: input_proj/token_layernorm/
    hidden_layernorm/final_layernorm), as {eh_proj, enorm, hnorm, head_norm?, head?, block...}; None
    when the checkpoint has none."""
    deepseek = f"model.layers.{n_layer}."
    mimo = "model.mtp_layers.0."
    if deepseek + "eh_proj.weight" in weights:
        p = deepseek
        out = {"eh_proj": weights[p + "eh_proj.weight"], "enorm": weights[p + "enorm.weight"],
               "hnorm": weights[p + "hnorm.weight"]}
        if p + "shared_head.norm.weight" in weights:
            out["head_norm"] = weights[p + "shared_head.norm.weight"]
        if p + "shared_head.head.weight" in weights:
            out["head"] = weights[p + "shared_head.head.weight"]
    elif mimo + "input_proj.weight" in weights:
        p = mimo
        proj = weights[p + "input_proj.weight"]  # MiMo concatenates [hidden, token]; llama.cpp [token, hidden]
        half = proj.shape[1] // 2
        out = {"eh_proj": np.concatenate([proj[:, half:], proj[:, :half]], axis=1),
               "enorm": weights[p + "token_layernorm.weight"], "hnorm": weights[p + "hidden_layernorm.weight"]}
        if p + "final_layernorm.weight" in weights:
            out["head_norm"] = weights[p + "final_layernorm.weight"]
    else:
        return None
    for suffix in BLOCK_SUFFIXES:
        if p + suffix not in weights:
            raise SpecDeskError(f"the MTP layer at {p}* has no {suffix}: it is not a full decoder block")
        out[suffix] = weights[p + suffix]
    return out


def initial_mtp_layer(weights: Mapping[str, np.ndarray], config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """A deterministic MTP layer for plumbing tests: the target's last decoder block, fed
    eh_proj([e, h]) = e + h plus a small fixed perturbation."""
    d = config["hidden_size"]
    last = f"model.layers.{config['num_hidden_layers'] - 1}."
    eye = np.eye(d, dtype=np.float32)
    noise = _rng(seed, "mtp", "eh_proj").standard_normal((d, 2 * d)).astype(np.float32) * (0.02 / np.sqrt(d))
    out = {"eh_proj": np.concatenate([eye, eye], axis=1) + noise,
           "enorm": np.ones(d, np.float32), "hnorm": np.ones(d, np.float32)}
    for suffix in BLOCK_SUFFIXES:
        out[suffix] = np.asarray(weights[last + suffix], dtype=np.float32)
    return out


def export_mtp_target(target_hf: Path, target_gguf: Path, out_path: Path, seed: int = 0) -> Path:
    """The HF target (with its MTP layer, or a seeded one) as a glm4moe GGUF with one NextN layer."""
    target_hf, target_gguf = Path(target_hf), Path(target_gguf)
    config = _read_config(target_hf)
    weights = _weights(target_hf)
    n_layer, d = config["num_hidden_layers"], config["hidden_size"]
    n_head = config["num_attention_heads"]
    n_head_kv = config.get("num_key_value_heads", n_head)
    head_dim = config.get("head_dim") or d // n_head
    ffn = config["intermediate_size"]
    mtp = find_mtp_layer(weights, n_layer)
    trained = mtp is not None
    if mtp is None:
        mtp = initial_mtp_layer(weights, config, seed)
    ffn_exp = (ffn + 1) // 2

    with atomic_path(Path(out_path)) as tmp:
        writer = gguf.GGUFWriter(tmp, MTP_ARCH)
        writer.add_type(gguf.GGUFType.MODEL)
        writer.add_name("specdesk-demo-target-mtp" if trained else "specdesk-demo-target-mtp-init")
        writer.add_block_count(n_layer + 1)
        writer.add_nextn_predict_layers(1)
        writer.add_context_length(config.get("max_position_embeddings", 2048))
        writer.add_embedding_length(d)
        writer.add_feed_forward_length(ffn)
        writer.add_head_count(n_head)
        writer.add_head_count_kv(n_head_kv)
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_rope_dimension_count(head_dim)
        writer.add_rope_freq_base(config.get("rope_theta", 10000.0))
        writer.add_layer_norm_rms_eps(config.get("rms_norm_eps", 1e-5))
        writer.add_leading_dense_block_count(n_layer)
        writer.add_expert_count(1)
        writer.add_expert_used_count(1)
        writer.add_expert_shared_count(1)
        writer.add_expert_feed_forward_length(ffn_exp)
        writer.add_expert_weights_scale(1.0)
        writer.add_expert_weights_norm(True)
        writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        writer.add_vocab_size(config["vocab_size"])
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        _copy_vocab(writer, target_gguf)

        _add(writer, "token_embd.weight", weights["model.embed_tokens.weight"])
        _add(writer, "output_norm.weight", weights["model.norm.weight"])
        _add(writer, "output.weight", weights.get("lm_head.weight", weights["model.embed_tokens.weight"]))
        for i in range(n_layer):
            p = f"model.layers.{i}."
            _write_block(writer, i, {s: weights[p + s] for s in BLOCK_SUFFIXES}, dense=True)
        _write_block(writer, n_layer, mtp, dense=False, ffn_exp=ffn_exp)
        _add(writer, f"blk.{n_layer}.nextn.eh_proj.weight", mtp["eh_proj"])
        _add(writer, f"blk.{n_layer}.nextn.enorm.weight", mtp["enorm"])
        _add(writer, f"blk.{n_layer}.nextn.hnorm.weight", mtp["hnorm"])
        if "head_norm" in mtp:
            _add(writer, f"blk.{n_layer}.nextn.shared_head_norm.weight", mtp["head_norm"])
        if "head" in mtp:
            _add(writer, f"blk.{n_layer}.nextn.shared_head_head.weight", mtp["head"])
        _finish(writer)
    return Path(out_path)


def _write_block(writer: gguf.GGUFWriter, i: int, block: Mapping[str, np.ndarray], dense: bool,
                 ffn_exp: int = 0) -> None:
    """One decoder block; Q/K rows stay in HF order (glm4moe uses NeoX RoPE)."""
    b = f"blk.{i}."
    _add(writer, b + "attn_norm.weight", block["input_layernorm.weight"])
    _add(writer, b + "attn_q.weight", block["self_attn.q_proj.weight"])
    _add(writer, b + "attn_k.weight", block["self_attn.k_proj.weight"])
    _add(writer, b + "attn_v.weight", block["self_attn.v_proj.weight"])
    _add(writer, b + "attn_output.weight", block["self_attn.o_proj.weight"])
    _add(writer, b + "post_attention_norm.weight", block["post_attention_layernorm.weight"])
    gate, up, down = (np.asarray(block[f"mlp.{n}_proj.weight"], np.float32) for n in ("gate", "up", "down"))
    if dense:
        _add(writer, b + "ffn_gate.weight", gate)
        _add(writer, b + "ffn_up.weight", up)
        _add(writer, b + "ffn_down.weight", down)
        return
    # SwiGLU is a sum over intermediate units, so splitting them between the routed and the
    # shared expert (zero-padding an odd count) keeps the MLP exact.
    pad = 2 * ffn_exp - gate.shape[0]
    if pad:
        gate = np.concatenate([gate, np.zeros((pad, gate.shape[1]), np.float32)])
        up = np.concatenate([up, np.zeros((pad, up.shape[1]), np.float32)])
        down = np.concatenate([down, np.zeros((down.shape[0], pad), np.float32)], axis=1)
    d = gate.shape[1]
    _add(writer, b + "ffn_gate_inp.weight", np.zeros((1, d), np.float32))
    _add(writer, b + "exp_probs_b.bias", np.zeros(1, np.float32))
    _add(writer, b + "ffn_gate_exps.weight", gate[None, :ffn_exp])
    _add(writer, b + "ffn_up_exps.weight", up[None, :ffn_exp])
    _add(writer, b + "ffn_down_exps.weight", down[None, :, :ffn_exp])
    _add(writer, b + "ffn_gate_shexp.weight", gate[ffn_exp:])
    _add(writer, b + "ffn_up_shexp.weight", up[ffn_exp:])
    _add(writer, b + "ffn_down_shexp.weight", down[:, ffn_exp:])


# --- DFlash ------------------------------------------------------------------------------
def _common_token(target_hf: Path) -> int:
    """The most frequent token of the sample code prompts under the target's tokenizer."""
    from collections import Counter

    from tokenizers import Tokenizer

    from ..storage.paths import assets_dir

    tokenizer = Tokenizer.from_file(str(target_hf / "tokenizer.json"))
    counts: Counter = Counter()
    for line in (assets_dir() / "prompts" / "code.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            counts.update(tokenizer.encode(json.loads(line)["prompt"], add_special_tokens=False).ids)
    return counts.most_common(1)[0][0]


def initial_dflash_folder(target_hf: Path, seed: int = 0, block_size: int = DEFAULT_BLOCK_SIZE,
                          n_layers: int = 1) -> tuple[dict, dict[str, np.ndarray]]:
    """(config, weights) of a seeded z-lab-format drafter for the target in `target_hf`: one
    Qwen3 layer the target's width, reading the outputs of the target's first and
    second-to-last layers.

    Untrained, it still drafts something the target often says: it carries its own copy of
    the target's embeddings and head, with the mask token's embedding set (least squares) so
    that the head maps it to the sample prompts' most frequent token, and the layer's
    attention and MLP outputs scaled down so that the mask rows stay near that embedding."""
    target_hf = Path(target_hf)
    target_config = _read_config(target_hf)
    target = _weights(target_hf)
    d = target_config["hidden_size"]
    n_head = target_config["num_attention_heads"]
    head_dim = target_config.get("head_dim") or d // n_head
    n_target = target_config["num_hidden_layers"]
    vocab = target_config["vocab_size"]
    layer_ids = sorted({0, max(0, n_target - 2)})
    ffn = target_config["intermediate_size"]
    mask_id = vocab - 1
    config = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": d,
        "num_hidden_layers": n_layers, "num_attention_heads": n_head, "num_key_value_heads": n_head,
        "head_dim": head_dim, "intermediate_size": ffn, "rms_norm_eps": target_config.get("rms_norm_eps", 1e-5),
        "rope_theta": target_config.get("rope_theta", 10000.0), "vocab_size": vocab,
        "max_position_embeddings": target_config.get("max_position_embeddings", 2048),
        "num_target_layers": n_target, "block_size": block_size,
        "dflash_config": {"mask_token_id": mask_id, "target_layer_ids": layer_ids},
    }
    rng = _rng(seed, "dflash")
    inner = n_head * head_dim

    def mat(rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * (scale / np.sqrt(cols))).astype(np.float32)

    head = np.asarray(target.get("lm_head.weight", target["model.embed_tokens.weight"]), np.float32)
    embed = np.asarray(target["model.embed_tokens.weight"], np.float32).copy()
    common = _common_token(target_hf)
    goal = np.full(vocab, -1.0, np.float32)
    goal[common] = 8.0
    mask_vector = np.linalg.lstsq(head, goal, rcond=None)[0].astype(np.float32)
    mask_vector /= np.sqrt(np.mean(mask_vector ** 2))
    if int(np.argmax(head @ mask_vector)) != common:  # pragma: no cover - depends on the weights
        raise SpecDeskError("could not place the seeded DFlash drafter's mask embedding")
    embed[mask_id] = mask_vector

    weights = {"fc.weight": mat(d, len(layer_ids) * d), "hidden_norm.weight": np.ones(d, np.float32),
               "norm.weight": np.ones(d, np.float32), "embed_tokens.weight": embed, "lm_head.weight": head}
    for i in range(n_layers):
        p = f"layers.{i}."
        weights.update({
            p + "input_layernorm.weight": np.ones(d, np.float32),
            p + "post_attention_layernorm.weight": np.ones(d, np.float32),
            p + "self_attn.q_proj.weight": mat(inner, d), p + "self_attn.k_proj.weight": mat(inner, d),
            p + "self_attn.v_proj.weight": mat(inner, d), p + "self_attn.o_proj.weight": mat(d, inner, 0.1),
            p + "self_attn.q_norm.weight": np.ones(head_dim, np.float32),
            p + "self_attn.k_norm.weight": np.ones(head_dim, np.float32),
            p + "mlp.gate_proj.weight": mat(ffn, d), p + "mlp.up_proj.weight": mat(ffn, d),
            p + "mlp.down_proj.weight": mat(d, ffn, 0.1),
        })
    return config, weights


def export_dflash(config: dict, weights: Mapping[str, np.ndarray], target_gguf: Path, out_path: Path,
                  name: str = "specdesk-demo-dflash") -> Path:
    """A z-lab DFlashDraftModel (config.json + state dict) as a dflash GGUF for `target_gguf`."""
    dflash = config.get("dflash_config", {})
    layer_ids = dflash.get("target_layer_ids", config.get("target_layer_ids"))
    mask_id = dflash.get("mask_token_id", config.get("mask_token_id"))
    if not layer_ids or mask_id is None:
        raise SpecDeskError("the DFlash config has no dflash_config.target_layer_ids or mask_token_id")
    block_size = int(dflash.get("block_size", config.get("block_size", 16)))
    d, n_head = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or d // n_head
    weights = {re.sub(r"^model\.", "", k): v for k, v in weights.items()}
    n_layers = config["num_hidden_layers"]

    with atomic_path(Path(out_path)) as tmp:
        writer = gguf.GGUFWriter(tmp, DFLASH_ARCH)
        writer.add_type(gguf.GGUFType.MODEL)
        writer.add_name(name)
        writer.add_block_count(n_layers)
        writer.add_context_length(config.get("max_position_embeddings", 2048))
        writer.add_embedding_length(d)
        writer.add_feed_forward_length(config["intermediate_size"])
        writer.add_head_count(n_head)
        writer.add_head_count_kv(config.get("num_key_value_heads", n_head))
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_rope_dimension_count(head_dim)
        writer.add_rope_freq_base(config.get("rope_theta", 10000.0))
        writer.add_layer_norm_rms_eps(config.get("rms_norm_eps", 1e-6))
        writer.add_uint32(f"{DFLASH_ARCH}.block_size", block_size)
        writer.add_array(f"{DFLASH_ARCH}.target_layers", [int(i) + 1 for i in layer_ids])
        writer.add_bool(f"{DFLASH_ARCH}.attention.causal", bool(dflash.get("causal", config.get("is_causal", False))))
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        writer.add_vocab_size(config["vocab_size"])
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        _copy_vocab(writer, Path(target_gguf), mask_token_id=int(mask_id))

        _add(writer, "fc.weight", weights["fc.weight"])
        _add(writer, "enc.output_norm.weight", weights["hidden_norm.weight"])
        _add(writer, "output_norm.weight", weights["norm.weight"])
        if "embed_tokens.weight" in weights:  # a drafter with its own embeddings carries its own head too
            _add(writer, "token_embd.weight", weights["embed_tokens.weight"])
            _add(writer, "output.weight", weights["lm_head.weight"])
        names = {
            "input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
            "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
            "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_norm.weight": "attn_q_norm.weight",
            "self_attn.k_norm.weight": "attn_k_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
            "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
            "mlp.down_proj.weight": "ffn_down.weight",
        }
        for i in range(n_layers):
            for hf, native in names.items():
                key = f"layers.{i}.{hf}"
                if key not in weights:
                    raise SpecDeskError(f"the DFlash checkpoint has no tensor {key}")
                _add(writer, f"blk.{i}.{native}", weights[key])
        _finish(writer)
    return Path(out_path)


def export_dflash_folder(folder: Path, target_gguf: Path, out_path: Path) -> Path:
    folder = Path(folder)
    return export_dflash(_read_config(folder), _weights(folder), target_gguf, out_path,
                         name=f"{folder.name}-dflash")


# --- the demo family's native files ------------------------------------------------------
def _digest(paths: list[Path], extra: str) -> str:
    h = hashlib.sha256(f"{NATIVE_EXPORT_VERSION}:{extra}".encode())
    for path in paths:
        files = sorted(p for p in Path(path).rglob("*") if p.is_file()) if Path(path).is_dir() else [Path(path)]
        for f in files:
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{int(st.st_mtime)}".encode())
    return h.hexdigest()[:16]


def build_native(family: Mapping[str, str], out_dir: Optional[Path] = None, seed: int = 0) -> dict[str, str]:
    """mtp_gguf, dflash_gguf and eagle3_gguf for a demo family (roles from build_family), cached under
    out_dir/<fingerprint of the inputs>. The DFlash drafter is the family's `dflash_hf`
    folder when it has one, else a seeded one."""
    target_hf, target_gguf = Path(family["target_hf"]), Path(family["target_gguf"])
    dflash_hf = Path(family["dflash_hf"]) if family.get("dflash_hf") else None
    inputs = [target_hf, target_gguf] + ([dflash_hf] if dflash_hf else [])
    key = _digest(inputs, f"seed={seed}")
    out_dir = (Path(out_dir) if out_dir is not None else target_gguf.parent / "native") / key
    mtp_path = out_dir / "specdesk-demo-target-mtp-F16.gguf"
    dflash_path = out_dir / "specdesk-demo-dflash-F16.gguf"
    with building(out_dir):
        if not mtp_path.is_file():
            export_mtp_target(target_hf, target_gguf, mtp_path, seed)
        unusable = dflash_problem(dflash_hf, target_hf) if dflash_hf is not None else "the family has no DFlash drafter"
        if not dflash_path.is_file():
            if not unusable:
                export_dflash_folder(dflash_hf, target_gguf, dflash_path)
            else:
                config, weights = initial_dflash_folder(target_hf, seed)
                export_dflash(config, weights, target_gguf, dflash_path, name="specdesk-demo-dflash-init")
        eagle3_path = out_dir / "specdesk-demo-eagle3-F16.gguf"
        if not eagle3_path.is_file():
            export_eagle3_seeded(target_hf, target_gguf, eagle3_path, seed)
    return {"mtp_gguf": str(mtp_path.resolve()), "dflash_gguf": str(dflash_path.resolve()),
            "eagle3_gguf": str(eagle3_path.resolve()),
            "mtp_source": "trained" if _has_mtp(target_hf) else "seeded (the checkpoint has no MTP layer)",
            "dflash_source": "trained" if not unusable else f"seeded ({unusable})",
            "eagle3_source": "seeded (the demo family has no trained EAGLE-3 head)"}


def _has_mtp(target_hf: Path) -> bool:
    config = _read_config(target_hf)
    return find_mtp_layer(_weights(target_hf), config["num_hidden_layers"]) is not None


def dflash_problem(dflash_hf: Path, target_hf: Path) -> str:
    """Why llama.cpp cannot run this z-lab drafter on this target, or '' when it can.

    llama.cpp hands out the *inputs* of the target's layers, so the output of the last layer
    (target_layer_ids = num_hidden_layers - 1) is out of its reach."""
    config, target = _read_config(dflash_hf), _read_config(target_hf)
    ids = config.get("dflash_config", {}).get("target_layer_ids", config.get("target_layer_ids", []))
    n_layer = target["num_hidden_layers"]
    if any(int(i) + 1 >= n_layer for i in ids):
        return (f"the trained drafter reads layer outputs {list(ids)} of a {n_layer}-layer target; llama.cpp "
                f"can hand out layers 0..{n_layer - 2} only")
    return ""


if __name__ == "__main__":
    import argparse
    import sys

    parser = argparse.ArgumentParser(description="Export the demo family's MTP target and DFlash drafter as GGUF")
    parser.add_argument("--small", action="store_true", help="use the small test family")
    parser.add_argument("--out", type=Path, help="output folder")
    args = parser.parse_args()
    from .install import build_family

    try:
        print(json.dumps(build_native(build_family(small=args.small), args.out), indent=2))
    except SpecDeskError as e:
        sys.exit(f"error: {e}")


# --- EAGLE-3 -----------------------------------------------------------------------------
def export_eagle3_seeded(target_hf: Path, target_gguf: Path, out_path: Path, seed: int = 0) -> Path:
    """A seeded eagle3 GGUF for the target in `target_hf` (no trained EAGLE-3 head exists for
    the demo family): one decoder layer the target's width reading the inputs of layers
    (2, L//2, L-3) clamped to the target (vLLM's default), its fc passing the deepest of them,
    attention and MLP outputs scaled down, and the target's final norm, so that it drafts
    the target's logit-lens guess; embeddings and lm head are the target's, shared at run time."""
    target_hf = Path(target_hf)
    config = _read_config(target_hf)
    weights = _weights(target_hf)
    d, n_head = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or d // n_head
    n_layer, ffn = config["num_hidden_layers"], config["intermediate_size"]
    layer_ids = sorted([min(2, n_layer - 1), n_layer // 2, max(0, n_layer - 3)])
    inner = n_head * head_dim
    rng = _rng(seed, "eagle3")

    def mat(rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * (scale / np.sqrt(cols))).astype(np.float32)

    fc = np.zeros((d, 3 * d), np.float32)
    fc[:, 2 * d:] = np.eye(d, dtype=np.float32)
    b = "blk.0."
    tensors = {
        "fc.weight": fc,
        "output_norm.weight": weights["model.norm.weight"],
        b + "attn_norm.weight": np.ones(d, np.float32),
        b + "attn_norm_2.weight": np.ones(d, np.float32),
        b + "attn_q.weight": mat(inner, 2 * d),
        b + "attn_k.weight": mat(inner, 2 * d),
        b + "attn_v.weight": mat(inner, 2 * d),
        b + "attn_output.weight": mat(d, inner, 0.05),
        b + "ffn_norm.weight": np.ones(d, np.float32),
        b + "ffn_gate.weight": mat(ffn, d),
        b + "ffn_up.weight": mat(ffn, d),
        b + "ffn_down.weight": mat(d, ffn, 0.05),
    }
    shape = {"hidden_size": d, "num_attention_heads": n_head, "num_key_value_heads": n_head, "head_dim": head_dim,
             "intermediate_size": ffn, "max_position_embeddings": config.get("max_position_embeddings", 2048),
             "rope_theta": config.get("rope_theta", 10000.0), "rms_norm_eps": config.get("rms_norm_eps", 1e-5),
             "vocab_size": config["vocab_size"]}
    return _write_eagle3(shape, layer_ids, tensors, Path(target_gguf), Path(out_path), "specdesk-demo-eagle3-init")


# HF EAGLE-3 tensor names (engines/torch/eagle3.py) -> the eagle3 GGUF's (conversion/llama.py's mapping)
EAGLE3_TENSORS = {
    "fc.weight": "fc.weight",
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "midlayer.input_layernorm.weight": "blk.0.attn_norm.weight",
    "midlayer.hidden_norm.weight": "blk.0.attn_norm_2.weight",
    "midlayer.self_attn.q_proj.weight": "blk.0.attn_q.weight",
    "midlayer.self_attn.k_proj.weight": "blk.0.attn_k.weight",
    "midlayer.self_attn.v_proj.weight": "blk.0.attn_v.weight",
    "midlayer.self_attn.o_proj.weight": "blk.0.attn_output.weight",
    "midlayer.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
    "midlayer.mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
    "midlayer.mlp.up_proj.weight": "blk.0.ffn_up.weight",
    "midlayer.mlp.down_proj.weight": "blk.0.ffn_down.weight",
}


def export_eagle3_folder(folder: Path, target_gguf: Path, out_path: Path) -> Path:
    """An EAGLE-3 folder with the full target vocabulary (no d2t) and its own lm_head, as an
    eagle3 GGUF for `target_gguf`; q/k rows go to llama.cpp's interleaved RoPE order."""
    from .export_gguf import permute_rope_rows

    folder = Path(folder)
    config = _read_config(folder)
    if config.get("draft_vocab_size", config["vocab_size"]) != config["vocab_size"]:
        raise SpecDeskError(f"{folder}: a draft vocabulary smaller than the target's (d2t) is not exported here")
    layer_ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if not layer_ids or len(layer_ids) != 3:
        raise SpecDeskError(f"{folder}: config.json names no three eagle_aux_hidden_state_layer_ids")
    weights = _weights(folder)
    unknown = sorted(set(weights) - set(EAGLE3_TENSORS))
    if unknown:
        raise SpecDeskError(f"{folder}: tensors {unknown[:3]} have no place in an eagle3 GGUF")
    n_head = config["num_attention_heads"]
    n_kv = config.get("num_key_value_heads") or n_head
    tensors = {}
    for name, data in weights.items():
        data = np.asarray(data, dtype=np.float32)
        if name.endswith("q_proj.weight"):
            data = permute_rope_rows(data, n_head)
        elif name.endswith("k_proj.weight"):
            data = permute_rope_rows(data, n_kv)
        tensors[EAGLE3_TENSORS[name]] = data
    shape = {key: config[key] for key in ("hidden_size", "num_attention_heads", "intermediate_size",
                                          "max_position_embeddings", "rope_theta", "rms_norm_eps", "vocab_size")}
    shape.update(num_key_value_heads=n_kv, head_dim=config.get("head_dim") or config["hidden_size"] // n_head)
    return _write_eagle3(shape, [int(i) for i in layer_ids], tensors, Path(target_gguf), Path(out_path),
                         f"{folder.name}-eagle3")


def _write_eagle3(shape: dict, layer_ids: list[int], tensors: dict[str, np.ndarray], target_gguf: Path,
                  out_path: Path, name: str) -> Path:
    d = shape["hidden_size"]
    with atomic_path(out_path) as tmp:
        writer = gguf.GGUFWriter(tmp, "eagle3")
        writer.add_type(gguf.GGUFType.MODEL)
        writer.add_name(name)
        writer.add_block_count(1)
        writer.add_context_length(shape["max_position_embeddings"])
        writer.add_embedding_length(d)
        writer.add_feed_forward_length(shape["intermediate_size"])
        writer.add_head_count(shape["num_attention_heads"])
        writer.add_head_count_kv(shape["num_key_value_heads"])
        writer.add_key_length(shape["head_dim"])
        writer.add_value_length(shape["head_dim"])
        writer.add_rope_dimension_count(shape["head_dim"])
        writer.add_rope_freq_base(shape["rope_theta"])
        writer.add_layer_norm_rms_eps(shape["rms_norm_eps"])
        writer.add_array("eagle3.target_layers", layer_ids)
        writer.add_uint32("eagle3.target_hidden_size", d)
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        writer.add_vocab_size(shape["vocab_size"])
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        _copy_vocab(writer, target_gguf)
        for tensor_name, data in tensors.items():
            _add(writer, tensor_name, data)
        _finish(writer)
    return out_path
