"""Syntax highlighting for code blocks: a small lexer for the languages chats show most.

One regular expression per language finds comments, strings, numbers and words, left to
right, so a quote inside a comment or a `#` inside a string never starts anything; words
are keywords when the language has them as such. A block streams in as it is generated,
so an unclosed string or block comment runs to the end of the text, as an editor shows it.

`spans(code, lang)` gives (start, end, kind) for the highlighted parts; a language not
known here (or none) gives none, and the code shows plain. Pure Python, no Qt:
`TOKEN_COLORS` holds the colors the chat view gives each kind on light and dark themes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

KINDS = ("keyword", "string", "comment", "number")
TOKEN_COLORS = {  # kind -> (on a light background, on a dark background)
    "keyword": ("#8839ef", "#cba6f7"),
    "string": ("#40a02b", "#a6e3a1"),
    "comment": ("#7c7f93", "#9399b2"),
    "number": ("#fe640b", "#fab387"),
}


def token_color(kind: str, dark: bool) -> str:
    """The color of a token kind, as #rrggbb; "" for text that is not highlighted."""
    colors = TOKEN_COLORS.get(kind)
    return colors[1 if dark else 0] if colors else ""


@dataclass(frozen=True)
class Language:
    comments: tuple[str, ...]  # regular expressions
    strings: tuple[str, ...]
    keywords: frozenset[str]
    case_sensitive: bool = True


_NUMBER = r"\b(?:0[xX][0-9a-fA-F_]+|0[bB][01_]+|0[oO][0-7_]+|\d[\d_]*(?:\.\d[\d_]*)?(?:[eE][+-]?\d+)?)[a-zA-Z]*\b"
_WORD = r"[A-Za-z_$][\w$]*"
_DQ = r'"(?:\\.|[^"\\\n])*"?'  # to the closing quote, or the line's end while it is being written
_SQ = r"'(?:\\.|[^'\\\n])*'?"
_BLOCK_COMMENT = r"/\*[\s\S]*?(?:\*/|\Z)"
_LINE_COMMENT = r"//[^\n]*"
_HASH_COMMENT = r"#[^\n]*"
_PREFIX = r"[rRbBuUfF]{0,2}"  # Python's string prefixes (r"", b'', f"", rb'' ...)


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_C_FAMILY = _words("""
    auto break case catch char class const constexpr continue default delete do double else enum explicit
    extends extern false final finally float for friend goto if implements import inline instanceof int interface
    long namespace new nullptr null override package private protected public register return short signed
    sizeof static struct super switch template this throw throws true try typedef typename union unsigned using
    virtual void volatile while bool boolean byte string var let func go chan defer fallthrough map range
    select type fn impl mut pub mod use crate trait where loop match move ref self Self dyn unsafe async
    await as in is of out object val when data sealed internal readonly event delegate foreach lock base
    """)
LANGUAGES: dict[str, Language] = {
    "python": Language((_HASH_COMMENT,), (_PREFIX + r'"""[\s\S]*?(?:"""|\Z)', _PREFIX + r"'''[\s\S]*?(?:'''|\Z)",
                                           _PREFIX + _DQ, _PREFIX + _SQ), _words("""
        False None True and as assert async await break class continue def del elif else except finally for
        from global if import in is lambda nonlocal not or pass raise return try while with yield match case
        self print len range""")),
    "javascript": Language((_LINE_COMMENT, _BLOCK_COMMENT), (r"`(?:\\.|[^`\\])*`?", _DQ, _SQ), _words("""
        break case catch class const continue debugger default delete do else export extends false finally for
        from function if import in instanceof let new null of return super switch this throw true try typeof
        undefined var void while with yield async await static get set interface type enum implements
        private protected public readonly abstract declare namespace as keyof any number string boolean never
        unknown""")),
    "c": Language((_LINE_COMMENT, _BLOCK_COMMENT), (_DQ, _SQ), _C_FAMILY | _words("#include #define #ifdef #endif")),
    "shell": Language((r"(?<![\w$])#[^\n]*",), (_DQ, r"'[^']*'?"), _words("""
        if then else elif fi for while until do done case esac in function return local export readonly
        declare set unset shift exit echo cd source alias trap eval exec test""")),
    "json": Language((), (_DQ,), _words("true false null")),
    "sql": Language((r"--[^\n]*", _BLOCK_COMMENT), (_SQ, _DQ), _words("""
        select from where and or not insert into values update set delete create table drop alter index
        join left right inner outer on group by order having limit offset as distinct union all null is
        in like between case when then else end primary key references default exists count sum avg min
        max with recursive pragma begin commit rollback transaction integer text real"""), case_sensitive=False),
}
ALIASES = {
    "py": "python", "python3": "python", "py3": "python", "pycon": "python", "ipython": "python",
    "js": "javascript", "jsx": "javascript", "ts": "javascript", "tsx": "javascript", "typescript": "javascript",
    "mjs": "javascript", "node": "javascript",
    "cpp": "c", "c++": "c", "cc": "c", "h": "c", "hpp": "c", "cxx": "c", "java": "c", "go": "c", "golang": "c",
    "rust": "c", "rs": "c", "cs": "c", "csharp": "c", "c#": "c", "kotlin": "c", "kt": "c", "swift": "c",
    "scala": "c", "dart": "c", "php": "c", "objc": "c", "objective-c": "c",
    "sh": "shell", "bash": "shell", "zsh": "shell", "console": "shell", "shell-session": "shell", "ksh": "shell",
    "jsonc": "json", "json5": "json", "postgresql": "sql", "sqlite": "sql", "mysql": "sql", "psql": "sql",
}


def language(lang: str) -> str:
    """The lexer's name for a fence's language tag ("" when there is none for it)."""
    name = lang.strip().lower()
    name = ALIASES.get(name, name)
    return name if name in LANGUAGES else ""


@lru_cache(maxsize=None)
def _pattern(name: str) -> re.Pattern:
    spec = LANGUAGES[name]
    parts = [f"(?P<comment>{'|'.join(spec.comments)})"] if spec.comments else []
    parts += [f"(?P<string>{'|'.join(spec.strings)})", f"(?P<number>{_NUMBER})", f"(?P<word>#?{_WORD})"]
    return re.compile("|".join(parts))


def spans(code: str, lang: str) -> list[tuple[int, int, str]]:
    """The highlighted parts of `code`: (start, end, kind), in order and not overlapping."""
    name = language(lang)
    if not name:
        return []
    spec = LANGUAGES[name]
    out = []
    for match in _pattern(name).finditer(code):
        kind = match.lastgroup
        if kind == "word":
            word = match.group()
            if (word if spec.case_sensitive else word.lower()) not in spec.keywords:
                continue
            kind = "keyword"
        out.append((match.start(), match.end(), kind))
    return out


def kinds(code: str, lang: str) -> list[str]:
    """Each character's token kind ("" where it is not highlighted)."""
    out = [""] * len(code)
    for start, end, kind in spans(code, lang):
        out[start:end] = [kind] * (end - start)
    return out
