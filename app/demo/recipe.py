"""The demo family recipe: corpus -> tokenizer -> core target -> distilled draft.

Everything is seeded, so a rerun on the same Python standard library reproduces the
same weights. `train_family` writes what cannot be derived (tokenizer and trained
weights, in fp16) plus a card; `install.py` derives the shipped formats from that.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from . import dflash, dspark, eagle3, mtp
from .config import ModelConfig, TrainConfig, card_entry, llama_config, parameter_count
from .corpus import iter_corpus, split_corpus
from .dflash import DFlashSpec, DFlashTraining
from .files import TRAINED_FILES, sha256_file
from .mtp import MtpTraining
from .tokenizer import CHAT_TEMPLATE, special_ids, train_tokenizer
from .trainer_run import TrainerRun
from .train import log

RECIPE_VERSION = 5  # 2: the target's MTP layer and a DFlash drafter; 3: trained on the engine's Transformer; 4: EAGLE-3;
# 5: DSpark


@dataclass(frozen=True)
class FamilySpec:
    name: str
    vocab_size: int
    core: ModelConfig
    core_training: TrainConfig
    draft: ModelConfig
    draft_training: TrainConfig
    wide_hidden_size: int
    wide_heads: int
    wide_intermediate_size: int
    corpus_bytes: int | None = None  # None: the whole filtered standard library
    mtp_training: MtpTraining | None = None  # the target's MTP layer (app/demo/mtp.py)
    dflash: DFlashSpec | None = None  # the DFlash drafter (app/demo/dflash.py)
    dflash_training: DFlashTraining | None = None
    draft_from_core_layers: tuple[int, ...] | None = None  # start the draft as these core layers
    # Drafters the product's own trainer makes on the core (app/demo/trainer_run.py), by method:
    # eagle3, dspark, and mtp or dflash, which then replace the recipe's own (mtp_training, dflash_training)
    trainer_drafters: tuple[tuple[str, TrainerRun], ...] = ()

    def key(self) -> str:
        """Identifies the recipe: a cached build is reused only under the same key."""
        blob = json.dumps({"version": RECIPE_VERSION, "spec": asdict(self),
                           "python": sys.version_info[:2]}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


DFLASH_STEPS = 15000  # the DFlash drafter, two layers, from the same recording as DSpark's (the same target layers)
EAGLE3_STEPS = 4000  # about 30 minutes on 2 cores: four passes over the 3,797 answers of the corpus prompts
DSPARK_STEPS = 12000  # about 20 minutes on 2 cores (a step is one layer over 16 blocks of 8 rows for 8 answers)

FULL = FamilySpec(
    name="full",
    vocab_size=4096,
    core=llama_config(vocab_size=4096, hidden_size=256, num_hidden_layers=8, num_attention_heads=4,
                      intermediate_size=688, head_dim=64, max_position_embeddings=512),
    core_training=TrainConfig(steps=3000, batch_size=8, seq_len=512, peak_lr=2e-3, warmup_steps=100,
                              eval_every=250, seed=1234),
    # The draft: six of the core's eight layers (the last kept: it feeds the shared head), then
    # distilled from the core.
    draft=llama_config(vocab_size=4096, hidden_size=256, num_hidden_layers=6, num_attention_heads=4,
                       intermediate_size=688, head_dim=64, max_position_embeddings=512),
    draft_training=TrainConfig(steps=500, batch_size=8, seq_len=512, peak_lr=1e-3, warmup_steps=20,
                               weight_decay=0.0, eval_every=250, seed=4321),
    draft_from_core_layers=(0, 1, 2, 3, 4, 7),
    wide_hidden_size=768,
    wide_heads=12,
    wide_intermediate_size=2064,
    mtp_training=MtpTraining(steps=1000),
    trainer_drafters=((eagle3.METHOD, TrainerRun(steps=EAGLE3_STEPS, prompts="corpus", corpus_prompts=4000)),
                      (dspark.METHOD, TrainerRun(steps=DSPARK_STEPS, prompts="corpus", corpus_prompts=4000)),
                      (dflash.METHOD, TrainerRun(steps=DFLASH_STEPS, prompts="corpus", corpus_prompts=4000, layers=2,
                                           cooldown=0.2, precision="auto"))),
)

SMALL = FamilySpec(
    name="small",
    vocab_size=1024,
    core=llama_config(vocab_size=1024, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=176, head_dim=32, max_position_embeddings=256),
    core_training=TrainConfig(steps=300, batch_size=16, seq_len=128, peak_lr=4e-3, warmup_steps=20,
                              eval_every=300, seed=1234),
    draft=llama_config(vocab_size=1024, hidden_size=48, num_hidden_layers=1, num_attention_heads=1,
                       intermediate_size=128, head_dim=48, max_position_embeddings=256),
    draft_training=TrainConfig(steps=200, batch_size=16, seq_len=128, peak_lr=4e-3, warmup_steps=20,
                               eval_every=200, seed=4321),
    wide_hidden_size=192,
    wide_heads=6,
    wide_intermediate_size=528,
    corpus_bytes=1_500_000,
    mtp_training=MtpTraining(steps=120, batch_size=16, seq_len=128, peak_lr=4e-3, warmup_steps=10),
    dflash=DFlashSpec(num_layers=1, num_heads=2, head_dim=32, intermediate_size=176, block_size=6,
                      target_layer_ids=(0, 1), mask_token_id=0),
    dflash_training=DFlashTraining(steps=120, batch_size=16, seq_len=128, blocks_per_sequence=8, peak_lr=4e-3,
                                   warmup_steps=10),
    trainer_drafters=tuple((method, TrainerRun(steps=4, max_prompts=8, max_tokens=16, batch_size=4, eval_every=2))
                           for method in (eagle3.METHOD, dspark.METHOD)),
)

FAMILIES = {"full": FULL, "small": SMALL}


def _encode(tokenizer, texts: list[str], bos: int, eos: int) -> np.ndarray:
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(texts):
        ids.append(bos)
        ids.extend(encoding.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16)


def prepare_data(spec: FamilySpec, workdir: Path):
    """Corpus and tokenizer; cached in workdir so a resumed run skips them."""
    from tokenizers import Tokenizer

    files = iter_corpus()
    train_files, held_out_files = split_corpus(files)
    if spec.corpus_bytes is not None:
        kept, total = [], 0
        for f in train_files:  # sorted by path: the same subset every time
            if total >= spec.corpus_bytes:
                break
            kept.append(f)
            total += len(f.text)
        train_files = kept
    tokenizer_path = workdir / "tokenizer.json"
    if tokenizer_path.exists():
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
    else:
        tokenizer = train_tokenizer([f.text for f in train_files], spec.vocab_size)
        tokenizer.save(str(tokenizer_path))
    bos, eos = special_ids(tokenizer)
    train_tokens = _encode(tokenizer, [f.text for f in train_files], bos, eos)
    held_out_tokens = _encode(tokenizer, [f.text for f in held_out_files], bos, eos)
    stats = {"train_files": len(train_files), "held_out_files": len(held_out_files),
             "train_tokens": int(len(train_tokens)), "held_out_tokens": int(len(held_out_tokens)),
             "train_bytes": sum(len(f.text.encode()) for f in train_files)}
    return tokenizer, train_tokens, held_out_tokens, stats


def train_family(spec: FamilySpec, workdir: Path, progress=None) -> dict:
    """Run the whole recipe into workdir; returns the card (also written as card.json)."""
    import torch
    from safetensors.torch import save_file

    from .train import pruned_state, train

    torch.set_num_threads(max(1, torch.get_num_threads()))
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    log({"event": "stage", "stage": "corpus and tokenizer", "family": spec.name})
    tokenizer, train_tokens, held_out_tokens, data_stats = prepare_data(spec, workdir)
    log({"event": "data", **data_stats})

    def stage_progress(stage):
        return None if progress is None else (lambda done, total, loss: progress(stage, done, total, loss))

    log({"event": "stage", "stage": "core", "family": spec.name})
    core, core_info = train(spec.core, spec.core_training, train_tokens, held_out_tokens,
                            workdir / "core.ckpt", progress=stage_progress("core"), label="core")
    save_file({k: v.half().contiguous() for k, v in core.state_dict().items()}, str(workdir / "core.safetensors"))
    log({"event": "stage", "stage": "draft", "family": spec.name})
    init = pruned_state(core, spec.draft_from_core_layers) if spec.draft_from_core_layers else None
    draft, draft_info = train(spec.draft, spec.draft_training, train_tokens, held_out_tokens,
                              workdir / "draft.ckpt", teacher=core, progress=stage_progress("draft"), label="draft",
                              init_state=init)
    save_file({k: v.half().contiguous() for k, v in draft.state_dict().items()}, str(workdir / "draft.safetensors"))
    from .train import validation_loss
    with torch.no_grad():
        draft_info["held_out_loss"] = round(validation_loss(draft, held_out_tokens, spec.draft_training.seq_len), 4)

    native = train_native_drafters(spec, core, workdir, train_tokens, held_out_tokens, stage_progress)
    if spec.trainer_drafters:  # the product's trainer, on the core as a GGUF (written here)
        from .trainer_run import core_gguf, run_trainer, save_drafter

        interim = {"core": {"config": card_entry(spec.core)}, "chat_template": CHAT_TEMPLATE, "family": spec.name}
        for method, settings in spec.trainer_drafters:
            log({"event": "stage", "stage": method, "family": spec.name})
            file, take = trainer_drafter(method)
            state, native[method] = run_trainer(method, core_gguf(workdir, interim, workdir), workdir, settings, take)
            save_drafter(state, workdir / file)

    card = {
        "family": spec.name,
        "recipe_key": spec.key(),
        "python": ".".join(map(str, sys.version_info[:3])),
        "chat_template": CHAT_TEMPLATE,
        "data": data_stats,
        "core": {"config": card_entry(spec.core), "parameters": parameter_count(spec.core),
                 "non_embedding_parameters": parameter_count(spec.core, with_embeddings=False), **core_info},
        "draft": {"config": card_entry(spec.draft), "parameters": parameter_count(spec.draft),
                  "distilled_from": "core",
                  "pruned_from_core_layers": list(spec.draft_from_core_layers or ()), **draft_info},
        "wide": {"hidden_size": spec.wide_hidden_size, "num_attention_heads": spec.wide_heads,
                 "intermediate_size": spec.wide_intermediate_size},
        **native,
        "train_seconds": round(time.time() - started, 1),
        "files": {name: sha256_file(workdir / name) for name in TRAINED_FILES},
    }
    (workdir / "card.json").write_text(json.dumps(card, indent=2))
    log({"event": "done", "family": spec.name, "seconds": card["train_seconds"]})
    return card


def train_native_drafters(spec: FamilySpec, core, workdir: Path, train_tokens, held_out_tokens, stage_progress) -> dict:
    """The target's MTP layer and the DFlash drafter, trained on the core by the recipe (unless the
    product's trainer makes them, spec.trainer_drafters); card entries."""
    from dataclasses import asdict

    from safetensors.numpy import save_file

    by_trainer = dict(spec.trainer_drafters)
    native = {}
    if mtp.METHOD not in by_trainer:
        log({"event": "stage", "stage": mtp.METHOD, "family": spec.name})
        layer, native[mtp.METHOD] = mtp.train_mtp(core, spec.core, spec.mtp_training, train_tokens, held_out_tokens,
                                                  stage_progress(mtp.METHOD))
        save_file({k: v.astype(np.float16) for k, v in layer.items()}, str(workdir / mtp.FILE))
    if dflash.METHOD not in by_trainer:
        log({"event": "stage", "stage": dflash.METHOD, "family": spec.name})
        drafter, drafter_info = dflash.train_dflash(core, spec.core, spec.dflash, spec.dflash_training,
                                                    spec.wide_hidden_size, train_tokens, held_out_tokens,
                                                    stage_progress(dflash.METHOD))
        save_file({k: v.astype(np.float16) for k, v in drafter.items()}, str(workdir / dflash.FILE))
        native[dflash.METHOD] = {"spec": asdict(spec.dflash), **drafter_info}
    return native


def trainer_drafter(method: str):
    """(file, take) of a drafter the product's trainer makes for the family."""
    modules = {module.METHOD: module for module in (eagle3, dspark, mtp, dflash)}
    if method not in modules:
        raise ValueError(f"the recipe trains no {method!r} drafter with the product's trainer")
    return modules[method].FILE, modules[method].take


if __name__ == "__main__":
    # recipe.py FAMILY OUT: the whole recipe; recipe.py METHOD FAMILY FOLDER WORKDIR: the drafter the
    # product's trainer makes for METHOD (eagle3, dspark, ...), alone, into the trained family in FOLDER
    if sys.argv[1] not in FAMILIES:
        from .trainer_run import add_to_family

        method, family = sys.argv[1], FAMILIES[sys.argv[2]]
        card = add_to_family(method, *trainer_drafter(method), Path(sys.argv[3]), dict(family.trainer_drafters)[method],
                             Path(sys.argv[4]), recipe_key=family.key())
        print(json.dumps({k: v for k, v in card[method].items() if k != "history"}, indent=2))
    else:
        print(json.dumps(train_family(FAMILIES[sys.argv[1]], Path(sys.argv[2])), indent=2))
