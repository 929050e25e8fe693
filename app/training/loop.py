"""The time-budgeted training loop: AdamW with warmup and a cooldown, held-out evaluation, the
best state kept, and checkpoints that a killed run resumes from.

The learning rate warms up over the first steps, holds, and with a cooldown falls linearly to
zero over the last share of the budget (time or steps, whichever runs out first): a run of any
length ends annealed, which a constant rate never does (warmup-stable-decay).

The budget counts training steps and held-out evaluations (recording data before and
measuring after come on top of it); it is carried in the checkpoint, so a resumed run
spends only what the killed one left. A pause (`should_stop`) checkpoints after the step in
hand and returns; `--resume` continues from there.
"""

from __future__ import annotations

import copy
import io
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from .precision import autocast

CHECKPOINT = "checkpoint.pt"


@dataclass(frozen=True)
class LoopSettings:
    minutes: float
    max_steps: Optional[int] = None  # stop after this many steps even with time left
    peak_lr: float = 1e-3
    warmup_steps: int = 20
    eval_seconds: float = 30.0  # evaluate (and checkpoint) at least this often
    eval_every: int = 200  # ... and at least every this many steps
    grad_clip: float = 1.0
    seed: int = 0
    cooldown: float = 0.0  # the last share of the budget over which the rate falls to zero (0: none)
    device: str = "cpu"  # where the steps run: the autocast context's device type
    precision: Optional[torch.dtype] = None  # the steps' forward under this autocast dtype (precision.py); None: float32


def learning_rate(settings: LoopSettings, step: int, elapsed: float) -> float:
    """The rate of step `step` (0-based), begun after `elapsed` seconds of the budget."""
    rate = settings.peak_lr * min(1.0, (step + 1) / max(1, settings.warmup_steps))
    if settings.cooldown <= 0:
        return rate
    spent = elapsed / (settings.minutes * 60.0) if settings.minutes > 0 else 0.0
    if settings.max_steps:
        spent = max(spent, step / settings.max_steps)
    return rate * min(1.0, max(0.0, 1.0 - spent) / settings.cooldown)


@dataclass
class LoopState:
    step: int = 0
    elapsed: float = 0.0  # training seconds spent, across resumed runs
    best_score: float = -1.0
    best_step: int = 0
    best_state: Optional[dict] = None
    history: list = field(default_factory=list)
    paused: bool = False  # the run stopped at a pause, checkpointed, before its budget was spent


# (rng) -> (loss, figures): one training batch
StepFn = Callable[[np.random.Generator], tuple[torch.Tensor, dict]]
# () -> (score, figures): held-out evaluation; higher score is better
EvalFn = Callable[[], tuple[float, dict]]
Report = Callable[[str], None]
# {"phase": "train", "step", "loss", "elapsed_s", "budget_s"[, "acceptance"]}: after each step and evaluation
Progress = Callable[[dict], None]


def format_left(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}:{seconds % 60:02d}"


def progress_line(state: LoopState, loss: float, figures: dict, budget_s: float) -> str:
    accepted = figures.get("acceptance")
    shown = "-" if not accepted else "/".join(f"{a:.2f}" for a in accepted)
    mean = f" (mean accepted {sum(accepted):.2f})" if accepted else ""
    return (f"step {state.step} · loss {loss:.4f} · held-out acceptance {shown}{mean} · "
            f"{format_left(budget_s - state.elapsed)} left")


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    with open(tmp, "wb") as f:
        f.write(buffer.getvalue())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def train_loop(module: torch.nn.Module, step_fn: StepFn, eval_fn: EvalFn, settings: LoopSettings, folder: Path,
               resume: bool, report: Report, live: Optional[Callable[[str], None]] = None,
               progress: Optional[Progress] = None,
               should_stop: Optional[Callable[[], bool]] = None) -> LoopState:
    """Train until the budget (or max_steps) is spent; `module` ends holding the best evaluated
    state. With `resume`, continue from folder/checkpoint.pt when it is there. When
    `should_stop` says so, the run checkpoints after the step in hand and returns with
    `paused` set (the module as it is, not the best state)."""
    trainable = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=settings.peak_lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng = np.random.default_rng(settings.seed)
    checkpoint = folder / CHECKPOINT
    state = _restore(checkpoint, module, optimizer, rng, report) if resume and checkpoint.is_file() else LoopState()
    budget = settings.minutes * 60.0
    live = live or (lambda line: None)
    progress = progress or (lambda event: None)
    should_stop = should_stop or (lambda: False)

    def save() -> None:
        _atomic_save({"module": module.state_dict(), "optimizer": optimizer.state_dict(),
                      "rng": rng.bit_generator.state, "state": state}, checkpoint)

    def evaluate_and_save(loss: float) -> float:
        """Returns the seconds it took (counted in the budget, as training steps are)."""
        started = time.perf_counter()
        module.eval()
        with torch.no_grad(), autocast(settings.device, settings.precision):
            score, figures = eval_fn()
        module.train()
        state.history.append({"step": state.step, "loss": None if math.isnan(loss) else round(loss, 5),
                              "seconds": round(state.elapsed, 1),
                              **figures})
        if score > state.best_score:
            state.best_score, state.best_step = score, state.step
            state.best_state = copy.deepcopy({k: v.detach().cpu() for k, v in module.state_dict().items()})
        state.elapsed += time.perf_counter() - started
        save()
        report(progress_line(state, loss, figures, budget))
        progress({"phase": "train", "step": state.step, "loss": None if math.isnan(loss) else loss,
                  "elapsed_s": state.elapsed, "budget_s": budget, **figures})
        return time.perf_counter() - started

    def done() -> bool:
        return state.elapsed >= budget or (settings.max_steps is not None and state.step >= settings.max_steps)

    module.train()
    last_eval_time, last_eval_step, loss_value = state.elapsed, state.step, float("nan")
    eval_cost = 0.0
    if state.step == 0 and not state.history:
        eval_cost = evaluate_and_save(loss_value)  # the untrained drafter is the first candidate
    while not done():
        if should_stop():
            save()
            state.paused = True
            report(f"paused at step {state.step} ({format_left(budget - state.elapsed)} of the budget left): "
                   "run it again with --resume to continue")
            return state
        loss_value = _step(step_fn, optimizer, trainable, settings, state, rng)
        live(f"step {state.step} · loss {loss_value:.4f} · {format_left(budget - state.elapsed)} left")
        progress({"phase": "train", "step": state.step, "loss": loss_value, "elapsed_s": state.elapsed,
                  "budget_s": budget})
        # Evaluations take at most about a tenth of the budget, however slow they are here.
        interval = max(settings.eval_seconds, 9 * eval_cost)
        if state.elapsed - last_eval_time >= interval or state.step - last_eval_step >= settings.eval_every or done():
            eval_cost = evaluate_and_save(loss_value)
            last_eval_time, last_eval_step = state.elapsed, state.step
    if state.best_state is not None:
        module.load_state_dict(state.best_state)
    return state


def _restore(checkpoint: Path, module: torch.nn.Module, optimizer, rng: np.random.Generator,
             report: Report) -> LoopState:
    """The module, optimizer, generator and loop state of a checkpoint, to resume from."""
    saved = torch.load(checkpoint, weights_only=False)
    module.load_state_dict(saved["module"])
    optimizer.load_state_dict(saved["optimizer"])
    rng.bit_generator.state = saved["rng"]
    state = saved["state"]
    state.paused = False
    report(f"resuming from step {state.step} ({format_left(state.elapsed)} trained, best held-out "
           f"mean accepted {state.best_score:.3f} at step {state.best_step})")
    return state


def _step(step_fn: StepFn, optimizer, trainable: list, settings: LoopSettings, state: LoopState,
          rng: np.random.Generator) -> float:
    """One training step at the schedule's learning rate, counted in the state; its loss."""
    started = time.perf_counter()
    lr = learning_rate(settings, state.step, state.elapsed)
    for group in optimizer.param_groups:
        group["lr"] = lr
    with autocast(settings.device, settings.precision):
        loss, figures = step_fn(rng)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trainable, settings.grad_clip)
    optimizer.step()
    state.step += 1
    state.elapsed += time.perf_counter() - started
    return float(loss.detach())


def terminal_live(stream=None) -> Callable[[str], None]:
    """A progress line rewritten in place on a terminal; nothing on a pipe (the evaluations report there)."""
    stream = stream or sys.stderr
    if not stream.isatty():
        return lambda line: None

    def show(line: str) -> None:
        stream.write("\r" + line[:120].ljust(120))
        stream.flush()
    return show
