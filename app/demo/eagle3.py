"""The demo target's EAGLE-3 head: trained on the core by `specdesk train-drafter`, widened.

The recipe runs the product's own trainer (app/training) against the core as an F16 GGUF:
llama.cpp answers the bundled prompts (far faster than the PyTorch engine on a CPU), the
trainer records the core's hidden states and top-k log-probabilities, and trains a head of
the core's width within a step budget. What
ships is that head at the core's width (`eagle3.safetensors`); installing widens it with
the same function-preserving map as the target (widen.py), so on the demo target it
computes exactly what it computed on the core, and writes it as an EAGLE-3 folder whose
lm_head is the target's own.

`python -m specdesk.app.demo.recipe eagle3 full FOLDER WORKDIR` trains the head for a trained
family folder (assets/demo) and adds it to its card, leaving the other trained files as they are.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .config import ModelConfig, from_card
from .dflash import wide_eps
from .widen import NEW_WEIGHT_STD

FILE = "eagle3.safetensors"


@dataclass(frozen=True)
class Eagle3Training:
    """The trainer's settings for the demo head (a step budget, so a rerun trains the same steps)."""

    steps: int
    prompts: str = "bundled"  # "bundled": the trainer's own set; "corpus": code cut from the recipe's corpus
    corpus_prompts: int = 1500
    max_prompts: int | None = None  # training prompts answered (None: the whole set)
    max_tokens: int = 96  # answer length per prompt
    batch_size: int = 8
    eval_every: int = 100
    widen_seed: int = 0


def train_eagle3(core_gguf: Path, workdir: Path, settings: Eagle3Training,
                 threads: int | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """Run the trainer on the core's GGUF; returns (head tensors at the core's width, card entry)."""
    import subprocess

    from safetensors.numpy import load_file

    out = workdir / "eagle3-training"
    argv = ["--target", str(core_gguf), "--method", "eagle3", "--out", str(out), "--device", "cpu",
            "--minutes", "1000", "--steps", str(settings.steps), "--max-tokens", str(settings.max_tokens),
            "--batch-size", str(settings.batch_size), "--eval-every", str(settings.eval_every),
            "--compare-prompts", "2", "--compare-tokens", "32"]
    if settings.max_prompts:
        argv += ["--max-prompts", str(settings.max_prompts)]
    if settings.prompts == "corpus":
        argv += ["--prompts", str(write_corpus_prompts(workdir / "corpus-prompts.jsonl", settings.corpus_prompts))]
    if threads:
        argv += ["--threads", str(threads)]
    if (out / "checkpoint.pt").is_file():
        argv.append("--resume")
    started = time.time()
    # The command itself, as a user runs it (its messages go to this process's standard error).
    status = subprocess.run([sys.executable, "-m", "specdesk.app.training.cli", *argv], stdout=subprocess.DEVNULL).returncode
    if status != 0:
        raise RuntimeError(f"training the demo's EAGLE-3 head ended with status {status}")
    provenance = json.loads((out / "provenance.json").read_text(encoding="utf-8"))
    state = {name: t.astype(np.float32) for name, t in load_file(str(out / "eagle3" / "model.safetensors")).items()}
    state.pop("lm_head.weight", None)  # the target's, frozen: installing takes the widened target's
    state.pop("d2t", None)
    info = {"trainer": "specdesk train-drafter --method eagle3", "settings": asdict(settings),
            "taps": provenance["training"]["taps"], "steps": provenance["training"]["steps"],
            "best_step": provenance["training"]["best_step"], "sequences": provenance["data"]["sequences"],
            "tokens": provenance["data"]["tokens"],
            "held_out_acceptance_per_position": provenance["held_out_acceptance_per_position"],
            "held_out_mean_accepted": provenance["held_out_mean_accepted"],
            "history": [{"step": h["step"], "seconds": h["seconds"], "acceptance": h["acceptance"]}
                        for h in provenance["training"]["history"]],
            "train_seconds": provenance["training"]["seconds"], "run_seconds": round(time.time() - started, 1)}
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


def widen_eagle3(state: dict[str, np.ndarray], core: ModelConfig, wide_hidden: int, seed: int) -> dict[str, np.ndarray]:
    """The head for the widened target: only the hidden dimension grows (heads stay).

    As widen_dflash: hidden-size norms scaled by sqrt(d_core/d_wide) (with the wide eps);
    projections reading the stream get random columns for the new dimensions; projections
    writing it (o_proj, down_proj, fc) zero rows there. q/k/v read cat[embedding, g], so each
    half keeps its core columns at the start of its wide half; fc reads each tapped layer's
    slice of the features from that slice's first d_core columns.
    """
    d, D = core.hidden_size, wide_hidden
    rng = np.random.default_rng(seed)
    scale = np.float32(math.sqrt(d / D))

    def random(shape):
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(NEW_WEIGHT_STD)

    def read_halves(t: np.ndarray, halves: int) -> np.ndarray:
        wide = random((t.shape[0], halves * D))
        for i in range(halves):
            wide[:, i * D:i * D + d] = t[:, i * d:(i + 1) * d]
        return wide

    out: dict[str, np.ndarray] = {}
    for name in sorted(state):
        t = np.asarray(state[name], dtype=np.float32)
        if name.endswith("norm.weight"):  # input_layernorm, hidden_norm, post_attention_layernorm, norm
            out[name] = np.concatenate([t * scale, np.full((D - d,), scale, dtype=np.float32)])
        elif name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):  # (heads*hd, 2d)
            out[name] = read_halves(t, 2)
        elif name.endswith(("gate_proj.weight", "up_proj.weight")):
            out[name] = read_halves(t, 1)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            wide = np.zeros((D, t.shape[1]), dtype=np.float32)
            wide[:d] = t
            out[name] = wide
        elif name == "fc.weight":  # (d, 3d) -> (D, 3D)
            wide = np.zeros((D, 3 * D), dtype=np.float32)
            wide[:d] = read_halves(t, 3)[:d]
            out[name] = wide
        else:
            raise ValueError(f"widen_eagle3: unexpected tensor {name!r}")
    return out


def hf_config(core: ModelConfig, taps, hidden_size: int) -> dict:
    """config.json of the widened head: the trainer's, at the wide width and eps."""
    from specdesk.app.training.eagle3_config import hf_config as trainer_config

    config = trainer_config(core, taps)
    config.update({"hidden_size": hidden_size, "rms_norm_eps": wide_eps(core, hidden_size)})
    return config


def export_eagle3_hf(trained_dir, card: dict, target_hf, out_dir) -> None:
    """The widened head as an EAGLE-3 folder for the demo target (its lm_head the target's)."""
    import shutil

    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    from .export_hf import atomic_path, write_json_atomic

    trained_dir, target_hf, out_dir = Path(trained_dir), Path(target_hf), Path(out_dir)
    core = from_card(card["core"]["config"])
    wide_hidden = card["wide"]["hidden_size"]
    state = {name: t.astype(np.float32) for name, t in load_file(str(trained_dir / FILE)).items()}
    wide = widen_eagle3(state, core, wide_hidden, seed=card["eagle3"]["settings"]["widen_seed"])
    with safe_open(str(target_hf / "model.safetensors"), framework="numpy") as target:  # its head only
        wide["lm_head.weight"] = target.get_tensor("lm_head.weight").astype(np.float32)
    if out_dir.is_dir():
        shutil.rmtree(out_dir)
    write_json_atomic(out_dir / "config.json", hf_config(core, card["eagle3"]["taps"], wide_hidden))
    weights = {name: np.ascontiguousarray(t.astype(np.float16)) for name, t in sorted(wide.items())}
    with atomic_path(out_dir / "model.safetensors") as tmp:
        save_file(weights, str(tmp), metadata={"format": "pt"})


def core_gguf(trained_dir: Path, card: dict, out_dir: Path) -> Path:
    """The core as an F16 GGUF (through its Hugging Face folder) that the trainer records from."""
    from safetensors.numpy import load_file

    from .export_gguf import export_gguf
    from .export_hf import export_hf

    path = out_dir / "core-F16.gguf"
    if path.is_file():
        return path
    state = {name: t.astype(np.float32) for name, t in load_file(str(trained_dir / "core.safetensors")).items()}
    export_hf(from_card(card["core"]["config"]), state, trained_dir / "tokenizer.json", card["chat_template"],
              out_dir / "core-hf")
    return export_gguf(out_dir / "core-hf", path, f"SpecDesk demo core ({card.get('family', 'interim')})")


def add_to_family(trained_dir: Path, settings: Eagle3Training, workdir: Path, threads: int | None = None,
                  recipe_key: str | None = None) -> dict:
    """Train the head for a trained family folder and record it in its card; returns the card."""
    from safetensors.numpy import save_file

    from .files import sha256_file

    card_path = trained_dir / "card.json"
    card = json.loads(card_path.read_text(encoding="utf-8"))
    state, info = train_eagle3(core_gguf(trained_dir, card, workdir), workdir, settings, threads)
    save_file({k: np.ascontiguousarray(v.astype(np.float16)) for k, v in sorted(state.items())},
              str(trained_dir / FILE))
    card["eagle3"] = info
    card["files"][FILE] = sha256_file(trained_dir / FILE)
    if recipe_key:
        card["recipe_key"] = recipe_key
    card_path.write_text(json.dumps(card, indent=2))
    return card

