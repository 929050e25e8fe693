"""Self-distillation data: the target answers prompts, and what a drafter learns from is kept.

For each prompt the target generates a greedy answer (its engine, as in a chat), then one pass
over prompt + answer (PyTorch's, or llama.cpp's for a GGUF target: gguf_target.LlamaPass)
records, per position, the hidden states the method reads (`taps`: H[i], the residual stream
entering layer i; H[L], the last layer's output, is what MTP reads through the final norm, and
llama.cpp gives it only up to its scale, which that norm removes) and the target's top-k
log-probabilities of the next token. Sequences are stored one file each in a cache folder
whose total size is bounded; recording stops when the next sequence would pass the bound.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from specdesk.engines.types import GenerationRequest, SamplingParams, SpecDeskError

from .prompts import Prompt

MANIFEST = "cache.json"


@dataclass(frozen=True)
class RecordSettings:
    taps: tuple[int, ...]  # target layers whose input H[i] the drafter reads (H[L]: the last layer's output)
    top_k: int = 32
    max_new_tokens: int = 96
    limit_bytes: int = 2 * 2**30

    def bytes_per_token(self, hidden_size: int) -> int:
        """fp16 taps, int32 top-k ids, fp16 top-k log-probabilities, int32 token."""
        return 2 * hidden_size * len(self.taps) + 6 * self.top_k + 4


def cache_key(target: Path, prompts: Sequence[Prompt], settings: RecordSettings) -> str:
    """A cache is reused only for the same target weights, prompts and settings."""
    h = hashlib.sha256(json.dumps({"taps": settings.taps, "top_k": settings.top_k,
                                   "max_new_tokens": settings.max_new_tokens}).encode())
    weights = [Path(target)] if Path(target).is_file() else sorted(Path(target).glob("*.safetensors"))
    for f in weights:
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{int(st.st_mtime)}".encode())
    for p in prompts:
        h.update(p.kind.encode() + b"\0" + p.text.encode("utf-8") + b"\0")
    return h.hexdigest()[:16]


def estimate_bytes(n_prompts: int, prompt_tokens: int, settings: RecordSettings, hidden_size: int) -> int:
    """What recording n prompts of about prompt_tokens tokens each takes at most, within the limit."""
    per_sequence = (prompt_tokens + settings.max_new_tokens) * settings.bytes_per_token(hidden_size)
    return min(settings.limit_bytes, n_prompts * per_sequence)


@dataclass(frozen=True)
class Recorded:
    tokens: np.ndarray  # (T,) int64
    features: np.ndarray  # (T, n_taps * d) float16: H[taps] concatenated per position
    top_ids: np.ndarray  # (T, k) int32: the target's top-k next tokens at each position
    top_logp: np.ndarray  # (T, k) float16: their log-probabilities
    answer_start: int  # first position of the generated answer


def _save(path: Path, seq: Recorded) -> int:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        np.savez(f, tokens=seq.tokens.astype(np.int32), features=seq.features, top_ids=seq.top_ids,
                 top_logp=seq.top_logp, answer_start=np.int64(seq.answer_start))
    os.replace(tmp, path)
    return path.stat().st_size


def load_sequence(path: Path) -> Recorded:
    with np.load(path) as data:
        return Recorded(data["tokens"].astype(np.int64), data["features"], data["top_ids"], data["top_logp"],
                         int(data["answer_start"]))


def training_network(engine):
    """The engine's target weights as a Transformer without a KV cache (its training pass), sharing
    the engine's tensors rather than copying them."""
    import torch

    from specdesk.engines.torch.model import Transformer

    source = engine.target.network
    with torch.device("meta"):
        network = Transformer(source.config)
    network.load_state_dict(source.state_dict(), assign=True)
    return network.eval().requires_grad_(False)


def prompt_tokens(engine, prompt: Prompt) -> list[int]:
    """Code is continued as raw text; everything else is a user message in the chat template
    when the target has one."""
    from specdesk.app.chat.prompting import chat_prompt, text_tokens

    if prompt.kind == "code" or not engine.target.chat_template():
        return text_tokens(engine, prompt.text)
    return chat_prompt(engine, [{"role": "user", "content": prompt.text}])


class TorchPass:
    """The recording pass on PyTorch: the engine's target as a training network;
    `__call__(tokens)` returns the taps' features, top-k ids and top-k log-probabilities."""

    def __init__(self, engine, taps: Sequence[int], top_k: int):
        self.network, self.taps, self.top_k = training_network(engine), tuple(taps), top_k

    def __call__(self, tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        import torch

        network = self.network
        sequence = torch.as_tensor(list(tokens), dtype=torch.long, device=network.model.embed_tokens.weight.device)
        with torch.no_grad():
            hidden, taps = network.hidden_states(sequence[None], taps=self.taps)
            logp = torch.log_softmax(network.logits(hidden[0]), dim=-1)  # (T, V)
            top_logp, top_ids = logp.topk(min(self.top_k, logp.shape[-1]), dim=-1)
            # (T, n_taps * d); a draft model reads no hidden states: (T, 0)
            features = torch.cat([taps[i][0] for i in self.taps], dim=-1) if self.taps else hidden[0, :, :0]
        return features.half().cpu().numpy(), top_ids.int().cpu().numpy(), top_logp.half().cpu().numpy()

    def close(self) -> None:
        pass


def record_one(engine, pass_over, prompt: Prompt, settings: RecordSettings) -> Recorded:
    """The target's greedy answer to `prompt`, then `pass_over` (TorchPass or the GGUF target's
    LlamaPass) over prompt + answer."""
    from specdesk.app.runtime.generation import run_once

    tokens = prompt_tokens(engine, prompt)
    engine.reset_chat()
    result = run_once(engine, GenerationRequest(tuple(tokens), max_tokens=settings.max_new_tokens,
                                                sampling=SamplingParams(temperature=0.0)))
    sequence = tokens + list(result.tokens)
    features, top_ids, top_logp = pass_over(sequence)
    return Recorded(np.asarray(sequence, dtype=np.int64), features, top_ids, top_logp, len(tokens))


Report = Callable[[str], None]


def record(engine, prompts: Sequence[Prompt], settings: RecordSettings, folder: Path, name: str,
           report: Optional[Report] = None, progress: Optional[Callable[[dict], None]] = None,
           should_stop: Optional[Callable[[], bool]] = None, pass_over=None) -> list[Path]:
    """Record `prompts` into folder/name-NNNNN.npz (kept across runs: a resumed run records only
    what is missing); returns the files, in prompt order, stopping at the size limit or when
    `should_stop` says so (a pause: what is recorded stays). `progress` gets
    {"phase": "record", "set": name, "done": i, "total": n} after each prompt. `pass_over`
    makes the recorded rows (default: TorchPass over the PyTorch engine's target)."""
    report = report or (lambda message: None)
    progress = progress or (lambda event: None)
    should_stop = should_stop or (lambda: False)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.tmp-*"):
        stale.unlink(missing_ok=True)
    pass_over = pass_over or TorchPass(engine, settings.taps, settings.top_k)
    files, used = [], sum(p.stat().st_size for p in folder.glob("*.npz"))
    for index, prompt in enumerate(prompts):
        path = folder / f"{name}-{index:05d}.npz"
        if path.is_file():
            files.append(path)
            continue
        if should_stop():
            break
        try:
            sequence = record_one(engine, pass_over, prompt, settings)
        except SpecDeskError as e:
            report(f"skipping prompt {index + 1} ({e})")
            continue
        expected = sequence.features.nbytes + sequence.top_ids.nbytes + sequence.top_logp.nbytes
        if used + expected > settings.limit_bytes:
            report(f"the cache reached its limit of {settings.limit_bytes / 2**20:.0f} MiB after {len(files)} "
                   f"{name} sequences")
            break
        used += _save(path, sequence)
        files.append(path)
        progress({"phase": "record", "set": name, "done": index + 1, "total": len(prompts)})
        if (index + 1) % 25 == 0 or index + 1 == len(prompts):
            report(f"recorded {index + 1}/{len(prompts)} {name} prompts ({used / 2**20:.1f} MiB)")
    return files
