"""A loaded Hugging Face model with its tokenizer, and a sequence evaluated against its cache.

`TorchModel` mirrors the surface of the llama engine's GgufModel that the app reads
(path, vocab, tokenize, token_bytes, token_text, is_eog, chat_template, detokenize), so
the CLI, compare runner and chat code serve both engines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from ..types import SpecDeskError
from .loader import Checkpoint, check_module, load_module, open_checkpoint
from .model import ForwardOutput, Transformer, config_from_hf
from .tokenizer import HfTokenizer


class TorchModel:
    def __init__(self, folder: str | Path, device: str, dtype: torch.dtype):
        self.path = Path(folder)
        self.checkpoint: Checkpoint = open_checkpoint(self.path)
        self.config = config_from_hf(self.checkpoint.config, str(self.checkpoint.config_path))
        self.device, self.dtype = device, dtype
        with torch.device("meta"):
            network = Transformer(self.config)
        check_module(network, self.checkpoint)  # shapes from the headers, before memory is allocated
        network = network.to(dtype=dtype).to_empty(device=device)
        load_module(network, self.checkpoint, dtype=dtype, device=device)
        self.packed_linears = network.pack_for_cpu()  # batched rows read the weights once (cpu_linear.py)
        self.network = network.eval()
        self.tokenizer = HfTokenizer(self.path, self.config.vocab_size)
        self.vocab = self.tokenizer.vocab
        self.n_vocab = self.config.vocab_size
        self.n_ctx_train = self.config.max_position_embeddings
        self.n_params = sum(p.numel() for p in self.network.parameters())
        self.size_bytes = sum(f.stat().st_size for f in self.path.glob("*.safetensors"))

    # --- vocabulary: the same calls as GgufModel ----------------------------
    def tokenize(self, text: str, add_bos: bool | None = None, parse_special: bool = False) -> list[int]:
        return self.tokenizer.tokenize(text, add_bos, parse_special)

    def token_bytes(self, token: int) -> bytes:
        return self.tokenizer.token_bytes(token)

    def token_text(self, token: int) -> str:
        return self.tokenizer.token_text(token)

    def is_eog(self, token: int) -> bool:
        return self.tokenizer.is_eog(token)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.detokenize(tokens)

    def chat_template(self) -> str | None:
        return self.tokenizer.chat_template()

    def close(self) -> None:
        self.network = None


def _free_bytes(device) -> int:
    """Free memory where the cache will live: the CUDA device's, else RAM (CPU, Metal)."""
    from ..memory import ram_available

    if torch.device(device).type == "cuda":
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    return ram_available()


def _check_cache_fits(model: TorchModel, n_ctx: int) -> None:
    """Refuse, before allocating it, a KV cache larger than the free memory."""
    config = model.config
    if n_ctx < 1:
        raise SpecDeskError(f"a context of {n_ctx} tokens is out of range: use 1 or more (or 0 for the model's own)")
    element = torch.empty((), dtype=model.dtype).element_size()
    need = 2 * config.num_hidden_layers * n_ctx * config.num_key_value_heads * config.head_dim * element
    need += 2 * n_ctx * config.head_dim * 8  # rope tables, built in float64
    free = _free_bytes(model.device)
    if free and need > free:
        raise SpecDeskError(f"{model.path}: a context of {n_ctx} tokens needs {need:,} bytes of KV cache but "
                            f"{free:,} bytes of memory are free: use a smaller --ctx")


class TorchContext:
    """One sequence in a static KV cache of n_ctx positions; rollback is by position."""

    def __init__(self, model: TorchModel, n_ctx: int):
        self.model = model
        self.n_ctx = n_ctx
        _check_cache_fits(model, n_ctx)
        model.network.setup_cache(n_ctx)
        self.tokens: list[int] = []  # what the cache holds, position by position

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def rollback(self, n_keep: int) -> None:
        del self.tokens[n_keep:]

    def sync_prefix(self, tokens: Sequence[int]) -> int:
        """Keep the longest cached prefix of `tokens`; returns how many positions were kept."""
        kept = 0
        for a, b in zip(self.tokens, tokens):
            if a != b:
                break
            kept += 1
        self.rollback(kept)
        return kept

    def decode(self, tokens: Sequence[int], taps: Sequence[int] = (), all_logits: bool = True) -> ForwardOutput:
        """Evaluate tokens at the next positions; logits for every row, or only the last."""
        if not tokens:
            raise ValueError("decode needs at least one token")
        if self.n_past + len(tokens) > self.n_ctx:
            raise SpecDeskError(f"the sequence would reach {self.n_past + len(tokens)} tokens; the context holds {self.n_ctx}")
        ids = torch.tensor(list(tokens), dtype=torch.long, device=self.model.device)
        out = self.model.network(ids, self.n_past, taps, logits_from=0 if all_logits else len(tokens) - 1)
        self.tokens.extend(int(t) for t in tokens)
        return out

    def close(self) -> None:
        self.tokens = []
