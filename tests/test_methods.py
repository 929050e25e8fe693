"""The method table (engines/methods.py): the one place facts about a method live."""

from __future__ import annotations

import threading

import pytest

from specdesk.engines.methods import (METHODS, MethodInfo, Training, all_rows, drafter_for_config, method_info,
                                      method_names, needs_draft_model, proposing_methods, registered, takes_drafter_file,
                                      uses_file)
from specdesk.engines.speculation.stats import ProposerCounters
from specdesk.engines.types import Draft, GenerationRequest, SpecConfig, SpecDeskError


def test_the_table_names_every_method_once_in_picker_order():
    assert method_names() == ("none", "auto", "ngram", "ngram-pool", "draft", "crossvocab", "mtp", "dflash", "eagle3")
    assert all(name == info.name for name, info in METHODS.items())


def test_an_unknown_name_gets_the_projects_error_with_the_known_ones():
    with pytest.raises(SpecDeskError, match="unknown method 'warp': choose one of none, auto, ngram"):
        method_info("warp")
    with pytest.raises(SpecDeskError, match="unknown method 'warp'"):
        SpecConfig(method="warp")


def test_what_each_method_takes():
    assert [m for m in method_names() if takes_drafter_file(m)] == ["dflash", "eagle3"]
    assert [m for m in method_names() if needs_draft_model(m)] == ["draft", "crossvocab"]
    assert [m for m in method_names() if uses_file(m)] == ["auto", "draft", "crossvocab", "dflash", "eagle3"]
    assert [m for m in method_names() if method_info(m).reads_hidden] == ["mtp", "dflash", "eagle3"]
    assert proposing_methods() == ("ngram", "ngram-pool", "draft", "crossvocab", "mtp", "dflash", "eagle3")
    assert method_info("eagle3").drafter == "an EAGLE-3 drafter"
    assert method_info("dflash").drafter == "a DFlash drafter"


def test_engines_filter_the_names():
    assert method_names("torch") == method_names("llama.cpp") == method_names()
    assert method_names("no such engine") == ()


@pytest.mark.parametrize("config, kind", [
    ({"architectures": ["DFlashDraftModel"]}, "dflash"),
    ({"architectures": ["Qwen3ForCausalLM"], "dflash_config": {}}, "dflash"),
    ({"architectures": ["Qwen3DSparkModel"], "markov_rank": 256}, "dflash"),
    ({"architectures": ["LlamaForCausalLMEagle3"]}, "eagle3"),
    ({"draft_vocab_size": 32000}, "eagle3"),
    ({"architectures": ["LlamaForCausalLM"]}, None),
    ({"architectures": "not a list"}, None),
])
def test_a_drafter_checkpoint_is_known_by_its_methods_config_keys(config, kind):
    assert drafter_for_config(config) == kind


def test_a_row_that_contradicts_itself_is_refused():
    with pytest.raises(ValueError, match="takes must be one of"):
        MethodInfo("x", "x", "", takes="a file")
    with pytest.raises(ValueError, match="needs its short name"):
        MethodInfo("x", "x", "", takes="drafter_file")


# --- adding a method: one row in the table, one proposer ---------------------------------------
class ScriptProposer:
    """Drafts the tokens of a script, position by position after the prompt: a method that needs
    no model, so its drafts (right or wrong) are fully known to the test."""

    def __init__(self, script: list[int]):
        self.script, self.start = script, 0
        self.counters = ProposerCounters()

    def begin(self, prompt) -> None:
        self.start = len(prompt)

    def propose(self, context, k: int) -> Draft:
        at = len(context) - self.start
        draft = tuple(self.script[at:at + k])
        self.counters.record_proposal(len(draft), 0.0)
        return Draft(tokens=draft)

    def accept(self, n_accepted: int, committed) -> None:
        self.counters.record_accepted(n_accepted)

    def stats(self) -> dict:
        return self.counters.as_dict()


SCRIPTS: list[list[int]] = [[]]  # what the script method drafts: set by the test that runs it


def script_proposer(engine, spec) -> ScriptProposer:
    """The script method's shared proposer (its row's `shared`): needs no model, on any engine."""
    return ScriptProposer(SCRIPTS[0])


SCRIPT = MethodInfo("script", "script (drafts a fixed text)", "Drafts the tokens of a script; needs no model.",
                    shared=(__name__, "script_proposer"))


@pytest.fixture
def script_method():
    """The one place a method is added: its row in the table, naming its proposer in this file."""
    SCRIPTS[0] = []
    with registered(SCRIPT):
        yield SCRIPTS
    assert "script" not in METHODS  # gone with the block


def test_an_added_method_is_a_request_auto_may_choose(script_method):
    assert "script" in method_names() and "script" in proposing_methods()
    assert SpecConfig(method="script", k=3).method == "script"
    assert SpecConfig(method="auto", auto_methods=("script", "ngram")).auto_methods == ("script", "ngram")
    assert not uses_file("script") and not needs_draft_model("script")


def test_an_added_method_is_in_the_apps_picker_with_its_help(qtbot, script_method):
    from specdesk.app.storage.settings import Settings
    from specdesk.ui.controls import ControlsPanel

    panel = ControlsPanel(Settings())
    qtbot.addWidget(panel)
    index = panel.method_combo.findData("script")
    assert panel.method_combo.itemText(index) == "script (drafts a fixed text)"
    panel.set_supported_methods(("none", "script"), "llama.cpp")
    assert panel.method_combo.model().item(index).toolTip() == SCRIPT.help
    panel.method_combo.setCurrentIndex(index)
    assert panel.spec(draft_path="ignored.gguf") == SpecConfig(method="script", k=panel.k_spin.value())


def test_an_added_method_runs_on_the_engine_and_changes_no_token(script_method, demo_family):
    from specdesk.engines.llama.engine import LlamaEngine

    from llama_helpers import generate_tokens

    engine = LlamaEngine(demo_family["target_gguf"], n_ctx=256, n_threads=1)
    try:
        prompt = engine.tokenize("def fibonacci(n):")
        baseline = generate_tokens(engine, prompt, SpecConfig(), max_tokens=24, stop_at_eos=False)
        # the right text with every third token wrong: some drafts are kept, some refused
        script_method[0] = [t if i % 3 != 2 else (t + 1) % engine.target.n_vocab for i, t in enumerate(baseline)]
        request = GenerationRequest(tuple(prompt), max_tokens=24, spec=SpecConfig(method="script", k=4),
                                    stop_at_eos=False)
        events = list(engine.generate(request, threading.Event()))
    finally:
        engine.close()
    assert [t for e in events for t in e.tokens] == baseline
    drafted, accepted = sum(e.drafted for e in events), sum(e.accepted for e in events)
    assert 0 < accepted < drafted


# --- adding a method that trains: one row, and its code in one file (this one) ---------------------
# A toy drafter: a bigram table, trained by `specdesk train-drafter` and loaded by the PyTorch engine
# through the table alone. Every (module, attribute) its row names is in this file, and nothing
# else in the project learns of it: what docs/ARCHITECTURE.md's "Adding a method" says it takes.
TOY_FILE = "bigram.npy"


def toy_taps(network) -> tuple[int, ...]:
    return ()  # it reads tokens only


def toy_plan(inputs):
    """A (V, V) table of next-token logits, distilled from the target's recorded distributions."""
    import numpy as np
    import torch

    from specdesk.app.training.eagle3 import acceptance, kl_loss
    from specdesk.app.training.methods import Plan, figures

    vocab = inputs.network.config.vocab_size
    table = torch.nn.Embedding(vocab, vocab).to(inputs.device)
    torch.nn.init.zeros_(table.weight)
    held = inputs.batch(inputs.held)

    def step(rng):
        batch = inputs.sample(rng)
        return kl_loss([table(batch.tokens[:, 1:])], batch)

    def evaluate():
        return figures(*acceptance([table(held.tokens[:, 1:])], held))

    def export(folder):
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / TOY_FILE, table.weight.detach().float().cpu().numpy())
        return folder

    return Plan(inputs.method, inputs.taps, table, step, evaluate, export)


def toy_export_gguf(folder, target_gguf, path, from_gguf):
    raise SpecDeskError("the toy drafter runs on the PyTorch engine only")


def load_toy(engine, path):
    """The row's loader for the PyTorch engine: the table's greedy next token for each token."""
    import numpy as np

    return np.load(f"{path}/{TOY_FILE}").argmax(-1)


class ToyProposer:
    """Drafts the table's chain of greedy next tokens from the last token."""

    def __init__(self, following, sampling, rng, p_min):
        self.following = following
        self.counters = ProposerCounters()

    def begin(self, prompt) -> None:
        pass

    def propose(self, context, k: int) -> Draft:
        token, draft = context[-1], []
        for _ in range(k):
            token = int(self.following[token])
            draft.append(token)
        self.counters.record_proposal(len(draft), 0.0)
        return Draft(tokens=tuple(draft))

    def accept(self, n_accepted: int, committed) -> None:
        self.counters.record_accepted(n_accepted)

    def stats(self) -> dict:
        return self.counters.as_dict()


TOY = MethodInfo("toy", "toy (a bigram table)", "A trained table of each token's likeliest successor drafts.",
                 takes="drafter_file", file_required=True, short="toy", engines=frozenset({"torch"}),
                 proposer={"torch": (__name__, "ToyProposer")}, native={"torch": (__name__, "load_toy")},
                 training=Training("a toy bigram drafter", "Toy bigram drafter", taps=(__name__, "toy_taps"),
                                   plan=(__name__, "toy_plan"), export_gguf=(__name__, "toy_export_gguf"), rank=99))


def refs(info: MethodInfo) -> set:
    """Every (module, attribute) a row names."""
    named = [info.shared, *info.proposer.values(), *info.native.values(), *info.problem.values()]
    if info.training is not None:
        t = info.training
        named += [t.taps, t.plan, t.export_gguf, t.refuse, t.check]
    return {ref for ref in named if ref is not None}


def test_adding_a_method_is_its_row_and_one_file():
    """What "Adding a method" in docs/ARCHITECTURE.md counts: the row in engines/methods.py and
    its own files. The toy's row names code in one file, and so does the script method's."""
    assert {module for module, _ in refs(TOY)} == {__name__}
    assert {module for module, _ in refs(SCRIPT)} == {__name__}
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = doc.split("## Adding a method", 1)[1].split("\n## ", 1)[0]
    assert "one row in the method table and one file of its own" in section


def test_a_toy_drafter_trains_and_runs_through_the_table_alone(demo_family, tmp_path):
    pytest.importorskip("torch")
    import argparse
    import json

    from specdesk.app.runtime.generation import run_once
    from specdesk.app.training import cli
    from specdesk.app.training.job import TrainingRequest
    from specdesk.engines.torch.engine import TorchEngine, supported_methods
    from specdesk.engines.types import SamplingParams

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": text, "kind": "code"}) + "\n" for text in (
        "def read_lines(path):\n", "import os\n\n\ndef main():\n", "class Counter:\n    def __init__(self):\n",
        "for name in sorted(names):\n", "def add(a, b):\n    return", "with open(path) as f:\n")))
    out = tmp_path / "run"
    with registered(TOY):
        assert TrainingRequest(demo_family["target_hf"], method="toy").argv()[3] == "toy"  # the dialog's request
        parser = argparse.ArgumentParser()
        cli.add_arguments(parser)
        args = parser.parse_args(["--target", demo_family["target_hf"], "--method", "toy", "--prompts", str(prompts),
                                  "--out", str(out), "--device", "cpu", "--threads", "1", "--max-tokens", "16",
                                  "--compare-prompts", "1", "--compare-tokens", "16", "--batch-size", "4",
                                  "--steps", "30", "--minutes", "1"])
        assert cli.run(args) == 0
        provenance = json.loads((out / "provenance.json").read_text())
        assert provenance["method"] == "toy" and provenance["training"]["steps"] == 30
        assert provenance["reason"].startswith("trained toy: ")
        assert supported_methods(demo_family["target_hf"])["toy"] is None
        engine = TorchEngine(demo_family["target_hf"], device="cpu", dtype="float32")
        tokens = tuple(engine.tokenize("with open(path) as f:\n"))
        runs = [run_once(engine, GenerationRequest(tokens, max_tokens=32, sampling=SamplingParams(temperature=0.0),
                                                   spec=spec))
                for spec in (SpecConfig(), SpecConfig(method="toy", k=3, draft_path=str(out / "toy")))]
        engine.close()
    assert "toy" not in METHODS
    assert runs[0].tokens == runs[1].tokens and runs[1].stats.drafted > 0 and runs[1].stats.accepted > 0


# --- no method is named outside the table and its own files ---------------------------------------
GENERIC = ("none", "auto", "ngram", "draft")  # words of their own too ("draft" model, a role): not searched


def test_no_file_names_a_method_outside_the_table_and_the_methods_own_files():
    """`grep -rnE '"(dflash|dspark|eagle3|mtp|ngram-pool|...)"' app engines ui` lists only
    engines/methods.py and each method's own files: those named after it (engines/llama/dflash.py,
    app/training/dflash.py, app/demo/dflash.py) and those its row lists."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    names = [info.name for info in all_rows() if info.name not in GENERIC]
    literal = re.compile('"(' + "|".join(re.escape(name) for name in names) + ')"')
    offences = []
    for path in sorted(p for folder in ("app", "engines", "ui") for p in (root / folder).rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative == "engines/methods.py":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name in literal.findall(line):
                if path.stem != name.replace("-", "_") and relative not in _own_files(name):
                    offences.append(f"{relative}:{number}: {line.strip()}")
    assert not offences, "method names outside engines/methods.py and the methods' own files:\n" + "\n".join(offences)


def _own_files(name: str) -> tuple[str, ...]:
    from specdesk.engines.methods import own_files

    return own_files(name)
