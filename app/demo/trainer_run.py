"""The demo drafters the product's own trainer makes: `specdesk train-drafter` on the core.

The recipe runs the command as a user runs it, against the core written as an F16 GGUF:
llama.cpp answers the prompts (far faster than the PyTorch engine on a CPU), the trainer
records the core's hidden states and top-k log-probabilities and trains the drafter at the
core's width within a step budget (a step budget, so a rerun trains the same steps). What
ships is that drafter at the core's width; installing widens it with the same
function-preserving map as the target (widen.py), so on the demo target it computes what it
computed on the core. eagle3.py and dspark.py say what each method keeps and how it widens.

`python -m specdesk.app.demo.recipe METHOD full FOLDER WORKDIR` trains one such drafter for an
already trained family folder (assets/demo) and adds it to its card, leaving the other
trained files as they are.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .config import from_card
from .files import load_float32


@dataclass(frozen=True)
class TrainerRun:
    """The trainer's settings for one demo drafter."""

    steps: int
    prompts: str = "bundled"  # "bundled": the trainer's own set; "corpus": code cut from the recipe's corpus
    corpus_prompts: int = 1500
    max_prompts: int | None = None  # training prompts answered (None: the whole set)
    max_tokens: int = 96  # answer length per prompt
    batch_size: int = 8
    eval_every: int = 100
    widen_seed: int = 0
    layers: int | None = None  # a DFlash or DSpark drafter's layers (the trainer's --draft-layers; None: its default)
    cooldown: float = 0.0  # the trainer's --cooldown: the last share of the steps over which the rate falls to zero
    precision: str = "float32"  # the trainer's --precision (float32, bfloat16 or auto)


# What a method keeps of the trainer's exported folder: (tensors at the core's width, card fields)
Take = Callable[[Path], tuple[dict[str, np.ndarray], dict]]


def run_trainer(method: str, core_gguf: Path, workdir: Path, settings: TrainerRun, take: Take,
                threads: int | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """Train `method` on the core's GGUF; returns (the drafter's tensors at the core's width, card entry).
    A run whose checkpoint is in workdir is resumed."""
    out = workdir / f"{method}-training"
    argv = ["--target", str(core_gguf), "--method", method, "--out", str(out), "--device", "cpu",
            "--minutes", "1000", "--steps", str(settings.steps), "--max-tokens", str(settings.max_tokens),
            "--batch-size", str(settings.batch_size), "--eval-every", str(settings.eval_every),
            "--compare-prompts", "2", "--compare-tokens", "32",
            "--cooldown", f"{settings.cooldown:g}", "--precision", settings.precision,
            # one recording for the methods that read the same layers (DFlash and DSpark)
            "--cache", str(workdir / "recordings")]
    if settings.max_prompts:
        argv += ["--max-prompts", str(settings.max_prompts)]
    if settings.prompts == "corpus":
        argv += ["--prompts", str(write_corpus_prompts(workdir / "corpus-prompts.jsonl", settings.corpus_prompts))]
    if settings.layers:
        argv += ["--draft-layers", str(settings.layers)]
    if threads:
        argv += ["--threads", str(threads)]
    if (out / "checkpoint.pt").is_file():
        argv.append("--resume")
    started = time.time()
    # The command itself, as a user runs it (its messages go to this process's standard error).
    status = subprocess.run([sys.executable, "-m", "specdesk.app.training.cli", *argv], stdout=subprocess.DEVNULL).returncode
    if status != 0:
        raise RuntimeError(f"training the demo's {method} drafter ended with status {status}")
    provenance = json.loads((out / "provenance.json").read_text(encoding="utf-8"))
    state, fields = take(out / method)
    info = {"trainer": f"specdesk train-drafter --method {method}", "settings": asdict(settings),
            "taps": provenance["training"]["taps"], "steps": provenance["training"]["steps"],
            "best_step": provenance["training"]["best_step"], "sequences": provenance["data"]["sequences"],
            "tokens": provenance["data"]["tokens"],
            "held_out_acceptance_per_position": provenance["held_out_acceptance_per_position"],
            "held_out_mean_accepted": provenance["held_out_mean_accepted"],
            "history": [{"step": h["step"], "seconds": h["seconds"], "acceptance": h["acceptance"]}
                        for h in provenance["training"]["history"]],
            "precision": provenance["training"].get("precision", "float32"),
            "train_seconds": provenance["training"]["seconds"], "run_seconds": round(time.time() - started, 1),
            **fields}
    return state, info


def write_corpus_prompts(path: Path, count: int, seed: int = 3) -> Path:
    """`count` code prompts cut from the training split of the recipe's corpus (the text the core
    learned from): 4 to 16 whole lines ending at a random line, which the core continues."""
    from .corpus import iter_corpus, split_corpus

    train_files, _ = split_corpus(iter_corpus())
    rng = np.random.default_rng(seed)
    prompts: list[str] = []
    seen: set[str] = set()
    while len(prompts) < count:
        lines = train_files[int(rng.integers(len(train_files)))].text.splitlines()
        if len(lines) < 24:
            continue
        end = int(rng.integers(8, len(lines) - 8))
        text = "\n".join(lines[end - int(rng.integers(4, 17)):end]) + "\n"
        if len(text.strip()) < 40 or len(text) > 1200 or text in seen:
            continue
        seen.add(text)
        prompts.append(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": t, "kind": "code"}) + "\n" for t in prompts), encoding="utf-8")
    return path


def core_gguf(trained_dir: Path, card: dict, out_dir: Path) -> Path:
    """The core as an F16 GGUF (through its Hugging Face folder) that the trainer records from."""
    from .export_gguf import export_gguf
    from .export_hf import export_hf

    path = out_dir / "core-F16.gguf"
    if path.is_file():
        return path
    state = load_float32(trained_dir / "core.safetensors")
    export_hf(from_card(card["core"]["config"]), state, trained_dir / "tokenizer.json", card["chat_template"],
              out_dir / "core-hf")
    return export_gguf(out_dir / "core-hf", path, f"SpecDesk demo core ({card.get('family', 'interim')})")


def save_drafter(state: dict[str, np.ndarray], path: Path) -> None:
    """The drafter as shipped: float16 safetensors, tensors in name order."""
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v.astype(np.float16)) for k, v in sorted(state.items())}, str(path))


def add_to_family(method: str, file: str, take: Take, trained_dir: Path, settings: TrainerRun, workdir: Path,
                  threads: int | None = None, recipe_key: str | None = None) -> dict:
    """Train one drafter for a trained family folder and record it in its card; returns the card."""
    from .files import sha256_file

    card_path = trained_dir / "card.json"
    card = json.loads(card_path.read_text(encoding="utf-8"))
    state, info = run_trainer(method, core_gguf(trained_dir, card, workdir), workdir, settings, take, threads)
    save_drafter(state, trained_dir / file)
    card[method] = info
    card["files"][file] = sha256_file(trained_dir / file)
    if recipe_key:
        card["recipe_key"] = recipe_key
    card_path.write_text(json.dumps(card, indent=2))
    return card
