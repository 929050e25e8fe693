"""One validation pass over model metadata: hostile GGUF headers (metadata bombs, nested
arrays), GGUF files llama.cpp cannot load, HF configs with bad keys, oversized contexts and
special files as models, each refused in one line wherever the file is used."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from specdesk.app.models.library import LibraryConfig, read_model, scan_library
from specdesk.app.models.pairing import check_draft
from specdesk.engines.files import require_regular_file
from specdesk.engines.llama.header import GgufFormatError, GgufHeader, read_gguf_header
from specdesk.engines.types import SpecDeskError

from llama_helpers import copy_gguf, rewrite_gguf

GENEROUS_S = 120.0  # only catches an endless loop (a loaded 2-core machine is slow); speed lives in benchmarks/


# --- hand-made files --------------------------------------------------------------
def gguf_string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def raw_gguf(*kv: bytes, n_tensors: int = 0) -> bytes:
    """A GGUF v3 header from already encoded key/value records."""
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, len(kv)) + b"".join(kv)


def metadata_bomb() -> bytes:
    """75 bytes whose one array claims 2^62 uint8 elements."""
    record = gguf_string("x.bomb") + struct.pack("<IIQ", 9, 0, 1 << 62)
    data = raw_gguf(record)
    return data + b"\0" * (75 - len(data))


def nested_arrays(depth: int = 20_000) -> bytes:
    record = gguf_string("x.nested") + struct.pack("<I", 9)
    record += struct.pack("<IQ", 9, 1) * depth + struct.pack("<IQ", 0, 0)
    return raw_gguf(record)


def rewrite(src: str | Path, dst: Path, **overrides) -> Path:
    """Copy a GGUF file with some metadata values replaced (llama_helpers.copy_gguf)."""
    return copy_gguf(src, dst, overrides)


def head_count(path: str) -> int:
    header = read_gguf_header(path)
    return header.arch_value("attention.head_count")


def bad_gguf_files(demo_family, folder: Path) -> dict[str, tuple[Path, str]]:
    """name -> (file, the key its refusal must name): files that parse but llama.cpp cannot use."""
    src = demo_family["draft_gguf"]
    n_head = head_count(src)
    cases = {
        "no-layers": ({"{arch}.block_count": 0}, "block_count"),
        "billion-layers": ({"{arch}.block_count": 10**9}, "block_count"),
        "no-vocab": ({"tokenizer.ggml.model": "no_vocab"}, "no_vocab"),
        "nan-epsilon": ({"{arch}.attention.layer_norm_rms_epsilon": float("nan")}, "layer_norm_rms_epsilon"),
        "zero-epsilon": ({"{arch}.attention.layer_norm_rms_epsilon": 0.0}, "layer_norm_rms_epsilon"),
        "zero-heads": ({"{arch}.attention.head_count": 0}, "head_count"),
        "heads-not-dividing": ({"{arch}.attention.head_count_kv": n_head + 1}, "head_count_kv"),
        "huge-rope": ({"{arch}.rope.dimension_count": 10**6}, "rope.dimension_count"),
    }
    folder.mkdir(parents=True, exist_ok=True)
    files = {name: (rewrite(src, folder / f"{name}.gguf", **overrides), key)
             for name, (overrides, key) in cases.items()}
    # llama.cpp maps token texts to ids and asserts (GGML_ASSERT: the process aborts) that no
    # text comes twice; an empty text stands for "[EMPTY_<id>]" there.
    files["duplicate-tokens"] = (rewrite_gguf(src, folder / "duplicate-tokens.gguf",
                                              edit_tokens=lambda t: t[:41] + [t[40]] + t[42:]), "same text as token 40")
    files["missing-tensor"] = (without_tensor(src, folder / "missing-tensor.gguf", "blk.0.attn_k.weight"),
                               "blk.0.attn_k.weight missing")
    files["empty-token-spelled-out"] = (rewrite_gguf(src, folder / "empty-token-spelled-out.gguf",
                                                     edit_tokens=lambda t: t[:40] + ["", "[EMPTY_40]"] + t[42:]),
                                        "same text as token 40")
    return files


def without_tensor(src: str | Path, dst: Path, name: str) -> Path:
    """A copy of a GGUF file that lacks one tensor."""
    import numpy as np
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(str(src))
    writer = GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if not key.startswith("GGUF.") and key != "general.architecture":
            main_type = field.types[0]
            writer.add_key_value(key, field.contents(), main_type,
                                 sub_type=field.types[-1] if main_type == GGUFValueType.ARRAY else None)
    for tensor in reader.tensors:
        if tensor.name != name:
            data = np.asarray(tensor.data)
            writer.add_tensor(tensor.name, data, raw_shape=list(data.shape), raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def one_line(message: str) -> bool:
    return bool(message) and "\n" not in message.strip() and "Traceback" not in message


def finishes(work, timeout: float = GENEROUS_S):
    """work()'s result, failing (not hanging) when it does not return in time: a FIFO opened
    by mistake blocks forever."""
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = work()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            result["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"did not return within {timeout} s"
    if "error" in result:
        raise result["error"]
    return result["value"]


def cli(*argv: str, env_root: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """`specdesk ARGS` in a fresh process with an empty home, config, cache and HF cache."""
    env = {**os.environ, "HOME": str(env_root / "home"), "SPECDESK_CONFIG_DIR": str(env_root / "config"),
           "SPECDESK_CACHE_DIR": str(env_root / "cache"), "HF_HUB_CACHE": str(env_root / "hf"),
           "SPECDESK_LLAMA_LOG": ""}
    return subprocess.run([sys.executable, "-m", "specdesk.app.main", *argv], capture_output=True, text=True,
                          timeout=timeout, env=env)


# --- the bounded header reader ------------------------------------------------------
def test_header_reader_agrees_with_the_gguf_package_on_real_files(demo_family):
    from gguf import GGUFReader

    for role in ("target_gguf", "draft_gguf"):
        path = demo_family[role]
        header, reader = read_gguf_header(path), GGUFReader(path)
        for name, field in reader.fields.items():
            if name.startswith("GGUF."):
                continue
            if name.startswith("tokenizer.") and len(field.types) > 1:  # arrays of the vocabulary: length only
                assert header.array_lengths[name] == len(field.data), name
            else:
                assert header.fields[name] == field.contents(), name
        assert header.data_offset == reader.data_offset
        for tensor in reader.tensors:
            info = header.tensor_infos[tensor.name]
            assert (info.shape, info.offset, info.n_bytes, info.n_elements) == (
                tuple(int(d) for d in tensor.shape), tensor.data_offset, tensor.n_bytes, tensor.n_elements)


HOSTILE_HEADERS = {  # name -> (bytes, what the refusal says)
    "bomb": (metadata_bomb(), "claims 4611686018427387904 elements"),
    "nested": (nested_arrays(), "array of arrays"),
    "huge-string": (raw_gguf(gguf_string("x.s") + struct.pack("<IQ", 8, 1 << 40)), "claims 1099511627776 bytes"),
    "many-strings": (raw_gguf(gguf_string("x.a") + struct.pack("<IIQ", 9, 8, 1 << 25)), "but only 0 remain"),
    "many-tensors": (b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 0), "claims 1099511627776 tensors"),
    "many-keys": (b"GGUF" + struct.pack("<IQQ", 3, 0, 1 << 19), "but only 0 remain"),
    "unknown-type": (raw_gguf(gguf_string("x.t") + struct.pack("<I", 99)), "unknown value type 99"),
}


@pytest.mark.parametrize("name", list(HOSTILE_HEADERS))
def test_hostile_headers_are_refused_fast_in_one_line(tmp_path, name):
    data, expected = HOSTILE_HEADERS[name]
    path = tmp_path / f"{name}.gguf"
    path.write_bytes(data)
    started = time.monotonic()
    with pytest.raises(GgufFormatError) as refused:
        finishes(lambda: read_gguf_header(path))
    assert time.monotonic() - started < GENEROUS_S
    message = str(refused.value)
    assert one_line(message) and message.startswith(f"{path}: corrupt GGUF file") and expected in message, message
    entry = finishes(lambda: read_model(path))
    assert not entry.ok and expected in entry.error


SCAN_BOMB = textwrap.dedent("""
    import json, resource, sys, time
    from specdesk.app.models.library import LibraryConfig, scan_library
    def scan(folder):
        return scan_library(LibraryConfig(include_hf_cache=False, include_demo=False, include_apps=False,
                                          user_paths=[folder]))
    scan(sys.argv[1])  # warm: imports and first use
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    entries = scan(sys.argv[2])
    seconds = time.monotonic() - started
    growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    print(json.dumps({"seconds": seconds, "peak_rss_growth_bytes": growth,
                      "errors": [e.error for e in entries]}))
""")


@pytest.mark.skipif(sys.platform == "win32", reason="ru_maxrss is POSIX")
def test_the_scanner_lists_a_folder_with_the_bomb_with_bounded_memory(demo_family, tmp_path):
    warm, bombs = tmp_path / "warm", tmp_path / "bombs"
    warm.mkdir()
    bombs.mkdir()
    shutil.copy(demo_family["draft_gguf"], warm / "draft.gguf")
    (bombs / "bomb.gguf").write_bytes(metadata_bomb())
    (bombs / "nested.gguf").write_bytes(nested_arrays())
    out = subprocess.run([sys.executable, "-c", SCAN_BOMB, str(warm), str(bombs)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    print(json.dumps({k: v for k, v in report.items() if k != "errors"}))
    assert len(report["errors"]) == 2 and all(report["errors"])
    assert report["peak_rss_growth_bytes"] < 64 << 20
    assert report["seconds"] < GENEROUS_S


# --- files llama.cpp cannot use -------------------------------------------------------
def literal_header(arch: str = "llama", **fields) -> GgufHeader:
    keys = {"general.architecture": arch, "tokenizer.ggml.model": "gpt2", f"{arch}.block_count": 2,
            f"{arch}.embedding_length": 8, f"{arch}.attention.head_count": 4, f"{arch}.context_length": 64}
    keys.update({key.replace("{arch}", arch): value for key, value in fields.items()})
    keys = {key: value for key, value in keys.items() if value is not None}
    return GgufHeader("m.gguf", 1000, 3, keys, {"tokenizer.ggml.tokens": 10}, {}, 32)


def test_validation_rules_on_literal_headers():
    from specdesk.engines.llama.validate import gguf_problems, kv_cache_bytes

    assert gguf_problems(literal_header()) == []
    assert gguf_problems(literal_header(**{"{arch}.attention.head_count": [4, 4, 4]})) == [
        "llama.attention.head_count has 3 values for 2 layers"]
    assert gguf_problems(literal_header(**{"{arch}.attention.head_count": [4, 0],
                                           "{arch}.attention.head_count_kv": [2, 0]})) == []
    assert gguf_problems(literal_header(**{"{arch}.attention.head_count_kv": 0})) == [
        "llama.attention.head_count_kv is 0 while head_count is 4"]
    assert gguf_problems(literal_header(**{"{arch}.embedding_length": 10})) == [
        "llama.embedding_length 10 is not a multiple of head_count 4 (and no attention.key_length says otherwise)"]
    assert gguf_problems(literal_header(**{"{arch}.attention.layer_norm_rms_epsilon": float("inf")})) == [
        "llama.attention.layer_norm_rms_epsilon is inf; it must be a small positive number (like 1e-6)"]
    assert gguf_problems(literal_header(**{"tokenizer.ggml.model": "sentencepiece"})) == [
        "tokenizer.ggml.model 'sentencepiece' is not a vocabulary type llama.cpp knows"]
    # A recurrent model has no attention heads; a drafter may carry no vocabulary.
    assert gguf_problems(literal_header("mamba", **{"{arch}.attention.head_count": None})) == []
    assert gguf_problems(literal_header("dflash", **{"tokenizer.ggml.model": "no_vocab"})) == []
    # KV cache: 2 layers x 4 heads x (2 + 2) dims x 2 bytes per position.
    assert kv_cache_bytes(literal_header(), 100) == 100 * 2 * 4 * 4 * 2
    # Rotary dimensions fit a head (8 / 4 = 2 here), and equal it for the llama family.
    assert gguf_problems(literal_header(**{"{arch}.rope.dimension_count": 2})) == []
    assert gguf_problems(literal_header(**{"{arch}.rope.dimension_count": 2**31})) == [
        "llama.rope.dimension_count 2147483648 is larger than the head size 2"]
    assert gguf_problems(literal_header(**{"{arch}.rope.dimension_count": 1})) == [
        "llama.rope.dimension_count 1 is not the head size 2, as llama.cpp requires for llama"]
    assert gguf_problems(literal_header("phi2", **{"{arch}.rope.dimension_count": 1})) == []  # partial rotary
    # A vocabulary that adds BOS has one (gpt2's default id 11 is past these 10 tokens).
    assert gguf_problems(literal_header(**{"tokenizer.ggml.add_bos_token": True})) == [
        "the vocabulary adds a BOS token but has none (no tokenizer.ggml.bos_token_id, 10 tokens): llama.cpp "
        "aborts when it tokenizes"]
    assert gguf_problems(literal_header(**{"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.bos_token_id": 3})) == []
    assert gguf_problems(literal_header(**{"tokenizer.ggml.model": "llama", "tokenizer.ggml.bos_token_id": 99})) == []
    assert gguf_problems(literal_header(**{"tokenizer.ggml.add_bos_token": False})) == []


def test_files_llama_cpp_cannot_load_are_refused_everywhere_with_their_reason(demo_family, tmp_path):
    from specdesk.engines.llama.binding import GgufModel
    from specdesk.engines.llama.engine import LlamaEngine

    files = bad_gguf_files(demo_family, tmp_path / "bad")
    target = read_model(demo_family["target_gguf"])
    entries = {Path(e.path).name: e for e in scan_library(LibraryConfig(
        include_hf_cache=False, include_demo=False, include_apps=False, user_paths=[str(tmp_path / "bad")]))}
    assert set(entries) == {f"{name}.gguf" for name in files}
    for name, (path, key) in files.items():
        entry = entries[path.name]
        assert not entry.ok and key in entry.error and entry.error.startswith(str(path)), (name, entry.error)
        assert entry.architecture == target.architecture  # listed with its metadata, not as unreadable
        verdict = check_draft(target, entry)
        assert not verdict.compatible and key in verdict.reasons[0], name
        for load in (lambda: GgufModel(path), lambda: GgufModel(path, vocab_only=True),
                     lambda: LlamaEngine(path, n_ctx=64, n_threads=1)):
            with pytest.raises(SpecDeskError) as refused:
                load()
            assert one_line(str(refused.value)) and key in str(refused.value), (name, str(refused.value))


def test_a_bad_draft_is_refused_by_the_engine_before_loading(demo_family, tmp_path):
    from specdesk.engines.llama.engine import LlamaEngine

    path, key = bad_gguf_files(demo_family, tmp_path)["nan-epsilon"]
    engine = LlamaEngine(demo_family["target_gguf"], n_ctx=64, n_threads=1)
    try:
        with pytest.raises(SpecDeskError, match=key):
            engine.load_draft(path)
    finally:
        engine.close()


def test_a_context_too_large_for_memory_is_refused_up_front(demo_family):
    from specdesk.engines.llama.engine import LlamaEngine
    from specdesk.engines.llama.validate import context_problems, kv_cache_bytes
    from specdesk.engines.memory import ram_available

    header = read_gguf_header(demo_family["target_gguf"])
    need = kv_cache_bytes(header, 10**9)
    assert need > ram_available()
    problems = context_problems(header, 10**9, 1 << 30)
    assert problems == [f"a context of 1000000000 tokens needs {need:,} bytes of KV cache but 1,073,741,824 bytes "
                        "of memory are free: use a smaller --ctx"]
    assert context_problems(header, 256, 1 << 30) == []
    started = time.monotonic()
    with pytest.raises(SpecDeskError) as refused:
        LlamaEngine(demo_family["target_gguf"], n_ctx=10**9, n_threads=1)
    assert time.monotonic() - started < GENEROUS_S
    assert one_line(str(refused.value)) and f"needs {need:,} bytes" in str(refused.value)


def test_cli_models_list_marks_bad_files_and_compare_refuses_a_huge_context(demo_family, tmp_path):
    folder = tmp_path / "models"
    files = bad_gguf_files(demo_family, folder)
    (folder / "bomb.gguf").write_bytes(metadata_bomb())
    listed = cli("models", "list", "--json", "--no-apps", "--no-hf-cache", "--path", str(folder), env_root=tmp_path)
    assert listed.returncode == 0, listed.stderr
    errors = {Path(e["path"]).name: e["error"] for e in json.loads(listed.stdout)}
    assert set(errors) == {"bomb.gguf", *(f"{name}.gguf" for name in files)}
    assert all(errors.values()) and "claims" in errors["bomb.gguf"]
    table = cli("models", "list", "--no-apps", "--no-hf-cache", "--path", str(folder), env_root=tmp_path)
    assert table.returncode == 0 and table.stdout.count("error: ") == len(errors), table.stdout
    assert "block_count is 1000000000" in table.stdout and "Traceback" not in table.stderr
    compared = cli("compare", "--target", demo_family["target_gguf"], "--method", "ngram", "--max-tokens", "4",
                   "--threads", "1", "--prompt", "x", "--ctx", "1000000000", env_root=tmp_path)
    assert compared.returncode == 2 and one_line(compared.stderr), compared.stderr
    assert "1000000000 tokens needs" in compared.stderr and "bytes of memory are free" in compared.stderr


# --- special files -----------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_fifo_is_refused_by_name_and_never_opened(demo_family, tmp_path):
    from specdesk.engines.llama.binding import GgufModel

    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    with pytest.raises(SpecDeskError, match="is a FIFO"):
        finishes(lambda: require_regular_file(fifo, "GGUF model file"))
    with pytest.raises(SpecDeskError, match="is a FIFO"):
        finishes(lambda: GgufModel(fifo))
    entry = finishes(lambda: read_model(fifo))
    assert not entry.ok and "FIFO" in entry.error
    listed = finishes(lambda: scan_library(LibraryConfig(include_hf_cache=False, include_demo=False,
                                                         include_apps=False, user_paths=[str(fifo)])))
    assert [e.ok for e in listed] == [False]
    for argv in (["compare", "--target", str(fifo), "--method", "ngram"],
                 ["compare", "--target", demo_family["target_gguf"], "--draft", str(fifo), "--method", "draft"],
                 ["models", "pair", "--target", str(fifo), "--no-apps", "--no-hf-cache"]):
        done = cli(*argv, "--json" if argv[0] == "models" else "--max-tokens=4", env_root=tmp_path, timeout=300)
        assert done.returncode == 2 and one_line(done.stderr), (argv, done.stderr)
        assert str(fifo) in done.stderr and "is a FIFO" in done.stderr, done.stderr


# --- HF configs ---------------------------------------------------------------------
BAD_CONFIGS = {
    "num_hidden_layers": 10**9,
    "vocab_size": 10**12,
    "hidden_size": "abc",
    "intermediate_size": -4,
    "architectures": 5,
    "rope_scaling": "yarn",
}


def hf_copy(src: str, dst: Path, **changes) -> Path:
    """A demo HF folder whose config.json has some keys replaced (None drops a key); weights linked."""
    dst.mkdir(parents=True)
    for item in Path(src).iterdir():
        if item.name != "config.json":
            (dst / item.name).symlink_to(item.resolve())
    config = json.loads((Path(src) / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize("key,value", [*BAD_CONFIGS.items(), ("hidden_size", -64)])
def test_bad_config_keys_are_named_in_one_line(demo_family, tmp_path, key, value):
    folder = hf_copy(demo_family["target_hf"], tmp_path / "model", **{key: value})
    entry = read_model(folder)
    assert not entry.ok and entry.error.startswith(str(folder / "config.json")) and key in entry.error
    assert one_line(entry.error)
    pytest.importorskip("torch")
    from specdesk.engines.torch.model import config_from_hf

    config = json.loads((folder / "config.json").read_text())
    with pytest.raises(SpecDeskError) as refused:
        config_from_hf(config, str(folder / "config.json"))
    message = str(refused.value)
    assert one_line(message) and message.startswith(f"{folder / 'config.json'}:") and key in message, message


def test_zero_heads_without_head_dim_is_named(demo_family, tmp_path):
    pytest.importorskip("torch")
    from specdesk.engines.torch.model import config_from_hf

    folder = hf_copy(demo_family["target_hf"], tmp_path / "model", num_attention_heads=0, head_dim=None)
    with pytest.raises(SpecDeskError, match="num_attention_heads is 0"):
        config_from_hf(json.loads((folder / "config.json").read_text()), str(folder / "config.json"))
    assert "num_attention_heads" in read_model(folder).error


def test_a_config_larger_than_its_checkpoint_is_refused_before_allocating(demo_family, tmp_path):
    """1000 layers pass the limits, but the checkpoint holds far fewer: refused from the headers."""
    pytest.importorskip("torch")
    from specdesk.engines.torch.context import TorchModel

    import torch

    folder = hf_copy(demo_family["target_hf"], tmp_path / "model", num_hidden_layers=1000, vocab_size=1 << 22,
                     hidden_size=1 << 14)
    started = time.monotonic()
    with pytest.raises(SpecDeskError) as refused:
        TorchModel(folder, "cpu", torch.float32)
    assert time.monotonic() - started < GENEROUS_S
    assert one_line(str(refused.value)) and "config.json implies" in str(refused.value)


def test_a_torch_context_too_large_for_memory_is_refused(demo_family):
    pytest.importorskip("torch")
    from specdesk.engines.torch.engine import TorchEngine

    with pytest.raises(SpecDeskError) as refused:
        TorchEngine(demo_family["target_hf"], n_ctx=10**9, device="cpu", dtype="float32", n_threads=1)
    assert one_line(str(refused.value)) and "bytes of KV cache" in str(refused.value)


def test_deep_json_config_is_one_line(tmp_path):
    folder = tmp_path / "deep"
    folder.mkdir()
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    (folder / "model.safetensors").write_bytes(b"\0" * 8)
    entry = read_model(folder)
    assert not entry.ok and one_line(entry.error) and "config.json" in entry.error


def test_a_chat_template_that_is_not_utf8_loads_the_model_without_it(demo_family, tmp_path):
    from specdesk.engines.llama.engine import LlamaEngine

    path = copy_gguf(demo_family["target_gguf"], tmp_path / "latin1-template.gguf",
                     {"tokenizer.chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}@caf@"})
    data = path.read_bytes()
    assert data.count(b"@caf@") == 1
    path.write_bytes(data.replace(b"@caf@", b"@caf\xe9"))  # Latin-1's é: not UTF-8
    engine = LlamaEngine(path, n_ctx=64, n_threads=1)
    try:
        assert engine.target.chat_template() is None
        assert len(engine.notes) == 1 and "its chat template is not valid UTF-8" in engine.notes[0]
    finally:
        engine.close()
    chat = subprocess.run([sys.executable, "-m", "specdesk.app.main", "chat", "--target", str(path), "--method", "none",
                           "--threads", "1", "--max-tokens", "4"], input="hello\n\n", capture_output=True, text=True,
                          timeout=120, env={**os.environ, "SPECDESK_DATA_DIR": str(tmp_path / "data")})
    notes = [line for line in chat.stderr.splitlines() if "not valid UTF-8" in line]
    assert chat.returncode == 0 and len(notes) == 1 and "Traceback" not in chat.stderr, chat.stderr
    assert "model> " in chat.stdout  # and it answered
    from specdesk.app.runtime import session

    app = session.Session()  # the app's load: the same line reaches its status line (ModelInfo.notes)
    try:
        info = app.load(str(path), None, threads=1).info
        assert len(info.notes) == 1 and "its chat template is not valid UTF-8" in info.notes[0]
    finally:
        app.close()


def test_an_oversized_tokenizer_is_refused_before_it_is_parsed(tmp_path):
    from specdesk.engines.torch.tokenizer import HfTokenizer

    folder = tmp_path / "model"
    folder.mkdir()
    with open(folder / "tokenizer.json", "wb") as f:
        f.truncate(2 * 2**30)  # 2 GB (sparse: no disk used); parsing it would take gigabytes of memory
    started = time.monotonic()
    with pytest.raises(SpecDeskError) as refused:
        HfTokenizer(folder)
    assert time.monotonic() - started < GENEROUS_S
    assert one_line(str(refused.value)) and "is not a plausible tokenizer.json file" in str(refused.value)


# --- what fits (engines/llama/fit.py) -----------------------------------------------------
def test_the_default_context_is_the_models_own_at_most_4096():
    from specdesk.engines.llama.fit import default_context

    assert [default_context(c) for c in (None, 0, 2048, 4096, 32768)] == [4096, 4096, 2048, 4096, 4096]
    assert default_context(32768, n_ctx=8192) == 8192 and default_context(None, n_ctx=100) == 100


def test_the_kv_cache_counts_every_layers_own_heads():
    from specdesk.engines.llama.fit import kv_bytes

    assert kv_bytes(10, [(4, 16, 16)] * 3) == 10 * 3 * 4 * 32 * 2
    assert kv_bytes(10, [(4, 16, 16), (0, 16, 16), (2, 8, 24)]) == 10 * (4 * 32 + 0 + 2 * 32) * 2


@pytest.mark.parametrize("config, target, message", [
    ({"target_layers": [1, 2], "embedding_length": 64, "fc_inputs": 128}, ("llama", 4, 64), None),
    ({"target_layers": [1, 2], "embedding_length": 64, "fc_inputs": 128}, ("glm4moe", 4, 64),
     "cannot hand out layer inputs of a 'glm4moe' model, so DFlash cannot run on it"),
    ({"embedding_length": 64, "fc_inputs": 128}, ("llama", 4, 64),
     "no dflash.target_layers: it does not say which target layers it reads"),
    ({"target_layers": [1, 5], "embedding_length": 64, "fc_inputs": 128}, ("llama", 4, 64),
     "reads target layers [1, 5] but t.gguf has 4 layers (0..3): it is a drafter for a different target"),
    ({"target_layers": [1, 2], "embedding_length": 32, "fc_inputs": 64}, ("llama", 4, 64),
     "made for a target with hidden size 32 (fc takes 64 = 2 layers x hidden), but t.gguf has hidden size 64: "
     "it is a drafter for a different target"),
    ({"target_layers": [1, 2], "embedding_length": 64}, ("llama", 4, 64), "(fc takes 0 = 2 layers x hidden)"),
])
def test_one_rule_says_whether_a_dflash_drafter_fits(config, target, message):
    from specdesk.engines.llama.fit import TargetShape, drafter_misfit, drafter_shape

    misfit = drafter_misfit(drafter_shape("dflash", config), TargetShape("t.gguf", *target))
    assert misfit == message if message is None else message in misfit


def test_an_eagle3_drafter_reads_three_layers():
    from specdesk.engines.llama.fit import TargetShape, drafter_misfit, drafter_shape

    target = TargetShape("t.gguf", "llama", 8, 64)
    three, two = ({"target_layers": layers, "target_hidden_size": 64} for layers in ([0, 3, 6], [0, 3]))
    assert drafter_misfit(drafter_shape("eagle3", three), target) is None
    assert "(0..7, 3 needed)" in drafter_misfit(drafter_shape("eagle3", two), target)
