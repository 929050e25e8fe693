"""Pairing on the demo family's GGUF files and variants of them; the memory estimate against
the resident memory llama.cpp really uses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llama_helpers import rewrite_gguf
from specdesk.app.models.library import ModelEntry, read_model
from specdesk.app.models.pairing import (MemoryInfo, available_memory, check_draft, estimate_memory, expected_speedup,
                                  family_key, kv_cache_bytes, known_target, native_drafters, pair)
from specdesk.engines.types import SpecDeskError

PLENTY = MemoryInfo(ram_available=64 << 30, ram_total=64 << 30)


def set_bos(src: str, dst: Path, bos: int) -> Path:
    """A copy with another BOS id, edited in place in the GGUF header."""
    from gguf import GGUFReader

    shutil.copy(src, dst)
    reader = GGUFReader(str(dst), "r+")
    field = reader.fields["tokenizer.ggml.bos_token_id"]
    field.parts[field.data[0]][0] = bos
    reader.data.flush()
    del reader
    return dst


@pytest.fixture(scope="module")
def variants(demo_family, tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("variants")
    draft = demo_family["draft_gguf"]

    def retext(tokens):
        tokens = list(tokens)
        tokens[100] = "<|renamed|>"
        return tokens

    return {
        "vocab": str(rewrite_gguf(draft, folder / "bigger-vocab.gguf", extra_tokens=200)),
        "near_vocab": str(rewrite_gguf(draft, folder / "near-vocab.gguf", extra_tokens=64)),
        "text": str(rewrite_gguf(draft, folder / "token-text.gguf", edit_tokens=retext)),
        "bos": str(set_bos(draft, folder / "other-bos.gguf", 2)),
        "eos": str(rewrite_gguf(draft, folder / "other-eos.gguf", eos_id=2)),
        "corrupt": str(_corrupt(folder / "corrupt.gguf", draft)),
    }


def _corrupt(path: Path, src: str) -> Path:
    data = Path(src).read_bytes()
    path.write_bytes(data[: len(data) // 2])  # truncated: tensors run past the end
    return path


def entries_for(demo_family, variants) -> list[ModelEntry]:
    paths = [demo_family["target_gguf"], demo_family["draft_gguf"], demo_family["draft_hf"], *variants.values()]
    return [read_model(p, "user") for p in paths]


def test_each_refusal_names_the_difference(demo_family, variants):
    report = pair(demo_family["target_gguf"], entries_for(demo_family, variants), memory=PLENTY)
    refused = {v.path: " ".join(v.reasons) for v in report.incompatible}
    target_vocab = read_model(demo_family["target_gguf"]).vocab_size
    assert f"vocab size {target_vocab} vs {target_vocab + 200}" in refused[variants["vocab"]]
    assert "BOS id 0 (added: True) vs 2 (added: True)" in refused[variants["bos"]]
    assert "token 100:" in refused[variants["text"]] and "'<|renamed|>'" in refused[variants["text"]]
    assert "EOS id 1 vs 2" in refused[variants["eos"]]
    assert "corrupt or truncated" in refused[variants["corrupt"]] and variants["corrupt"] in refused[variants["corrupt"]]
    assert "HF checkpoint" in refused[demo_family["draft_hf"]]
    # llama.cpp tolerates a vocabulary up to 128 tokens larger: so does pairing.
    assert [v.path for v in report.compatible] == [demo_family["draft_gguf"], variants["near_vocab"]]


def test_verdicts_match_the_engine_on_loaded_models(demo_family, variants):
    """Pairing (vocab-only loads) says exactly what the engine says when it loads the pair."""
    from specdesk.engines.llama.binding import GgufModel
    from specdesk.engines.speculation.compat import incompatibilities

    target_entry = read_model(demo_family["target_gguf"])
    target = GgufModel(demo_family["target_gguf"])
    try:
        for name in ("vocab", "text", "bos", "eos", "near_vocab"):
            draft = GgufModel(variants[name])
            try:
                engine_reasons = incompatibilities(target, draft)
            finally:
                draft.close()
            verdict = check_draft(target_entry, read_model(variants[name]))
            assert [r.removesuffix(" (target vs draft)") for r in verdict.reasons if not verdict.compatible] \
                == engine_reasons, name
    finally:
        target.close()


def test_the_demo_draft_ranks_first_with_an_expected_gain(demo_family, variants):
    report = pair(demo_family["target_gguf"], entries_for(demo_family, variants), memory=PLENTY)
    best = report.compatible[0]
    assert best.path == demo_family["draft_gguf"] and best.score > 1.0 and 1 <= best.k <= 8
    assert "same family" in best.reasons[0]
    assert report.memory_draft == demo_family["draft_gguf"] and report.memory.draft_weights_bytes > 0
    payload = report.to_json()
    assert set(payload) >= {"compatible", "incompatible", "native", "memory"}
    assert set(payload["memory"]) >= {"required_bytes", "available_bytes", "fits"}
    assert payload["compatible"][0]["path"] == best.path and "score" in payload["compatible"][0]
    assert all(v["reasons"] for v in payload["incompatible"])


def test_a_target_used_as_draft_gives_no_gain():
    assert expected_speedup(0.7, 1.0, 4) < 1.0
    assert expected_speedup(0.7, 0.05, 4) > 2.0
    assert expected_speedup(0.0, 0.0, 3) == 1.0


def test_family_key_strips_sizes_quantization_and_roles():
    def key(name):
        return family_key(ModelEntry(path=name, format="gguf", source="user", name=name))

    assert key("Qwen3-8B-Q4_K_M.gguf") == key("Qwen3-0.6B-Q8_0.gguf") == "qwen3"
    assert key("specdesk-demo-target-F16.gguf") == key("specdesk-demo-draft-F16.gguf")
    assert key("Llama-3.1-8B-Instruct-IQ4_XS.gguf") != key("Qwen3-8B-Q4_K_M.gguf")
    # the zoo's files are named by role only: their folder names the family, underscores split words
    assert key("zoo/qwen2-small-1a2b/draft_low-F16.gguf") == key("zoo/qwen2-small-1a2b/target-Q4_K_M.gguf") != ""
    assert key("zoo/qwen2-small-1a2b/draft_low-F16.gguf") != key("zoo/llama-small-3c4d/draft_low-F16.gguf")


def test_an_empty_family_key_never_matches():
    from specdesk.app.models.pairing import same_family

    def entry(path):
        return ModelEntry(path=path, format="gguf", source="user", name=path, architecture="llama")

    assert family_key(entry("target-F16.gguf")) == family_key(entry("draft-F16.gguf")) == ""
    assert not same_family(entry("target-F16.gguf"), entry("draft-F16.gguf"))
    assert same_family(entry("Qwen3-8B-Q4_K_M.gguf"), entry("Qwen3-0.6B-Q8_0.gguf"))


@pytest.fixture(scope="module")
def native(demo_family, demo_cache_dir) -> dict[str, str]:
    """The demo target exported with its MTP layer, its DFlash and EAGLE-3 drafters (GGUF)."""
    from specdesk.app.demo.export_native_gguf import build_native

    return build_native(demo_family, demo_cache_dir / "native")


def test_gguf_native_drafters_and_the_mtp_export_are_listed_as_native(demo_family, native, tmp_path):
    from gguf import GGUFReader

    other = tmp_path / "dflash-for-a-wider-target.gguf"  # a drafter for another target: wider hidden size
    shutil.copy(native["dflash_gguf"], other)
    reader = GGUFReader(str(other), "r+")
    field = reader.fields["dflash.embedding_length"]
    field.parts[field.data[0]][0] = 2 * read_model(demo_family["target_gguf"]).shape.n_embd
    reader.data.flush()
    del reader
    paths = [demo_family["target_gguf"], demo_family["draft_gguf"], native["mtp_gguf"], native["dflash_gguf"],
             native["eagle3_gguf"], str(other)]
    report = pair(demo_family["target_gguf"], [read_model(p, "demo") for p in paths], memory=PLENTY, records=[])
    target = read_model(demo_family["target_gguf"])
    found = {d["path"]: d for d in report.native}
    assert set(found) == {native["mtp_gguf"], native["dflash_gguf"], native["eagle3_gguf"]}
    shape = f"for this {target.shape.n_layer}-layer, {target.shape.n_embd}-wide target and its vocabulary"
    assert found[native["dflash_gguf"]]["method"] == "dflash"
    assert found[native["dflash_gguf"]]["why"].startswith(f"DFlash drafter {shape}")
    assert found[native["dflash_gguf"]]["why"].endswith("use it as the draft with method dflash")
    assert found[native["eagle3_gguf"]]["method"] == "eagle3"
    assert found[native["eagle3_gguf"]]["why"].startswith(f"EAGLE-3 drafter {shape}")
    assert found[native["mtp_gguf"]]["method"] == "mtp" and found[native["mtp_gguf"]]["layers"] == 1
    assert found[native["mtp_gguf"]]["why"] == "the same model with 1 MTP layer: load it as the target and use method mtp"
    # native drafters are not ranked as drafts, nor listed as models that cannot draft
    assert [v.path for v in report.compatible] == [demo_family["draft_gguf"]]
    assert [v.path for v in report.incompatible] == [str(other)]
    assert report.incompatible[0].reasons[0].startswith("a DFlash drafter: made for a target "
                                                        f"with hidden size {2 * target.shape.n_embd}")
    # the engine agrees: the listed drafters pass its own checks, the other one does not
    from specdesk.engines.llama.binding import GgufModel
    from specdesk.engines.llama.ext import check_drafter

    with GgufModel(demo_family["target_gguf"]) as model:
        check_drafter(native["dflash_gguf"], model, "dflash")
        check_drafter(native["eagle3_gguf"], model, "eagle3")
        with pytest.raises(SpecDeskError) as refused:
            check_drafter(other, model, "dflash")
    assert str(refused.value) == f"{other}: {report.incompatible[0].reasons[0].removeprefix('a DFlash drafter: ')}"
    assert str(refused.value).endswith(f"but {Path(target.path).name} has hidden size {target.shape.n_embd}: "
                                       "it is a drafter for a different target")


def test_a_drafter_for_another_target_is_not_native(demo_family, native):
    from dataclasses import replace

    from specdesk.app.models.pairing import gguf_drafter_misfit, mtp_twin

    target = read_model(demo_family["target_gguf"])
    dflash, eagle = read_model(native["dflash_gguf"]), read_model(native["eagle3_gguf"])
    assert gguf_drafter_misfit(target, dflash) is None and gguf_drafter_misfit(target, eagle) is None
    # a shallower target: the last layer the drafters read is out of its reach
    deepest = max(dflash.drafter_config["target_layers"] + eagle.drafter_config["target_layers"])
    fewer = replace(target, shape=replace(target.shape, n_layer=deepest))
    named = f"{Path(target.path).name} has {deepest} layers (0..{deepest - 1})"
    assert named in gguf_drafter_misfit(fewer, dflash) and named in gguf_drafter_misfit(fewer, eagle)
    other_vocab = replace(target, vocab_size=target.vocab_size + 1)
    assert "vocab size" in gguf_drafter_misfit(other_vocab, eagle)
    assert native_drafters(fewer, [dflash, eagle]) == []
    mtp = read_model(native["mtp_gguf"])
    assert mtp_twin(target, mtp) and not mtp_twin(fewer, mtp) and not mtp_twin(other_vocab, mtp)


def test_a_chosen_incompatible_draft_is_refused_with_its_reason(demo_family, variants):
    with pytest.raises(SpecDeskError, match="BOS id"):
        pair(demo_family["target_gguf"], [], draft_path=variants["bos"], memory=PLENTY)
    with pytest.raises(SpecDeskError, match="corrupt or truncated"):
        pair(variants["corrupt"], [], memory=PLENTY)


def test_native_drafters_from_the_file_the_library_and_the_table(tmp_path):
    qwen = ModelEntry(path=str(tmp_path / "Qwen3-8B-Q4_K_M.gguf"), format="gguf", source="user",
                      name="Qwen3 8B", vocab_size=151936, shape=_shape(36))
    assert known_target(qwen)["target"] == "Qwen/Qwen3-8B"
    local = ModelEntry(path=str(tmp_path / "dflash"), format="hf", source="hf-cache", name="z-lab/Qwen3-8B-DFlash-b16",
                       repo_id="z-lab/Qwen3-8B-DFlash-b16", drafter="dflash",
                       drafter_config={"block_size": 16, "num_target_layers": 36})
    found = native_drafters(qwen, [local])
    assert found == [{"method": "dflash", "source": "local", "path": local.path, "repo": local.repo_id,
                      "why": "published for this target"}]
    assert [d["repo"] for d in native_drafters(qwen, [])] == ["z-lab/Qwen3-8B-DFlash-b16"]
    llama = ModelEntry(path="Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", format="gguf", source="user", name="x")
    assert {d["method"] for d in native_drafters(llama, [])} == {"eagle3", "dflash"}
    mtp = ModelEntry(path="mimo.gguf", format="gguf", source="user", name="MiMo-7B-RL", mtp_layers=1)
    assert native_drafters(mtp, [])[0] == {"method": "mtp", "source": "in-file", "path": "mimo.gguf", "layers": 1}
    plain = ModelEntry(path="unknown-model.gguf", format="gguf", source="user", name="x")
    assert native_drafters(plain, []) == []


def _shape(n_layer):
    from specdesk.app.models.library import Shape

    return Shape(n_layer=n_layer)


def test_kv_cache_matches_the_engine_formula(demo_family):
    from specdesk.engines.llama.binding import GgufModel

    entry = read_model(demo_family["target_gguf"])
    model = GgufModel(demo_family["target_gguf"])
    try:
        assert kv_cache_bytes(entry.shape, 200) == model.kv_cache_bytes(200)
    finally:
        model.close()


def test_fit_verdict_compares_with_available_memory(demo_family):
    target, draft = read_model(demo_family["target_gguf"]), read_model(demo_family["draft_gguf"])
    estimate = estimate_memory(target, draft, 128, PLENTY)
    assert estimate.fits and estimate.available_bytes == PLENTY.ram_available
    tight = MemoryInfo(ram_available=estimate.required_bytes - 1, ram_total=1 << 30)
    assert not estimate_memory(target, draft, 128, tight).fits
    bigger = estimate_memory(target, draft, 256, PLENTY)
    assert bigger.kv_cache_bytes == 2 * estimate.kv_cache_bytes
    info = available_memory()
    assert 0 < info.ram_available <= info.ram_total


MEASURE = r"""
import json, sys, threading
from specdesk.engines.llama.binding import llama_lib
from specdesk.engines.llama.engine import LlamaEngine
from specdesk.engines.types import GenerationRequest, SpecConfig

def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))

target, draft, n_ctx = sys.argv[1], sys.argv[2], int(sys.argv[3])
llama_lib()  # the Python process and the llama.cpp library are there before any model
before = rss()
engine = LlamaEngine(target, n_ctx=n_ctx, n_threads=1)
spec = SpecConfig(method="none")
if draft != "-":
    engine.load_draft(draft)
    spec = SpecConfig(method="draft", k=4, draft_path=draft)
# A prompt that fills the context up to the reply: the worst case the estimate plans for.
text = "def parse_args(argv):\n    parser = argparse.ArgumentParser()\n" * 100
prompt = engine.tokenize(text)[: engine.n_ctx - 40]
request = GenerationRequest(tuple(prompt), max_tokens=32, spec=spec, stop_at_eos=False)
for _ in engine.generate(request, threading.Event()):
    pass
print(json.dumps({"growth": rss() - before}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmRSS from /proc (Linux)")
@pytest.mark.parametrize("with_draft,n_ctx", [(True, 256), (False, 128)])
def test_memory_estimate_is_within_15_percent_of_measured_resident_memory(demo_family, with_draft, n_ctx):
    target, draft = demo_family["target_gguf"], demo_family["draft_gguf"] if with_draft else "-"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", MEASURE, target, draft, str(n_ctx)], capture_output=True,
                         text=True, timeout=120, env=env, check=True)
    measured = json.loads(out.stdout.strip().splitlines()[-1])["growth"]
    estimate = estimate_memory(read_model(target), read_model(draft) if with_draft else None, n_ctx, PLENTY)
    error = (estimate.required_bytes - measured) / measured
    print(json.dumps({"n_ctx": n_ctx, "draft": with_draft, "measured_bytes": measured,
                      "estimated_bytes": estimate.required_bytes, "relative_error": round(error, 4)}))
    assert abs(error) < 0.15


def test_models_pair_json(demo_family, variants, tmp_path, monkeypatch, capsys):
    from specdesk.app.models import pairing
    from specdesk.app.main import main

    monkeypatch.setattr(pairing, "available_memory", lambda: PLENTY)  # the verdict, not this machine's free RAM
    monkeypatch.setenv("SPECDESK_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("SPECDESK_CACHE_DIR", str(tmp_path / "cache"))  # not this machine's demo family
    folder = str(Path(variants["bos"]).parent)
    args = ["models", "pair", "--target", demo_family["target_gguf"], "--path", demo_family["draft_gguf"],
            "--path", folder, "--no-apps", "--no-hf-cache", "--ctx", "128"]
    assert main(args + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["compatible"][0]["path"] == demo_family["draft_gguf"] and report["compatible"][0]["score"] > 1
    reasons = {v["path"]: v["reasons"] for v in report["incompatible"]}
    assert any("BOS id" in r for r in reasons[variants["bos"]])
    assert isinstance(report["native"], list)
    memory = report["memory"]
    assert memory["fits"] is True and 0 < memory["required_bytes"] < memory["available_bytes"]
    assert main(args) == 0
    assert "fits" in capsys.readouterr().out
    monkeypatch.setattr(pairing, "available_memory", lambda: MemoryInfo(ram_available=1 << 20, ram_total=1 << 30))
    assert main(args + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["memory"]["fits"] is False
    assert main(args[:3] + [variants["corrupt"], "--no-apps", "--no-hf-cache"]) == 2
    assert "corrupt or truncated" in capsys.readouterr().err


def test_a_missing_drafter_table_means_no_suggestions(tmp_path, monkeypatch):
    from specdesk.app.models.pairing import load_drafter_table

    monkeypatch.setenv("SPECDESK_ASSETS_DIR", str(tmp_path / "no-assets"))
    assert load_drafter_table() == []
    qwen = ModelEntry(path="Qwen3-8B-Q4_K_M.gguf", format="gguf", source="user", name="x")
    assert native_drafters(qwen, []) == []


def test_an_unmeasured_draft_is_scaled_to_what_this_machine_measured_for_another(demo_family, tmp_path):
    """A second file of a measured draft borrows its measured acceptance, and every assumed
    figure is scaled by how far this machine's measurement fell from the speedup model's."""
    from specdesk.app.models.pairing import score_draft

    target = read_model(demo_family["target_gguf"], "demo")
    measured_path = demo_family["draft_gguf"]
    copy = Path(shutil.copy(measured_path, tmp_path / "specdesk-demo-draft-Q8_0.gguf"))
    records = [{"target": os.path.realpath(target.path), "draft": os.path.realpath(measured_path), "engine": "llama.cpp",
                "method": "draft", "k": 4, "speedup": 1.1, "acceptance": 0.8, "tokens": 640, "temperature": 0.0}]
    alone = score_draft(target, read_model(str(copy), "demo"), [])
    scaled = score_draft(target, read_model(str(copy), "demo"), records)
    assert alone.basis == scaled.basis == "assumed"
    assert "acceptance 80% as measured for " + Path(measured_path).name in scaled.reasons[0]
    assert any(r.startswith("scaled by ") for r in scaled.reasons)
    assert scaled.score < alone.score  # the model promised more than this machine measured
    assert score_draft(target, read_model(measured_path, "demo"), records).basis == "measured"


def test_a_vocabulary_that_ends_llama_cpp_costs_only_its_own_verdict(demo_family, tmp_path, monkeypatch):
    """Pairing reads vocabularies in a child process: a file llama.cpp aborts on (here the child
    is sent SIGABRT, as GGML_ASSERT does, while it reads the drafts) gets a verdict saying so,
    every other file its own, and the caller (the app's window, `models pair`) lives on."""
    import glob
    import multiprocessing
    import signal
    import tempfile
    import threading
    import time

    from specdesk.app.models.vocab_check import vocab_verdicts

    monkeypatch.setenv("SPECDESK_LLAMA_LOG", "1")  # llama.cpp's own log: each model load is seen starting
    scratch = tmp_path / "tmp"  # this test's own temporary folder: another process's logs never count
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    drafts = []
    # Enough files that the child is still reading when the signal lands, however late a loaded
    # machine runs this thread after it saw the third vocabulary (40 were all read first once).
    for i in range(240):
        path = tmp_path / f"draft-{i}.gguf"
        os.link(demo_family["draft_gguf"], path)  # 240 names, one file
        drafts.append(str(path))
    # The signal can land between two files (the child has sent one verdict and not yet said which
    # file comes next): then no file is to blame and the check goes on, rightly. So the abort is
    # tried again until it lands inside a read; every try must still give each file a verdict.
    for _ in range(4):
        before = set(glob.glob(os.path.join(tempfile.gettempdir(), "specdesk-vocab-*.log")))
        verdicts: dict = {}
        worker = threading.Thread(target=lambda: verdicts.update(vocab_verdicts(demo_family["target_gguf"], drafts)))
        worker.start()
        deadline = time.monotonic() + 120
        while True:
            assert time.monotonic() < deadline and worker.is_alive(), "the child was never seen reading the drafts"
            logs = set(glob.glob(os.path.join(tempfile.gettempdir(), "specdesk-vocab-*.log"))) - before
            text = "".join(open(log, errors="replace").read() for log in logs)
            if text.count("loaded meta data") >= 3:  # the target's and two drafts' vocabularies
                break
            time.sleep(0.01)
        (child,) = [p for p in multiprocessing.active_children() if p.name == "specdesk-vocab"]
        os.kill(child.pid, signal.SIGABRT)
        worker.join(120)
        assert sorted(verdicts) == sorted(drafts)
        stopped = [path for path, reasons in verdicts.items() if reasons]
        assert len(stopped) <= 1
        if stopped:
            break
    assert len(stopped) == 1 and verdicts[stopped[0]] == (
        "llama.cpp stopped (SIGABRT) while reading its vocabulary: this file cannot be used",)


VOCAB_HERE = """
import sys
from specdesk.app.models.vocab_check import vocab_verdicts
verdicts = vocab_verdicts(sys.argv[1], sys.argv[2:])
print(repr(sorted((path, bool(reasons)) for path, reasons in verdicts.items())))
print("llama_cpp" in sys.modules)
"""


def test_the_vocabularies_are_read_by_llama_cpp_in_a_process_of_their_own(demo_family, variants):
    """The window's process (and the CLI's) asks, and never loads llama.cpp for it."""
    drafts = [demo_family["draft_gguf"], variants["bos"]]
    out = subprocess.run([sys.executable, "-c", VOCAB_HERE, demo_family["target_gguf"], *drafts], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    verdicts, loaded = out.stdout.strip().splitlines()
    assert verdicts == repr(sorted([(demo_family["draft_gguf"], False), (variants["bos"], True)]))
    assert loaded == "False"


def test_a_loaded_pairs_vocabularies_are_compared_once():
    """Every draft run asks whether its draft serves the target; the pair's token texts are read
    the first time only (on the demo's 8k vocabulary that was 15 ms of every reply), and a draft
    that did not fit is refused every time with the same reasons."""
    from types import SimpleNamespace

    from specdesk.engines.speculation.compat import check_compatible

    class Model:
        def __init__(self, name: str, texts: list[str]):
            self.path, self.texts, self.reads = Path(name), texts, 0
            self.vocab = SimpleNamespace(vocab_type=2, n_tokens=len(texts), add_bos=False, bos=1, eos=2)

        def token_text(self, token: int) -> str:
            self.reads += 1
            return self.texts[token]

    texts = [f"t{i}" for i in range(64)]
    target, draft, other = Model("t.gguf", texts), Model("d.gguf", texts), Model("o.gguf", texts[:-1] + ["x"])
    for _ in range(3):
        check_compatible(target, draft)
    assert draft.reads == len(texts) - 5  # llama.cpp's check skips the first few ids
    second = Model("t2.gguf", texts)  # another target: read for itself
    check_compatible(second, draft)
    assert second.reads == len(texts) - 5
    for _ in range(2):
        with pytest.raises(SpecDeskError, match=r"draft o.gguf is not compatible with target t.gguf: token 63"):
            check_compatible(target, other)
    assert other.reads == len(texts) - 5
