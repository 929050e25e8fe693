"""A GGUF vocabulary as a Hugging Face tokenizer.json: what llama.cpp tokenizes with, written for the
`tokenizers` library, so that a model that exists only as a GGUF gets the same token ids on the
PyTorch engine (gguf_to_hf.py) and the zoo's Hugging Face folders match their GGUF files
(benchmarks/zoo.py).

Three tokenizer models: byte-level BPE (`tokenizer.ggml.model` gpt2) with the pre-tokenizer
`tokenizer.ggml.pre` names, SentencePiece BPE with byte fallback (`llama`), and Gemma 4's BPE
(`gemma4`). The pre-tokenizers are llama.cpp's (src/llama-vocab.cpp, `regex_exprs` per
LLAMA_VOCAB_PRE_TYPE) in Hugging Face's terms; a pre-tokenizer not listed here is refused by
name rather than guessed, since a wrong split gives other token ids without any error.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Mapping, Optional

from specdesk.engines.types import SpecDeskError

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> how llama.cpp splits text before BPE:
#   "gpt2": GPT-2's regex (ByteLevel's own); "digits": each digit apart (\p{N}), then GPT-2's regex;
#   "llama3" / "qwen2": one regex of their own (llama3 also looks a whole word up before merging)
BPE_PRE_TOKENIZERS = {
    "gpt-2": "gpt2", "mpt": "gpt2",
    "smollm": "digits", "command-r": "digits", "starcoder": "digits", "refact": "digits",
    "llama-bpe": "llama3", "llama3": "llama3", "llama-v3": "llama3",
    "qwen2": "qwen2",
}
# End-of-generation tokens llama.cpp recognises by their text (control or user-defined ones)
EOG_TEXTS = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
             "<|END_OF_TURN_TOKEN|>", "<turn|>", "<|return|>", "<|call|>", "<|end_of_text|>"}
CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values of tokens matched before the split


@functools.lru_cache(maxsize=4)
def _read_vocab(path: str, size: int, mtime_ns: int) -> dict[str, tuple]:
    import gguf

    out = {}
    for name, field in gguf.GGUFReader(path).fields.items():
        if name.startswith("tokenizer."):
            main = field.types[0]
            out[name] = (field.contents(), main, field.types[-1] if main == gguf.GGUFValueType.ARRAY else None)
    return out


def read_vocab(path: Path) -> dict[str, tuple]:
    """Every tokenizer.* key of a GGUF: name -> (value, GGUF type, array item type), read once per
    (size, modification time)."""
    st = os.stat(path)
    return _read_vocab(os.path.abspath(path), st.st_size, st.st_mtime_ns)


def vocab_values(path: Path) -> dict[str, object]:
    """Every tokenizer.* key of a GGUF: name -> value."""
    return {name: value for name, (value, _, _) in read_vocab(path).items()}


def eog_ids(tokens: list[str], types: list[int], eos: Optional[int], eot: Optional[int]) -> list[int]:
    """End-of-generation ids as llama.cpp finds them: EOS, EOT and control tokens it knows by text."""
    ids = {i for i in (eos, eot) if i is not None}
    ids |= {i for i, (t, k) in enumerate(zip(tokens, types)) if t in EOG_TEXTS and k in (CONTROL, USER_DEFINED)}
    return sorted(ids)


def spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary with scores (transformers'
    SentencePieceExtractor): every split of a normal token into two normal tokens, ranked by
    the merged token's score."""
    normal = {t: i for i, (t, k) in enumerate(zip(tokens, types)) if k == 1}
    merges = []
    for piece, index in normal.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in normal and right in normal:
                merges.append((scores[index], -index, normal[left], normal[right], left, right))
    merges.sort(key=lambda m: (-m[0], m[2], m[3]))
    return [(m[4], m[5]) for m in merges]


def bpe_pre_tokenizer(pre: str, source: str) -> str:
    """The kind of split (BPE_PRE_TOKENIZERS) for llama.cpp's pre-tokenizer `pre`, or a refusal naming it."""
    if pre not in BPE_PRE_TOKENIZERS:
        raise SpecDeskError(f"{source}: its vocabulary's pre-tokenizer {pre!r} (tokenizer.ggml.pre) has no "
                            f"tokenizer.json conversion here (known: {', '.join(sorted(BPE_PRE_TOKENIZERS))}), "
                            "so its token ids could not be promised to match llama.cpp's")
    return BPE_PRE_TOKENIZERS[pre]


def tokenizer_json(fields: Mapping[str, object], source: str, model_name: str = "") -> str:
    """tokenizer.json for a GGUF vocabulary (`fields`: its tokenizer.* keys, vocab_values): byte-level
    BPE with llama.cpp's pre-tokenizer, SentencePiece BPE with byte fallback, or Gemma 4's BPE;
    control and user-defined tokens as added tokens. `model_name` is general.name, which llama.cpp
    reads for one rule (Phi-3's special tokens swallow the whitespace after them)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    tokens = list(fields["tokenizer.ggml.tokens"])
    types = list(fields["tokenizer.ggml.token_type"])
    kind = fields["tokenizer.ggml.model"]
    vocab = {t: i for i, t in enumerate(tokens)}
    if kind == "gpt2":
        split = bpe_pre_tokenizer(str(fields.get("tokenizer.ggml.pre", "")), source)
        merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"]]
        tokenizer = Tokenizer(models.BPE(vocab, merges, ignore_merges=split == "llama3"))
        regex = {"llama3": LLAMA3_REGEX, "qwen2": QWEN2_REGEX}.get(split)
        steps = [pre_tokenizers.Split(Regex(regex), behavior="isolated")] if regex else []
        if split == "digits":
            steps.append(pre_tokenizers.Digits(individual_digits=True))
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            steps + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=regex is None)])
        if split == "qwen2":
            tokenizer.normalizer = normalizers.NFC()
        tokenizer.decoder = decoders.ByteLevel()
    elif kind == "gemma4":
        # SentencePiece-style BPE over the whole text (spaces as U+2581, no space prefix), split
        # only into runs of newlines and runs of anything else, with byte fallback (llama.cpp's
        # LLAMA_VOCAB_PRE_TYPE_GEMMA4).
        merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"]]
        tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
        tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|[\n]+"), behavior="isolated")
        tokenizer.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                               decoders.Fuse()])
    elif kind == "llama":
        scores = list(fields["tokenizer.ggml.scores"])
        tokenizer = Tokenizer(models.BPE(vocab, spm_merges(tokens, scores, types), unk_token="<unk>",
                                         byte_fallback=True, fuse_unk=True))
        # The space prefix as in Llama 2's and Phi-3's own tokenizer.json: before every piece of
        # text between special tokens (llama.cpp adds it before the first piece only).
        tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        tokenizer.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                               decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    else:
        raise SpecDeskError(f"{source}: tokenizer model {kind!r} (tokenizer.ggml.model) has no tokenizer.json "
                            "conversion here (known: gpt2, llama, gemma4)")
    # Phi-3's special tokens swallow the whitespace after them, as its tokenizer.json says and
    # llama.cpp does for models named phi-3 (all but <unk>, <s> and <|endoftext|>).
    phi3 = any(name in model_name.lower() for name in ("phi-3", "phi3"))
    keep = {"<unk>", "<s>", "<|endoftext|>"}
    added = [AddedToken(t, special=k == CONTROL, normalized=False, rstrip=phi3 and t not in keep)
             for t, k in zip(tokens, types) if k in (CONTROL, USER_DEFINED)]
    tokenizer.add_tokens(added)
    return tokenizer.to_str()
