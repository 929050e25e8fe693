"""A small Markdown reader for chat replies that keeps every character's draft flag.

Qt's own Markdown import would lose which characters came from accepted draft tokens,
so replies are parsed here into blocks of styled runs, each run carrying the flag of the
characters it shows. It covers what chat models write: fenced code, headings, lists,
quotes, rules, paragraphs with `code`, **bold**, *italic* and [links](url). Line breaks
inside a paragraph are kept (models use them as line breaks). `_` never marks emphasis:
in code-heavy chats it is far more often part of a name (`__init__`, `snake_case`).

A reply with no Markdown structure that reads as source code (small models often answer
in bare code) is shown as one code block, so its indentation survives.

Pure Python, no Qt: the chat view turns blocks into QTextDocument formats.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional, Sequence

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)")
HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+|$)")
BULLET = re.compile(r"^( *)([-*+])[ \t]+")
ORDERED = re.compile(r"^( *)(\d{1,9})([.)])[ \t]+")
QUOTE = re.compile(r"^ {0,3}>[ \t]?")
RULE = re.compile(r"^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
LINK = re.compile(r"\[([^\]\n]+)\]\(([^)\s]+)\)")
CODE_START = re.compile(r"^(?:def|class|import|from|return|if|elif|else|for|while|try|except|finally|with|"
                        r"raise|yield|async|await|assert|pass|break|continue|lambda|global|nonlocal|"
                        r"const|let|var|function|fn|pub|use|struct|impl|#include|package)\b")
CODE_END = tuple(":{}[](),;\\")


@dataclass
class Run:
    text: str
    drafted: bool = False
    bold: bool = False
    italic: bool = False
    code: bool = False
    link: Optional[str] = None


@dataclass
class Block:
    kind: str  # "paragraph", "heading", "code", "item", "quote", "rule"
    runs: list[Run] = field(default_factory=list)
    level: int = 0  # heading level 1..6; list nesting depth from 0
    marker: str = ""  # list items: "•" or "3."
    lang: str = ""  # code blocks: the fence's language tag

    @property
    def text(self) -> str:
        return "".join(r.text for r in self.runs)


def char_flags(pieces: Sequence[str], from_draft: Sequence[bool]) -> list[bool]:
    """Per-character draft flags from per-token pieces."""
    flags: list[bool] = []
    for piece, drafted in zip(pieces, from_draft):
        flags.extend([bool(drafted)] * len(piece))
    return flags


def looks_like_code(text: str) -> bool:
    """Bare source code, not prose: most lines are indented, open or close a bracket, end a
    statement, or start with a keyword. Markdown fences settle it the other way."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2 or any(FENCE.match(line) for line in lines):
        return False
    codey = 0
    for line in lines:
        stripped = line.strip()
        if (line[:1] in " \t" or stripped.endswith(CODE_END) or CODE_START.match(stripped)
                or stripped.startswith(("#", "//", "@", "\"\"\"", "'''"))):
            codey += 1
    return codey >= 0.6 * len(lines)


def parse(text: str, flags: Optional[Sequence[bool]] = None) -> list[Block]:
    """Blocks of styled runs; flags[i] is the draft flag of text[i] (all False if omitted)."""
    flags = list(flags) if flags is not None else []
    if len(flags) < len(text):
        flags = flags + [False] * (len(text) - len(flags))
    if looks_like_code(text):
        return [Block("code", _plain(text.rstrip("\n"), 0, flags))]
    blocks: list[Block] = []
    lines = _lines(text)
    i = 0
    paragraph: list[tuple[int, str]] = []  # (offset, line) of the paragraph being gathered

    def close_paragraph() -> None:
        if paragraph:
            blocks.append(Block("paragraph", _inline_lines(paragraph, flags)))
            paragraph.clear()

    while i < len(lines):
        offset, line = lines[i]
        fence = FENCE.match(line)
        if fence:
            close_paragraph()
            marker, lang = fence.group(1), fence.group(2)
            body: list[tuple[int, str]] = []
            i += 1
            while i < len(lines):
                o, l = lines[i]
                if l.strip().startswith(marker[0] * len(marker)) and not l.strip().strip(marker[0]):
                    break
                body.append((o, l))
                i += 1
            i += 1  # the closing fence (or the end: an open fence runs to the end while streaming)
            runs: list[Run] = []
            for n, (o, l) in enumerate(body):
                if n:
                    runs.append(Run("\n", flags[o - 1] if o else False))
                runs.extend(_plain(l, o, flags))
            blocks.append(Block("code", runs, lang=lang))
            continue
        if not line.strip():
            close_paragraph()
            i += 1
            continue
        if RULE.match(line):
            close_paragraph()
            blocks.append(Block("rule"))
            i += 1
            continue
        heading = HEADING.match(line)
        if heading:
            close_paragraph()
            content = line[heading.end():].rstrip()
            content = re.sub(r"[ \t]+#+[ \t]*$", "", content)  # closing hashes
            blocks.append(Block("heading", _inline(content, offset + heading.end(), flags),
                                level=len(heading.group(1))))
            i += 1
            continue
        item = BULLET.match(line) or ORDERED.match(line)
        if item:
            close_paragraph()
            depth = len(item.group(1)) // 2
            marker = "•" if item.re is BULLET else f"{item.group(2)}{item.group(3)}"
            gathered = [(offset + item.end(), line[item.end():])]
            i += 1
            while i < len(lines):  # continuation lines: indented, not a new item or block
                o, l = lines[i]
                if (not l.strip() or not l.startswith(" ") or BULLET.match(l) or ORDERED.match(l)
                        or FENCE.match(l)):
                    break
                stripped = l.lstrip()
                gathered.append((o + len(l) - len(stripped), stripped))
                i += 1
            blocks.append(Block("item", _inline_lines(gathered, flags), level=depth, marker=marker))
            continue
        quote = QUOTE.match(line)
        if quote:
            close_paragraph()
            gathered = []
            while i < len(lines):
                o, l = lines[i]
                q = QUOTE.match(l)
                if not q:
                    break
                gathered.append((o + q.end(), l[q.end():]))
                i += 1
            blocks.append(Block("quote", _inline_lines(gathered, flags)))
            continue
        paragraph.append((offset, line))
        i += 1
    close_paragraph()
    return blocks


def _lines(text: str) -> list[tuple[int, str]]:
    out, at = [], 0
    for line in text.split("\n"):
        out.append((at, line))
        at += len(line) + 1
    return out


def _plain(text: str, offset: int, flags: Sequence[bool], **style) -> list[Run]:
    """Runs of text split where the draft flag changes."""
    runs: list[Run] = []
    for i, ch in enumerate(text):
        drafted = flags[offset + i] if offset + i < len(flags) else False
        if runs and runs[-1].drafted == drafted:
            runs[-1].text += ch
        else:
            runs.append(Run(ch, drafted, **style))
    return runs


def _inline_lines(lines: list[tuple[int, str]], flags: Sequence[bool]) -> list[Run]:
    runs: list[Run] = []
    for n, (offset, line) in enumerate(lines):
        if n:
            runs.append(Run("\n", flags[offset - 1] if offset else False))
        runs.extend(_inline(line.rstrip(), offset, flags))
    return runs


def _inline(text: str, offset: int, flags: Sequence[bool]) -> list[Run]:
    """`code`, **bold**, *italic* and [links](url) within one line."""
    runs: list[Run] = []
    bold = italic = False
    i, start = 0, 0

    def emit(end: int, **extra) -> None:
        if end > start:
            runs.extend(_plain(text[start:end], offset + start, flags,
                               bold=extra.get("bold", bold), italic=extra.get("italic", italic),
                               code=extra.get("code", False), link=extra.get("link")))

    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and not text[i + 1].isalnum() and not text[i + 1].isspace():
            emit(i)
            start = i + 1  # the escaped character shows literally
            i += 2
            continue
        if ch == "`":
            ticks = len(text[i:]) - len(text[i:].lstrip("`"))
            close = text.find("`" * ticks, i + ticks)
            if close >= 0:
                emit(i)
                inner_start, inner_end = i + ticks, close
                if inner_end - inner_start >= 2 and text[inner_start] == " " and text[inner_end - 1] == " ":
                    inner_start, inner_end = inner_start + 1, inner_end - 1
                runs.extend(_plain(text[inner_start:inner_end], offset + inner_start, flags, code=True,
                                   bold=bold, italic=italic))
                i = start = close + ticks
                continue
            i += ticks
            continue
        if ch == "[":
            link = LINK.match(text, i)
            if link and link.group(2).startswith(("http://", "https://", "mailto:")):
                emit(i)
                runs.extend(_plain(link.group(1), offset + i + 1, flags, bold=bold, italic=italic,
                                   link=link.group(2)))
                i = start = link.end()
                continue
        if ch == "*":
            n = 2 if text.startswith("**", i) else 1
            before = text[i - 1] if i else " "
            after = text[i + n] if i + n < len(text) else " "
            opens = not after.isspace() and (before.isspace() or not before.isalnum() or n == 1 and before == "*")
            closes = not before.isspace()
            active = bold if n == 2 else italic
            if active and closes:
                emit(i)
                if n == 2:
                    bold = False
                else:
                    italic = False
                i = start = i + n
                continue
            if not active and opens and text.find("*" * n, i + n + 1) > 0:
                emit(i)
                if n == 2:
                    bold = True
                else:
                    italic = True
                i = start = i + n
                continue
            i += n
            continue
        i += 1
    emit(len(text))
    return runs
