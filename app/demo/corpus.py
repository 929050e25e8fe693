"""The demo corpus: the running Python's standard library source, minus data-like files.

A file is kept when it reads like code. Codec and Unicode tables, generated topic dumps
and similar files are mostly lines that hold nothing but literals (strings, numbers,
commas and brackets); they teach a small model to emit tables, so they are dropped by
that measure rather than by a list of names. Test suites are dropped by folder because
their fixtures (doctest transcripts, syntax-error samples) are data in disguise.
"""

from __future__ import annotations

import hashlib
import io
import os
import sysconfig
import tokenize
from dataclasses import dataclass
from pathlib import Path

SKIPPED_DIRS = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"}
LITERAL_TOKENS = {tokenize.STRING, tokenize.NUMBER}
DATA_PUNCTUATION = {",", "(", ")", "[", "]", "{", "}", ":", "+", "-"}
MAX_DATA_LINE_SHARE = 0.35
MAX_FILE_BYTES = 400_000


@dataclass(frozen=True)
class CorpusFile:
    relative_path: str
    text: str
    data_line_share: float


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def data_line_share(source: str) -> float:
    """Share of non-blank lines that hold only literals and punctuation.

    Multi-line strings (docstrings) count as prose, not data. Files that do not
    tokenize count as data.
    """
    line_has_code: dict[int, bool] = {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return 1.0
    for token in tokens:
        if token.type in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                          tokenize.COMMENT, tokenize.ENDMARKER):
            continue
        first_line, last_line = token.start[0], token.end[0]
        if token.type in LITERAL_TOKENS and first_line == last_line:
            line_has_code.setdefault(first_line, False)
        elif token.type == tokenize.OP and token.string in DATA_PUNCTUATION:
            line_has_code.setdefault(first_line, False)
        else:
            for line in range(first_line, last_line + 1):
                line_has_code[line] = True
    if not line_has_code:
        return 1.0
    data_lines = sum(1 for has_code in line_has_code.values() if not has_code)
    return data_lines / len(line_has_code)


def iter_corpus(root: Path | None = None) -> list[CorpusFile]:
    """Every kept file, sorted by relative path so the corpus is deterministic."""
    root = root or stdlib_root()
    kept: list[CorpusFile] = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in SKIPPED_DIRS)
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = Path(directory) / name
            try:
                raw = path.read_bytes()
            except OSError:
                continue
            if not raw.strip() or len(raw) > MAX_FILE_BYTES:
                continue
            text = raw.decode("utf-8", errors="replace")
            share = data_line_share(text)
            if share > MAX_DATA_LINE_SHARE:
                continue
            kept.append(CorpusFile(path.relative_to(root).as_posix(), text, share))
    kept.sort(key=lambda f: f.relative_path)
    return kept


def is_held_out(relative_path: str, held_out_percent: int = 3) -> bool:
    """Validation files chosen by a stable hash of the path, never by chance."""
    digest = hashlib.sha256(relative_path.encode()).digest()
    return digest[0] * 100 // 256 < held_out_percent


def split_corpus(files: list[CorpusFile]) -> tuple[list[CorpusFile], list[CorpusFile]]:
    train = [f for f in files if not is_held_out(f.relative_path)]
    held_out = [f for f in files if is_held_out(f.relative_path)]
    return train, held_out
