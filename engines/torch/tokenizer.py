"""Tokenization for Hugging Face folders: tokenizer.json via the `tokenizers` library, BOS/EOS
and the chat template from tokenizer_config.json (rendered by the app's Jinja sandbox).

`token_bytes` gives the raw bytes of each token (byte-level BPE and SentencePiece byte
fallback both), so the incremental detokenizer can hold back split UTF-8 characters exactly
as it does for GGUF models. Control tokens render as nothing, as llama.cpp does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from ..hf_config import MAX_TOKENIZER_BYTES, read_config  # the limit, and why, are there
from ..types import SpecDeskError
from .loader import read_json

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's printable stand-ins for bytes, reversed: character -> byte value."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


@dataclass(frozen=True)
class VocabInfo:
    vocab_type: str  # "byte-level BPE" or "sentencepiece"
    n_tokens: int
    bos: Optional[int]
    eos: Optional[int]
    add_bos: bool


class HfTokenizer:
    def __init__(self, folder: str | Path, model_vocab_size: Optional[int] = None):
        from tokenizers import Tokenizer

        self.folder = Path(folder)
        path = self.folder / "tokenizer.json"
        if not path.is_file():
            raise SpecDeskError(f"{path} is missing: the PyTorch engine tokenizes with tokenizer.json")
        raw = read_config(path, "tokenizer.json file", MAX_TOKENIZER_BYTES)  # first: sized before any parse
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a plain Exception for malformed files
            raise SpecDeskError(f"{path}: cannot read the tokenizer ({e})") from e
        config_path = self.folder / "tokenizer_config.json"
        self._config = read_json(config_path) if config_path.is_file() else {}
        decoder = raw.get("decoder") or {}
        decoder_types = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", [])}
        self._byte_level = "ByteLevel" in decoder_types
        self._byte_map = _byte_level_decoder() if self._byte_level else {}
        self._special = {t["id"] for t in raw.get("added_tokens", []) if t.get("special")}
        n_tokens = self._tokenizer.get_vocab_size(with_added_tokens=True)
        bos = self._token_id(self._config.get("bos_token"))
        eos = self._token_id(self._config.get("eos_token"))
        self.vocab = VocabInfo("byte-level BPE" if self._byte_level else "sentencepiece", n_tokens, bos, eos,
                               bool(self._config.get("add_bos_token", bos is not None)))
        self.n_vocab = model_vocab_size or n_tokens
        self._eog = {t for t in (eos,) if t is not None} | self._generation_eos()
        self._piece_cache: dict[int, bytes] = {}

    def _token_id(self, token) -> Optional[int]:
        if isinstance(token, dict):
            token = token.get("content")
        return self._tokenizer.token_to_id(token) if isinstance(token, str) else None

    def _generation_eos(self) -> set[int]:
        path = self.folder / "generation_config.json"
        if not path.is_file():
            return set()
        eos = read_json(path).get("eos_token_id")
        return set(eos) if isinstance(eos, list) else ({eos} if isinstance(eos, int) else set())

    def tokenize(self, text: str, add_bos: Optional[bool] = None, parse_special: bool = False) -> list[int]:
        """Token ids; BOS is added when asked (default: as tokenizer_config.json says)."""
        add = self.vocab.add_bos if add_bos is None else add_bos
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids if parse_special else \
            [i for piece in self._split_specials(text) for i in piece]
        if add and self.vocab.bos is not None and (not ids or ids[0] != self.vocab.bos):
            ids = [self.vocab.bos] + ids
        return ids

    def _split_specials(self, text: str) -> list[list[int]]:
        """Encode without recognising special-token text (llama.cpp's parse_special=False)."""
        if not self._special:
            return [self._tokenizer.encode(text, add_special_tokens=False).ids]
        specials = [self._tokenizer.id_to_token(i) for i in self._special]
        pattern = "(" + "|".join(re.escape(s) for s in specials if s) + ")"
        out = []
        for part in re.split(pattern, text):
            if not part:
                continue
            if part in specials:  # plain text that happens to spell a control token: encode its characters
                out.append([i for ch in part for i in self._tokenizer.encode(ch, add_special_tokens=False).ids])
            else:
                out.append(self._tokenizer.encode(part, add_special_tokens=False).ids)
        return out

    def token_text(self, token: int) -> str:
        return self._tokenizer.id_to_token(token) or ""

    def token_bytes(self, token: int) -> bytes:
        piece = self._piece_cache.get(token)
        if piece is None:
            piece = self._bytes_of(token)
            self._piece_cache[token] = piece
        return piece

    def _bytes_of(self, token: int) -> bytes:
        if token in self._special:
            return b""
        text = self._tokenizer.id_to_token(token)
        if text is None:
            return b""
        if self._byte_level:
            try:
                return bytes(self._byte_map[ch] for ch in text)
            except KeyError:  # an added, non-byte-level token: its text is literal
                return text.encode("utf-8")
        match = _BYTE_FALLBACK.match(text)
        if match:
            return bytes([int(match.group(1), 16)])
        return text.replace("\u2581", " ").encode("utf-8")

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return token in self._eog

    def chat_template(self) -> Optional[str]:
        template = self._config.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        return template if isinstance(template, str) else None
