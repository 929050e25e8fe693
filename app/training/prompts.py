"""The prompt set the target answers to make training data, and its held-out split.

The bundled set (assets/training/prompts.jsonl) is written by `build_default_prompts`, from
templates of the project's own and from the first lines of the Python standard library's
docstrings (PSF licence), so it needs nothing from the network: code, prose, chat and maths.
A prompt file is JSONL with one {"prompt": "...", "kind": "..."} per line ("kind" optional).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from specdesk.engines.types import SpecDeskError

from ..storage.paths import assets_dir

KINDS = ("code", "prose", "chat", "maths")
HELD_OUT_PER_MILLE = 50  # prompts whose hash falls here are never trained on


@dataclass(frozen=True)
class Prompt:
    text: str
    kind: str = "chat"


def default_prompts_path() -> Path:
    return assets_dir() / "training" / "prompts.jsonl"


def load_prompt_set(path: str | Path) -> list[Prompt]:
    """Prompts of a JSONL file (the prompts file the compare reads, with an optional "kind"); a
    broken line is named with its number."""
    from specdesk.app.runtime.compare import load_prompt_records

    prompts = []
    for number, record in load_prompt_records(path):
        if not record["prompt"].strip():
            raise SpecDeskError(f'{path}, line {number}: expected an object with a non-empty "prompt" string')
        kind = record.get("kind", "chat")
        if not isinstance(kind, str):
            raise SpecDeskError(f'{path}, line {number}: "kind" must be a string')
        prompts.append(Prompt(record["prompt"], kind))
    return prompts


def history_prompts(path: str | Path | None = None, max_chars: int = 4000) -> list[Prompt]:
    """The user's own messages from their saved chats (the app's and the terminal's history, or
    `path`), as chat prompts: each text once, in the order written, cut to `max_chars`, edited
    versions included. Read on this machine; nothing is sent anywhere. No history file is
    created where there is none."""
    from ..storage.history import History, history_path

    path = Path(path) if path is not None else history_path()
    if not path.is_file():
        raise SpecDeskError(f"--from-history: there are no saved chats at {path}")
    history = History(path)
    try:
        seen, prompts = set(), []
        for chat in sorted(history.chats(), key=lambda c: c.created):
            for message in history.all_messages(chat.id):
                text = message.content.strip()[:max_chars]
                if message.role == "user" and text and text not in seen:
                    seen.add(text)
                    prompts.append(Prompt(text, "chat"))
    finally:
        history.close()
    return prompts


def training_prompts(prompts_path: str | Path, from_history: bool, say, history: str | Path | None = None) -> list[Prompt]:
    """The prompt set of a training run: the file's prompts, and with `from_history` the user's own
    saved chat messages after them (how many, and from where, is said before anything runs)."""
    from ..storage.history import history_path

    prompts = load_prompt_set(prompts_path)
    if from_history:
        path = Path(history) if history is not None else history_path()
        mine = history_prompts(path)
        if not mine:
            raise SpecDeskError(f"--from-history: the saved chats in {path} hold no message of yours yet")
        say(f"adding {len(mine)} messages of yours from the saved chats in {path} (read here; nothing leaves "
            "this machine)")
        prompts = prompts + mine
    return prompts


def is_held_out(prompt: Prompt) -> bool:
    """A fixed property of the prompt's text: the same prompts are held out on every run."""
    digest = hashlib.sha256(prompt.text.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "little") % 1000 < HELD_OUT_PER_MILLE


def split_prompts(prompts: list[Prompt], min_held_out: int = 2) -> tuple[list[Prompt], list[Prompt]]:
    """(training prompts, held-out prompts); a small set still holds out `min_held_out` (its last
    prompts not already held out)."""
    held = [p for p in prompts if is_held_out(p)]
    rest = [p for p in prompts if not is_held_out(p)]
    if len(held) < min_held_out:
        missing = min_held_out - len(held)
        held, rest = held + rest[len(rest) - missing:], rest[:len(rest) - missing]
    if not rest:
        raise SpecDeskError(f"{len(prompts)} prompts leave none to train on once {min_held_out} are held out: "
                            f"give at least {min_held_out + 1}")
    held_texts = {p.text for p in held}
    return [p for p in prompts if p.text not in held_texts], [p for p in prompts if p.text in held_texts]


# --- the bundled set -----------------------------------------------------------------------
_CODE_MODULES = ("collections", "itertools", "functools", "json", "os.path", "re", "string", "textwrap", "shutil",
                 "pathlib", "statistics", "heapq", "bisect", "difflib", "csv", "fractions", "decimal", "calendar",
                 "datetime", "random", "math", "operator", "copy", "pprint", "enum", "dataclasses", "argparse",
                 "logging", "tempfile", "glob", "fnmatch", "zipfile", "tarfile", "gzip", "base64", "hashlib",
                 "secrets", "uuid", "urllib.parse", "html", "email.utils", "ipaddress", "shlex", "configparser",
                 "sqlite3", "unittest", "inspect", "ast", "tokenize", "typing", "contextlib", "abc", "queue",
                 "threading", "subprocess", "socket", "struct", "array", "weakref", "types", "codecs", "locale")

_CHAT_TASKS = ("read a file line by line", "sort a list of dictionaries by a key", "merge two dictionaries",
               "count the words in a text", "remove duplicates from a list while keeping the order",
               "parse a date from a string", "walk a directory tree", "time a piece of code",
               "write a small command-line tool", "retry a function that sometimes fails",
               "split a list into chunks", "flatten a nested list", "read a CSV file", "write JSON to a file",
               "make an HTTP request", "handle a missing key in a dictionary", "run two tasks at once",
               "compare two files", "format a number with thousands separators", "validate an e-mail address",
               "reverse a string", "find the most common element", "cache the result of a slow function",
               "log messages to a file", "test a function")
_CHAT_FRAMES = ("How do I {task} in Python?", "What is the simplest way to {task}?",
                "Can you show me how to {task}, with a short example?", "I need to {task}. Where do I start?")
_PROSE_FRAMES = ("Explain in a short paragraph what this is for: {doc}",
                 "Write a few sentences for a beginner about the Python module {module}.",
                 "Describe, in plain words, when you would use {module}.",
                 "Summarise this in one sentence: {doc}")
_PROSE_TOPICS = ("a walk by the sea in winter", "why sleep matters", "how a library lends books", "a rainy market day",
                 "learning to ride a bicycle", "the history of the printing press", "how bread rises",
                 "what makes a good teacher", "a city at night", "the first day at a new job", "how bees find flowers",
                 "why the sky is blue", "a letter to an old friend", "keeping a garden through summer",
                 "a train journey across mountains", "how a river shapes a valley", "the smell of old books",
                 "planning a small party", "a lighthouse keeper's evening", "how maps are made")
_PROSE_TASKS = ("Write a short paragraph about {topic}.", "Tell a short story about {topic}.",
                "Describe {topic} in three sentences.", "Write a short essay opening about {topic}.")


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().split("\n\n")[0].replace("\n", " ").strip()


def _stdlib_functions() -> list[tuple[str, str, str, str]]:
    """(module, name, signature, first docstring line) of documented public functions."""
    import importlib
    import inspect

    found = []
    for module_name in _CODE_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name in sorted(dir(module)):
            obj = getattr(module, name, None)
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isbuiltin(obj)):
                continue
            doc = _first_line(inspect.getdoc(obj))
            if not 20 <= len(doc) <= 200:
                continue
            try:
                signature = str(inspect.signature(obj))
            except (TypeError, ValueError):
                continue
            found.append((module_name, name, signature, doc))
    return found


def _maths_prompts(rng) -> list[Prompt]:
    prompts = []
    for _ in range(80):
        a, b = int(rng.integers(11, 99)), int(rng.integers(11, 99))
        prompts.append(Prompt(f"What is {a} * {b}? Show the steps.", "maths"))
    for _ in range(60):
        a, b, c = int(rng.integers(2, 9)), int(rng.integers(1, 30)), int(rng.integers(31, 99))
        prompts.append(Prompt(f"Solve for x: {a}x + {b} = {c}. Explain each step.", "maths"))
    for _ in range(60):
        n, price = int(rng.integers(3, 20)), int(rng.integers(2, 15))
        prompts.append(Prompt(f"A shop sells pens at {price} euros each. How much do {n} pens cost, and how much "
                              f"change is there from {n * price + int(rng.integers(1, 20))} euros?", "maths"))
    for _ in range(40):
        n = int(rng.integers(5, 40))
        prompts.append(Prompt(f"What is the sum of the integers from 1 to {n}? Give the formula too.", "maths"))
    for _ in range(40):
        a, b = int(rng.integers(12, 200)), int(rng.integers(12, 200))
        prompts.append(Prompt(f"Find the greatest common divisor of {a} and {b} with Euclid's algorithm.", "maths"))
    return prompts


def build_default_prompts() -> list[Prompt]:
    """The bundled prompt set, deterministic for a given Python version."""
    import numpy as np

    rng = np.random.default_rng(26)
    prompts: list[Prompt] = []
    functions = _stdlib_functions()
    for module, name, signature, doc in functions[:400]:
        prompts.append(Prompt(f'def {name}{signature}:\n    """{doc}"""\n', "code"))
    for i, (module, name, signature, doc) in enumerate(functions[:200]):
        prompts.append(Prompt(f"Write a Python function `{name}{signature}` that does this: {doc}", "code"
                              if i % 2 else "chat"))
    modules = sorted({f[0] for f in functions})
    for i, module in enumerate(modules):
        doc = _first_line(__import__(module, fromlist=["_"]).__doc__)
        for j, frame in enumerate(_PROSE_FRAMES):
            if "{doc}" in frame and len(doc) < 20:
                continue
            prompts.append(Prompt(frame.format(doc=doc, module=module), "prose"))
    for topic in _PROSE_TOPICS:
        for task in _PROSE_TASKS:
            prompts.append(Prompt(task.format(topic=topic), "prose"))
    for task in _CHAT_TASKS:
        for frame in _CHAT_FRAMES:
            prompts.append(Prompt(frame.format(task=task), "chat"))
    prompts.extend(_maths_prompts(rng))
    unique: dict[str, Prompt] = {}
    for p in prompts:
        unique.setdefault(p.text, p)
    return list(unique.values())


def write_prompt_set(prompts: list[Prompt], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": p.text, "kind": p.kind}, ensure_ascii=False) + "\n"
                            for p in prompts), encoding="utf-8")


if __name__ == "__main__":
    import collections
    import sys

    target = Path(sys.argv[1]) if len(sys.argv) > 1 else default_prompts_path()
    built = build_default_prompts()
    write_prompt_set(built, target)
    print(f"{len(built)} prompts ({dict(collections.Counter(p.kind for p in built))}) -> {target}")
