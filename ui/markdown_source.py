"""Where shown Markdown text lies in its source: markdown-it gives block tokens source line ranges
but no character offsets for inline text, so ui/markdown.py finds each piece here, in order."""

from __future__ import annotations


def find_part(text: str, part: str, start: int, end: int) -> tuple[list[int], int]:
    """Offsets of `part`'s characters in text[start:end] and where the search goes on.

    As one piece where it occurs whole; otherwise character by character in order (tabs
    expanded by the parser, normalized text), with -1 for a character not found."""
    k = text.find(part, start, end)
    if k >= 0:
        return list(range(k, k + len(part))), k + len(part)
    where = []
    for ch in part:
        j = text.find(ch, start, end)
        where.append(j)
        if j >= 0:
            start = j + 1
    return where, start


def spaced(content: str, shown: str, start: int) -> tuple[list[int], int]:
    """Offsets of inline code or alt text, where the parser turned line breaks into spaces."""
    where, at = [], start
    for ch in shown:
        j = at
        while j < len(content) and content[j] != ch and not (ch == " " and content[j] == "\n"):
            j += 1
        if j < len(content):
            where.append(j)
            at = j + 1
        else:
            where.append(-1)
    return where, at


def after_link(content: str, at: int, auto: bool) -> int:
    """Skip a link's closing markup: `>` of an autolink; `](destination "title")` or `][label]`."""
    if auto:
        k = content.find(">", at)
        return k + 1 if k >= 0 else at
    k = content.find("]", at)
    if k < 0:
        return at
    k += 1
    if content.startswith("(", k):
        depth, quote = 0, ""
        while k < len(content):
            ch = content[k]
            if quote:
                quote = "" if ch == quote else quote
            elif ch in "\"'" and depth == 1:
                quote = ch
            elif ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
                if depth == 0:
                    return k + 1
            k += 1
        return k
    if content.startswith("[", k):
        close = content.find("]", k)
        return close + 1 if close >= 0 else k
    return k
