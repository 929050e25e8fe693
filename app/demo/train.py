"""Training and distillation loops for the demo family (CPU friendly, deterministic)."""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .model import LlamaLM, ModelConfig


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch_size: int
    seq_len: int
    peak_lr: float
    min_lr_ratio: float = 0.05
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 250
    seed: int = 1234
    bf16: bool = True


def learning_rate(step: int, config: TrainConfig) -> float:
    if step < config.warmup_steps:
        return config.peak_lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return config.peak_lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * cosine)


def sample_batch(tokens: np.ndarray, batch_size: int, seq_len: int, rng: np.random.Generator) -> torch.Tensor:
    starts = rng.integers(0, len(tokens) - seq_len - 1, size=batch_size)
    rows = np.stack([tokens[s:s + seq_len + 1] for s in starts]).astype(np.int64)
    return torch.from_numpy(rows)  # (B, T+1)


@torch.no_grad()
def validation_loss(model: LlamaLM, tokens: np.ndarray, seq_len: int, max_windows: int = 256) -> float:
    """Mean next-token loss (nats) over consecutive non-overlapping windows."""
    model.eval()
    n_windows = min(max_windows, (len(tokens) - 1) // seq_len)
    total, count = 0.0, 0
    for start in range(0, n_windows * seq_len, seq_len * 8):
        rows = [tokens[s:s + seq_len + 1] for s in range(start, min(start + 8 * seq_len, n_windows * seq_len), seq_len)]
        batch = torch.from_numpy(np.stack(rows).astype(np.int64))
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum")
        total += loss.item()
        count += batch[:, 1:].numel()
    model.train()
    return total / count


def log(event: dict) -> None:
    print(json.dumps(event), file=sys.stderr, flush=True)


def train(
    model_config: ModelConfig,
    train_config: TrainConfig,
    train_tokens: np.ndarray,
    held_out_tokens: np.ndarray,
    checkpoint_path: Path,
    teacher: LlamaLM | None = None,
    progress: Callable[[int, int, float], None] | None = None,
    label: str = "model",
    init_state: dict | None = None,
) -> tuple[LlamaLM, dict]:
    """Train from scratch (or from `init_state`), or distil from `teacher` (KL to its
    next-token distribution).

    A checkpoint is written every eval interval, so an interrupted run resumes where it
    stopped and reaches the same weights.
    """
    torch.manual_seed(train_config.seed)
    model = LlamaLM(model_config)
    model.init_weights(train_config.seed)
    if init_state is not None:
        model.load_state_dict(init_state, strict=False)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": train_config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=train_config.peak_lr, betas=(0.9, 0.95), eps=1e-8,
    )
    rng = np.random.default_rng(train_config.seed)
    start_step, history = 0, []
    if checkpoint_path.exists():
        state = torch.load(checkpoint_path, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        rng.bit_generator.state = state["rng"]
        start_step, history = state["step"], state["history"]
        log({"event": "resume", "label": label, "step": start_step})
    if teacher is not None:
        teacher.eval()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=train_config.bf16)
    started = time.time()
    for step in range(start_step, train_config.steps):
        lr = learning_rate(step, train_config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = sample_batch(train_tokens, train_config.batch_size, train_config.seq_len, rng)
        inputs, targets = batch[:, :-1], batch[:, 1:]
        with autocast:
            logits = model(inputs)
            if teacher is None:
                loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
            else:
                with torch.no_grad():
                    teacher_logp = F.log_softmax(teacher(inputs).float(), dim=-1)
                student_logp = F.log_softmax(logits.float(), dim=-1)
                loss = F.kl_div(student_logp.reshape(-1, student_logp.shape[-1]),
                                teacher_logp.reshape(-1, teacher_logp.shape[-1]),
                                log_target=True, reduction="batchmean")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train_config.grad_clip)
        optimizer.step()
        done = step + 1
        if progress is not None:
            progress(done, train_config.steps, loss.item())
        if done % 25 == 0:
            log({"event": "step", "label": label, "step": done, "loss": round(loss.item(), 4), "lr": round(lr, 6),
                 "s_per_step": round((time.time() - started) / (done - start_step), 3)})
        if done % train_config.eval_every == 0 or done == train_config.steps:
            with autocast:
                val = validation_loss(model, held_out_tokens, train_config.seq_len)
            history.append({"step": done, "val_loss": round(val, 4)})
            log({"event": "eval", "label": label, "step": done, "val_loss": round(val, 4)})
            tmp = checkpoint_path.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "rng": rng.bit_generator.state, "step": done, "history": history}, tmp)
            tmp.replace(checkpoint_path)
    info = {
        "steps": train_config.steps,
        "tokens_seen": train_config.steps * train_config.batch_size * train_config.seq_len,
        "held_out_loss": history[-1]["val_loss"] if history else None,
        "history": history,
    }
    model.eval()
    return model, info


def pruned_state(core: LlamaLM, layers: tuple[int, ...]) -> dict:
    """The core's weights with only `layers` kept (renumbered 0..): a draft that starts as a
    layer-pruned copy of the core, then is distilled from it (as Llama 3.2 1B was pruned from
    and distilled from Llama 3.1 8B)."""
    state = {}
    for name, value in core.state_dict().items():
        if "rope" in name:
            continue
        if ".layers." in name:
            parts = name.split(".")
            at = parts.index("layers")
            layer = int(parts[at + 1])
            if layer not in layers:
                continue
            parts[at + 1] = str(layers.index(layer))
            name = ".".join(parts)
        state[name] = value.detach().clone().float()
    return state
