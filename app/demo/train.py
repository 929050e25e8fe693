"""The demo family's training (CPU friendly, deterministic): one loop for every part.

The core, the draft, the MTP layer and the DFlash drafter all run `fit` with their own loss.
The network is the engine's (engines/torch/model.py's Transformer, through its training
pass), so what the recipe trains is exactly what the PyTorch engine serves.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from specdesk.engines.torch.model import Transformer

from .config import ModelConfig, TrainConfig

# A loss: (batch (B, seq_len + 1) token ids, the loop's rng) -> (loss, figures to log).
# The rng is the loop's own, so extra draws (DFlash's anchors) resume with a checkpoint.
LossFn = Callable[[torch.Tensor, np.random.Generator], tuple[torch.Tensor, dict]]
Progress = Callable[[int, int, float], None]


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


def init_weights(module: nn.Module, seed: int, n_layers: int) -> None:
    """GPT-2's initialisation from a generator of its own: norms at one, other weights
    N(0, 0.02), the projections that write the residual stream scaled by 1/sqrt(2 n_layers)."""
    generator = torch.Generator().manual_seed(seed)
    residual_std = 0.02 / math.sqrt(2 * n_layers)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                std = residual_std if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                param.copy_(torch.randn(param.shape, generator=generator) * std)


def token_logits(model: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    """(B, T, vocab) float32 next-token logits of tokens (B, T) at positions 0..T-1."""
    return model.logits(model.hidden_states(tokens)[0])


@torch.no_grad()
def validation_loss(model: Transformer, tokens: np.ndarray, seq_len: int, max_windows: int = 256) -> float:
    """Mean next-token loss (nats) over consecutive non-overlapping windows."""
    n_windows = min(max_windows, (len(tokens) - 1) // seq_len)
    total, count = 0.0, 0
    for start in range(0, n_windows * seq_len, seq_len * 8):
        rows = [tokens[s:s + seq_len + 1] for s in range(start, min(start + 8 * seq_len, n_windows * seq_len), seq_len)]
        batch = torch.from_numpy(np.stack(rows).astype(np.int64))
        logits = token_logits(model, batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum")
        total += loss.item()
        count += batch[:, 1:].numel()
    return total / count


def log(event: dict) -> None:
    print(json.dumps(event), file=sys.stderr, flush=True)


def _rounded(figures: dict) -> dict:
    return {k: [round(x, 4) for x in v] if isinstance(v, list) else round(v, 4) for k, v in figures.items()}


def fit(
    module: nn.Module,
    loss_fn: LossFn,
    settings: TrainConfig,
    tokens: np.ndarray,
    label: str,
    evaluate: Callable[[], dict] | None = None,
    checkpoint_path: Path | None = None,
    progress: Progress | None = None,
) -> list[dict]:
    """Train module's trainable parameters on loss_fn over batches of `tokens`; returns the
    evaluation history.

    AdamW with warmup and a cosine decay, gradient clipping, bf16 autocast. Every eval
    interval (and at the end) `evaluate()` adds its figures to the history and, given a
    checkpoint_path, a checkpoint is written, so an interrupted run resumes where it stopped
    and reaches the same weights.
    """
    torch.manual_seed(settings.seed)
    trainable = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        [{"params": [p for p in trainable if p.dim() >= 2], "weight_decay": settings.weight_decay},
         {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0}],
        lr=settings.peak_lr, betas=(0.9, 0.95), eps=1e-8,
    )
    rng = np.random.default_rng(settings.seed)
    start_step, history = 0, []
    if checkpoint_path is not None and checkpoint_path.exists():
        state = torch.load(checkpoint_path, weights_only=False)
        module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        rng.bit_generator.state = state["rng"]
        start_step, history = state["step"], state["history"]
        log({"event": "resume", "label": label, "step": start_step})
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=settings.bf16)
    started = time.time()
    for step in range(start_step, settings.steps):
        lr = learning_rate(step, settings)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = sample_batch(tokens, settings.batch_size, settings.seq_len, rng)
        with autocast:
            loss, figures = loss_fn(batch, rng)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, settings.grad_clip)
        optimizer.step()
        done = step + 1
        if progress is not None:
            progress(done, settings.steps, loss.item())
        if done % 25 == 0 or done == settings.steps:
            log({"event": "step", "label": label, "step": done, "loss": round(loss.item(), 4), **_rounded(figures),
                 "lr": round(lr, 6), "s_per_step": round((time.time() - started) / (done - start_step), 3)})
        if done % settings.eval_every == 0 or done == settings.steps:
            with torch.no_grad():
                entry = {"step": done, **_rounded(evaluate() if evaluate is not None else {})}
            history.append(entry)
            log({"event": "eval", "label": label, **entry})
            if checkpoint_path is not None:
                tmp = checkpoint_path.with_suffix(".tmp")
                torch.save({"model": module.state_dict(), "optimizer": optimizer.state_dict(),
                            "rng": rng.bit_generator.state, "step": done, "history": history}, tmp)
                tmp.replace(checkpoint_path)
    return history


def next_token_loss(model: Transformer) -> LossFn:
    def loss(batch: torch.Tensor, rng: np.random.Generator) -> tuple[torch.Tensor, dict]:
        logits = token_logits(model, batch[:, :-1])  # (B, T, vocab)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)), {}
    return loss


def distillation_loss(student: Transformer, teacher: Transformer) -> LossFn:
    """KL(teacher || student) over next-token distributions, per token."""
    def loss(batch: torch.Tensor, rng: np.random.Generator) -> tuple[torch.Tensor, dict]:
        inputs = batch[:, :-1]
        with torch.no_grad():
            teacher_logp = F.log_softmax(token_logits(teacher, inputs), dim=-1)
        student_logp = F.log_softmax(token_logits(student, inputs), dim=-1)
        vocab = student_logp.shape[-1]
        return F.kl_div(student_logp.reshape(-1, vocab), teacher_logp.reshape(-1, vocab),
                        log_target=True, reduction="batchmean"), {}
    return loss


def train(
    model_config: ModelConfig,
    train_config: TrainConfig,
    train_tokens: np.ndarray,
    held_out_tokens: np.ndarray,
    checkpoint_path: Path,
    teacher: Transformer | None = None,
    progress: Progress | None = None,
    label: str = "model",
    init_state: dict | None = None,
) -> tuple[Transformer, dict]:
    """Train from scratch (or from `init_state`), or distil from `teacher` (KL to its
    next-token distribution)."""
    model = Transformer(model_config)
    init_weights(model, train_config.seed, model_config.num_hidden_layers)
    if init_state is not None:
        model.load_state_dict(init_state)
    if teacher is not None:
        teacher.requires_grad_(False)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=train_config.bf16)

    def evaluate() -> dict:
        with autocast:
            return {"val_loss": validation_loss(model, held_out_tokens, train_config.seq_len)}

    loss = next_token_loss(model) if teacher is None else distillation_loss(model, teacher)
    history = fit(model, loss, train_config, train_tokens, label, evaluate, checkpoint_path, progress)
    info = {
        "steps": train_config.steps,
        "tokens_seen": train_config.steps * train_config.batch_size * train_config.seq_len,
        "held_out_loss": history[-1]["val_loss"] if history else None,
        "history": history,
    }
    return model, info


def pruned_state(core: Transformer, layers: tuple[int, ...]) -> dict:
    """The core's weights with only `layers` kept (renumbered 0..): a draft that starts as a
    layer-pruned copy of the core, then is distilled from it (as Llama 3.2 1B was pruned from
    and distilled from Llama 3.1 8B)."""
    state = {}
    for name, value in core.state_dict().items():
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
