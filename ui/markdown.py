"""Chat replies as Markdown blocks that keep every character's draft flag.

Qt's own Markdown import would lose which characters came from accepted draft tokens, so
replies are parsed with markdown-it-py (CommonMark, plus GitHub's tables and
strikethrough) and its tokens are turned into blocks of styled runs, each run carrying the
flag of the source characters it shows. markdown-it gives block tokens source line ranges
(`token.map`) but no character offsets for inline text, so each inline token's content is
located in its source lines, and each child token's text in that content, in order
(ui/markdown_source.py).

Our choices on top of CommonMark: line breaks inside a paragraph are kept (models use them
as line breaks); `_` never marks emphasis, because in code-heavy chats it is far more often
part of a name (`__init__`, `snake_case`); raw HTML shows as text; only http(s) and mailto
links are links (the transcript would try to open anything else itself). A reply with no
Markdown structure that reads as source code (small models often answer in bare code) is
shown as one code block, so its indentation survives.

Code blocks are highlighted (ui/highlight.py: each run carries its token kind) and numbered
within their reply (`Block.index`), so a "Copy" link can name one (`copy_href`) and
`code_block_text` gives its text back. A table keeps its cells (`Block.rows`) for drawing as
a table, besides its runs laid out as aligned monospaced lines.

Pure Python, no Qt: the chat view turns blocks into QTextDocument formats.
"""

from __future__ import annotations

import re
import unicodedata
from itertools import groupby
from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

from markdown_it import MarkdownIt
from markdown_it.rules_inline import emphasis
from markdown_it.rules_inline.state_inline import StateInline
from markdown_it.token import Token

from . import highlight
from .markdown_source import after_link, find_part, spaced

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)")
CODE_START = re.compile(r"^(?:def|class|import|from|return|if|elif|else|for|while|try|except|finally|with|"
                        r"raise|yield|async|await|assert|pass|break|continue|lambda|global|nonlocal|"
                        r"const|let|var|function|fn|pub|use|struct|impl|#include|package)\b")
CODE_END = tuple(":{}[](),;\\")
LINK_SCHEMES = ("http://", "https://", "mailto:")
NEWLINE = re.compile("\n")
COPY_SCHEME = "copy:"


@dataclass
class Run:
    text: str
    drafted: bool = False
    bold: bool = False
    italic: bool = False
    code: bool = False
    link: Optional[str] = None
    strike: bool = False
    token: str = ""  # in code blocks: the highlighter's kind ("keyword", "string", ...; "" for plain)


@dataclass
class Cell:
    runs: list[Run] = field(default_factory=list)
    align: str = ""  # "", "left", "center" or "right"

    @property
    def text(self) -> str:
        return "".join(r.text for r in self.runs)


@dataclass
class Block:
    kind: str  # "paragraph", "heading", "code", "item", "quote", "rule", "table"
    runs: list[Run] = field(default_factory=list)
    level: int = 0  # heading level 1..6; list nesting depth from 0
    marker: str = ""  # list items: "•" or "3."
    lang: str = ""  # code blocks: the fence's language tag
    index: int = -1  # code blocks: the number of the code block in its reply, from 0
    rows: list[list[Cell]] = field(default_factory=list)  # tables: the header row, then the body rows

    @property
    def text(self) -> str:
        return "".join(r.text for r in self.runs)


def copy_href(block_index: int, message_index: Optional[int] = None) -> str:
    """The link a code block's "Copy" shows: `copy:N`, or `copy:M.N` for message M of a transcript."""
    return f"{COPY_SCHEME}{block_index}" if message_index is None else f"{COPY_SCHEME}{message_index}.{block_index}"


def parse_copy_href(href: str) -> Optional[tuple[Optional[int], int]]:
    """(message index or None, code block index) from a `copy_href` link; None for any other link."""
    if not href.startswith(COPY_SCHEME):
        return None
    message, _, block = href[len(COPY_SCHEME):].rpartition(".")
    if not block.isdigit() or (message and not message.isdigit()):
        return None
    return (int(message) if message else None), int(block)


def code_blocks(text: str) -> list[str]:
    """The text of each code block of a reply, in order (what its "Copy" links copy)."""
    return [block.text for block in parse(text) if block.kind == "code"]


def code_block_text(text: str, index: int) -> str:
    """Code block `index` of a reply, as it would be pasted ("" when the reply has no such block)."""
    blocks = code_blocks(text)
    return blocks[index] if 0 <= index < len(blocks) else ""


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


def _star_emphasis(state: StateInline, silent: bool) -> bool:
    """CommonMark emphasis for `*` only: `_` stays a literal character."""
    return state.src[state.pos] != "_" and emphasis.tokenize(state, silent)


def _reader() -> MarkdownIt:
    md = MarkdownIt("commonmark").enable(["table", "strikethrough"]).disable(["html_block", "html_inline"])
    md.inline.ruler.at("emphasis", _star_emphasis)
    # Keep escapes and entities as their own tokens: their source text differs from what they
    # show, and merged into the text around them they could not be found in the source.
    md.core.ruler.disable("text_join")
    return md


_MD = _reader()


def parse(text: str, flags: Optional[Sequence[bool]] = None) -> list[Block]:
    """Blocks of styled runs; flags[i] is the draft flag of text[i] (all False if omitted)."""
    text, flags = _normalized(text, flags)
    if looks_like_code(text):
        return [_bare_code(text, flags)]
    return _numbered(_Builder(text, flags).build(_MD.parse(text)))


def _numbered(blocks: list[Block]) -> list[Block]:
    """Number the code blocks in order (the stream keeps earlier blocks: they keep their numbers)."""
    n = 0
    for block in blocks:
        if block.kind == "code":
            block.index = n
            n += 1
    return blocks


class Stream:
    """The blocks of a reply that grows at its end, read again only from its last top-level blocks.

    A top-level block (paragraph, whole list, quote, fence, table) that two others follow
    cannot change when text is appended, so its blocks are kept and the parser starts at the
    source line (markdown-it's `token.map`) where the next-to-last one begins: a frame costs
    the last two blocks, not the reply. Not just the last one: a block that has only begun can
    still fall back into the one before it (`#` is a heading until `#x`; after `1. a` and a
    blank line, `1` is a paragraph until `1.` continues the list). A link reference defined
    in the part read again does not reach back into the kept part."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._prefix = ""  # the text before `_offset`, to notice a reply that did not just grow
        self._offset = 0
        self._stable: list[Block] = []

    def parse(self, text: str, flags: Optional[Sequence[bool]] = None) -> list[Block]:
        if "\r" in text:  # normalizing shifts offsets: read it whole
            return parse(text, flags)
        text, flags = _normalized(text, flags)
        if looks_like_code(text):
            return [_bare_code(text, flags)]
        if not text.startswith(self._prefix):
            self._reset()
        tail = text[self._offset:]
        tokens = _MD.parse(tail)
        builder = _Builder(tail, flags[self._offset:])
        tops = [i for i, token in enumerate(tokens) if token.level == 0 and token.nesting >= 0]
        if len(tops) < 3 or tokens[tops[-2]].map is None:
            return _numbered(self._stable + builder.build(tokens))
        keep = tops[-2]  # the last two stay open (see above)
        done = list(builder.build(tokens[:keep]))
        blocks = builder.build(tokens[keep:])[len(done):]
        self._stable += done
        self._offset += builder.line_starts[tokens[keep].map[0]]
        self._prefix = text[:self._offset]
        return _numbered(self._stable + blocks)


def _normalized(text: str, flags: Optional[Sequence[bool]]) -> tuple[str, list[bool]]:
    r"""Flags padded to the text; \r\n and \r read as \n (as markdown-it does) with offsets kept aligned."""
    flags = list(flags) if flags is not None else []
    if len(flags) < len(text):
        flags = flags + [False] * (len(text) - len(flags))
    if "\r" in text:
        kept = [i for i, ch in enumerate(text) if ch != "\r" or text[i + 1:i + 2] != "\n"]
        flags = [flags[i] for i in kept]
        text = "".join(text[i] for i in kept).replace("\r", "\n")
    return text, flags


def _bare_code(text: str, flags: list[bool]) -> Block:
    code = text.rstrip("\n")
    return Block("code", _split(code, flags[:len(code)]), index=0)


def _highlighted(runs: list[Run], lang: str) -> list[Run]:
    """Code runs split where the token kind changes, each carrying its kind."""
    code = "".join(r.text for r in runs)
    token_kinds = highlight.kinds(code, lang)
    if not any(token_kinds):
        return runs
    out: list[Run] = []
    at = 0
    for run in runs:
        start = at
        for kind, group in groupby(token_kinds[at:at + len(run.text)]):
            end = start + sum(1 for _ in group)
            out.append(replace(run, text=code[start:end], token=kind))
            start = end
        at += len(run.text)
    return out


class _Builder:
    """Walks markdown-it's token stream, flattening containers into our block list."""

    def __init__(self, text: str, flags: list[bool]):
        self.text, self.flags = text, flags
        self.line_starts = [0] + [m.end() for m in NEWLINE.finditer(text)]
        self.blocks: list[Block] = []
        self.lists: list[list] = []  # per open list: [next number or None for bullets, delimiter]
        self.quotes = 0
        self.item: Optional[Block] = None  # the open list item's block (None until its first text)
        self.item_pending: Optional[Block] = None  # marker and level of an item with no text yet
        self.heading = 0
        self.table: Optional[list[list[tuple[list[Run], str]]]] = None  # rows of (runs, align)
        self.row_at = 0  # search position in the table row being read

    def build(self, tokens: list[Token]) -> list[Block]:
        for token in tokens:
            handler = getattr(self, "_on_" + token.type, None)
            if handler is not None:
                handler(token)
        return self.blocks

    # --- containers ---------------------------------------------------------------
    def _on_bullet_list_open(self, token: Token) -> None:
        self.lists.append([None, ""])

    def _on_ordered_list_open(self, token: Token) -> None:
        self.lists.append([int(token.attrGet("start") or 1), token.markup])

    def _on_bullet_list_close(self, token: Token) -> None:
        self.lists.pop()

    _on_ordered_list_close = _on_bullet_list_close

    def _on_list_item_open(self, token: Token) -> None:
        number, delimiter = self.lists[-1]
        if number is None:
            marker = "•"
        else:
            marker = f"{number}{delimiter}"
            self.lists[-1][0] = number + 1
        self._flush_item()
        self.item = None
        self.item_pending = Block("item", level=len(self.lists) - 1, marker=marker)

    def _on_list_item_close(self, token: Token) -> None:
        self._flush_item()
        self.item = None

    def _flush_item(self) -> None:
        """An item whose first child is not text (a nested list, a code block) still shows its marker."""
        if self.item_pending is not None:
            self.blocks.append(self.item_pending)
            self.item_pending = None

    def _on_blockquote_open(self, token: Token) -> None:
        self.quotes += 1

    def _on_blockquote_close(self, token: Token) -> None:
        self.quotes -= 1

    # --- leaf blocks ----------------------------------------------------------------
    def _on_heading_open(self, token: Token) -> None:
        self._flush_item()
        self.heading = int(token.tag[1])

    def _on_hr(self, token: Token) -> None:
        self._flush_item()
        self.blocks.append(Block("rule"))

    def _on_fence(self, token: Token) -> None:
        self._flush_item()
        first = token.map[0] + 1 if token.map else 0
        lang = token.info.split(maxsplit=1)[0] if token.info.strip() else ""
        runs = _highlighted(self._code_runs(token.content, first), lang)
        self.blocks.append(Block("code", runs, lang=lang))

    def _on_code_block(self, token: Token) -> None:
        self._flush_item()
        self.blocks.append(Block("code", self._code_runs(token.content, token.map[0] if token.map else 0)))

    def _code_runs(self, content: str, first_line: int) -> list[Run]:
        """Each code line is the end of its source line (the fence's indent was cut from its start)."""
        lines = content.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        positions: list[int] = []
        for n, line in enumerate(lines):
            start, end = self._line_span(first_line + n)
            if n:
                positions.append(start - 1)  # the newline before this line
            source = self.text[start:end]
            col = len(source) - len(line) if source.endswith(line) else max(source.find(line), 0)
            positions.extend(range(start + col, start + col + len(line)))
        return _plain("\n".join(lines), positions, self.flags)

    def _on_inline(self, token: Token) -> None:
        if self.table is not None:
            self._table_cell(token)
            return
        runs = self._inline_runs(token, self._content_positions(token))
        if self.heading:
            self.blocks.append(Block("heading", runs, level=self.heading))
            self.heading = 0
        elif self.item_pending is not None:
            self.item, self.item_pending = self.item_pending, None
            self.item.runs = runs
            self.blocks.append(self.item)
        elif self.item is not None and self.blocks and self.blocks[-1] is self.item:
            # a later paragraph of the same item: a line break inside the item keeps its indent
            self.item.runs = _merged(self.item.runs + [Run("\n")] + runs)
        else:
            self.blocks.append(Block("quote" if self.quotes else "paragraph", runs))

    # --- tables ---------------------------------------------------------------------
    def _on_table_open(self, token: Token) -> None:
        self._flush_item()
        self.table = []

    def _on_tr_open(self, token: Token) -> None:
        self.table.append([])
        self.row_at = self._line_span(token.map[0])[0] if token.map else 0

    def _on_th_open(self, token: Token) -> None:
        style = token.attrGet("style") or ""
        self.table[-1].append(([], style.partition("text-align:")[2]))

    _on_td_open = _on_th_open

    def _table_cell(self, token: Token) -> None:
        start, end = self._line_span(token.map[0]) if token.map else (0, 0)
        positions, self.row_at = find_part(self.text, token.content, max(self.row_at, start), end)
        runs = self._inline_runs(token, positions)
        if len(self.table) == 1:  # the header row
            runs = [replace(run, bold=True) for run in runs]
        self.table[-1][-1] = (runs, self.table[-1][-1][1])

    def _on_table_close(self, token: Token) -> None:
        rows, self.table = self.table, None
        columns = max((len(row) for row in rows), default=0)
        cells = [[Cell(_merged(runs), align) for runs, align in row] + [Cell() for _ in range(columns - len(row))]
                 for row in rows]
        self.blocks.append(Block("table", _table_runs(rows), rows=cells))

    # --- inline ---------------------------------------------------------------------
    def _line_span(self, line: int) -> tuple[int, int]:
        """Start and end (before its newline) of a source line."""
        if line >= len(self.line_starts):
            return len(self.text), len(self.text)
        start = self.line_starts[line]
        end = self.line_starts[line + 1] - 1 if line + 1 < len(self.line_starts) else len(self.text)
        return start, end

    def _content_positions(self, token: Token) -> list[int]:
        """Source offset of each character of an inline token's content (-1 where not found).

        Content line n is on source line map[0] + n, with container markup (quote markers,
        list indents, heading hashes) cut from its start and spaces from its end."""
        positions: list[int] = []
        first = token.map[0] if token.map else 0
        for n, line in enumerate(token.content.split("\n")):
            start, end = self._line_span(first + n)
            if n:
                positions.append(start - 1)
            source = self.text[start:end]
            if line and source.endswith(line):
                col = len(source) - len(line)
                positions.extend(range(start + col, start + col + len(line)))
            else:
                found, _ = find_part(self.text, line, start, end)
                positions.extend(found)
        return positions

    def _inline_runs(self, token: Token, positions: list[int]) -> list[Run]:
        content, flags = token.content, self.flags
        runs: list[Run] = []
        at = 0  # where the next child's source text is searched for in the content
        bold = italic = strike = 0
        links: list[Optional[str]] = []
        autolink: list[bool] = []

        def emit(shown: str, where: Sequence[int], **style) -> None:
            style = {"bold": bold > 0, "italic": italic > 0, "strike": strike > 0,
                     "link": links[-1] if links else None, **style}
            drafted = [0 <= pos < len(positions) and positions[pos] >= 0 and flags[positions[pos]] for pos in where]
            runs.extend(_split(shown, drafted, **style))

        for child in token.children or []:
            kind = child.type
            if kind == "text":
                where, at = find_part(content, child.content, at, len(content))
                emit(child.content, where)
            elif kind == "text_special":  # an escape shows the escaped character, an entity its character
                k = content.find(child.markup, at)
                if k < 0:
                    emit(child.content, [-1] * len(child.content))
                    continue
                source = k + len(child.markup) - 1 if child.info == "escape" else k
                emit(child.content, [source] * len(child.content))
                at = k + len(child.markup)
            elif kind in ("softbreak", "hardbreak"):
                k = content.find("\n", at)
                emit("\n", [k])
                at = k + 1 if k >= 0 else at
            elif kind == "code_inline":
                k = content.find(child.markup, at)
                start = k + len(child.markup) if k >= 0 else at
                where, end = spaced(content, child.content, start)
                emit(child.content, where, code=True)
                close = content.find(child.markup, end)
                at = close + len(child.markup) if close >= 0 else end
            elif kind in ("strong_open", "strong_close", "em_open", "em_close", "s_open", "s_close"):
                k = content.find(child.markup, at)
                at = k + len(child.markup) if k >= 0 else at
                step = 1 if kind.endswith("_open") else -1
                if kind.startswith("strong"):
                    bold += step
                elif kind.startswith("em"):
                    italic += step
                else:
                    strike += step
            elif kind == "link_open":
                auto = child.markup == "autolink"
                k = content.find("<" if auto else "[", at)
                at = k + 1 if k >= 0 else at
                href = str(child.attrGet("href") or "")
                links.append(href if href.startswith(LINK_SCHEMES) else None)
                autolink.append(auto)
            elif kind == "link_close":
                at = after_link(content, at, autolink.pop() if autolink else False)
                if links:
                    links.pop()
            elif kind == "image":  # no pictures in the transcript: the alt text, linked to the image
                k = content.find("![", at)
                where, end = spaced(content, child.content, k + 2 if k >= 0 else at)
                src = str(child.attrGet("src") or "")
                emit(child.content, where, link=src if src.startswith(LINK_SCHEMES) else None)
                at = after_link(content, end, False)
        return _merged(runs)


def _plain(text: str, positions: Sequence[int], flags: Sequence[bool]) -> list[Run]:
    """Runs of unstyled text split where the draft flag changes."""
    return _split(text, [0 <= pos < len(flags) and flags[pos] for pos in positions])


def _split(text: str, drafted: Sequence[bool], **style) -> list[Run]:
    """Runs of one style, split where the draft flag changes."""
    runs: list[Run] = []
    start = 0
    for flag, group in groupby(drafted):
        end = start + sum(1 for _ in group)
        runs.append(Run(text[start:end], bool(flag), **style))
        start = end
    return runs


def _merged(runs: list[Run]) -> list[Run]:
    """Neighbouring runs of the same style and flag as one; empty runs dropped."""
    out: list[Run] = []
    for run in runs:
        if not run.text:
            continue
        if out and _style(out[-1]) == _style(run):
            out[-1] = replace(out[-1], text=out[-1].text + run.text)
        else:
            out.append(run)
    return out


def _style(run: Run) -> tuple:
    return run.drafted, run.bold, run.italic, run.code, run.link, run.strike, run.token


def _width(text: str) -> int:
    """Columns in a monospaced font: East Asian wide characters take two."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _table_runs(rows: list[list[tuple[list[Run], str]]]) -> list[Run]:
    """A table as aligned monospaced lines: cells padded to their column, a rule under the header."""
    columns = max((len(row) for row in rows), default=0)
    widths = [max((_width("".join(r.text for r in row[c][0])) for row in rows if c < len(row)), default=0)
              for c in range(columns)]
    runs: list[Run] = []
    for n, row in enumerate(rows):
        if n:
            runs.append(Run("\n"))
        for c in range(columns):
            cell, align = row[c] if c < len(row) else ([], "")
            pad = widths[c] - _width("".join(r.text for r in cell))
            left = pad if align == "right" else pad // 2 if align == "center" else 0
            runs.append(Run((" │ " if c else "") + " " * left))
            runs.extend(cell)
            if c + 1 < columns:  # no padding at the end of a line
                runs.append(Run(" " * (pad - left)))
        if n == 0 and len(rows) > 1:
            runs.append(Run("\n" + "─┼─".join("─" * w for w in widths)))
    return _merged(runs)
