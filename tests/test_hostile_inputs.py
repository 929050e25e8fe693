"""Hostile inputs: chat templates under limits, prompts refused before tokenizing, bad CLI
arguments and files as one-line errors, and the app starting with a bad settings file and
another program's database (issue 15, parts 2, 3, 5 and the lesser items)."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from specdesk.app.runtime.compare import load_prompts
from specdesk.app.chat.templates import TemplateLimits, render_chat
from specdesk.engines.speculation.loop import PromptTooLong, check_prompt_text, is_prompt_too_long
from specdesk.engines.types import SpecDeskError

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Write a parser."},
    {"role": "assistant", "content": "<think>plan</think>def parse(argv): ..."},
    {"role": "user", "content": "Now sort a list."},
]

# Shapes real templates use: ChatML with a system default, Llama-3-style headers with
# namespace and raise_exception, Qwen-style reverse scans with string methods and slices,
# and a recursive macro rendering a nested schema a few levels deep.
REAL_TEMPLATES = {
    "chatml": (
        "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
        "<|im_start|>{{ message['role'] }}\n{{ message['content'] | trim }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
    "llama3": (
        "{{- bos_token }}{%- set ns = namespace(system='', turns=0) %}"
        "{%- if messages[0]['role'] == 'system' %}{%- set ns.system = messages[0]['content'] | trim %}"
        "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
        "<|start_header_id|>system<|end_header_id|>\n\n{{ ns.system }}<|eot_id|>"
        "{%- for message in loop_messages %}"
        "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}"
        "{%- set ns.turns = ns.turns + 1 %}"
        "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim "
        "+ '<|eot_id|>' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
        "{{- '' if ns.turns else eos_token }}"),
    "qwen-think": (
        "{%- set ns = namespace(last_query_index=messages|length - 1) %}"
        "{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"
        "{%- if message.role == 'user' and ns.last_query_index == messages|length - 1 %}"
        "{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}"
        "{%- for message in messages %}{%- set content = message.content %}"
        "{%- if message.role == 'assistant' and '</think>' in content %}"
        "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
        "{{- '<|im_start|>' ~ message.role ~ '\\n' ~ content ~ '<|im_end|>\\n' }}"
        "{%- endfor %}{{- '%d/%s' % (ns.last_query_index, messages|map(attribute='role')|join(',')) }}"
        "{{- ' {}'.format(messages|selectattr('role', 'equalto', 'user')|list|length) }}"
        "{{- ' ' + '/'.join(messages|map(attribute='role')) }}"),
    "schema-macro": (
        "{%- macro render(value, depth) -%}{%- if value is mapping -%}{{ '{' }}"
        "{%- for key, item in value|dictsort -%}{{ key }}: {{ render(item, depth + 1) }}{{ ', ' if not loop.last }}"
        "{%- endfor -%}{{ '}' }}{%- else -%}{{ value | tojson }}{%- endif -%}{%- endmacro -%}"
        "{{ render({'type': 'object', 'properties': {'a': {'type': 'array', 'items': {'type': 'string'}}}}, 0) }}"
        "{% for m in messages %}[{{ m.role | upper }}] {{ m.content | truncate(40) | indent(2) }}\n{% endfor %}"
        "{{ ('=' * 20) | center(30) }}{{ [1, 2, 3] | sum }}{{ range(3) | list }}"),
}


def plain_sandbox(template: str) -> str:
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = lambda message: (_ for _ in ()).throw(RuntimeError(message))
    return environment.from_string(template).render(messages=MESSAGES, bos_token="<s>", eos_token="</s>",
                                                    add_generation_prompt=True)


@pytest.mark.parametrize("name", sorted(REAL_TEMPLATES))
def test_real_template_shapes_render_as_in_a_plain_sandbox(name):
    template = REAL_TEMPLATES[name]
    ours = render_chat(template, MESSAGES, bos_token="<s>", eos_token="</s>", source="model.gguf")
    assert ours == plain_sandbox(template)
    assert ours


def test_a_long_conversation_is_not_refused_for_its_length():
    """The limits grow with the messages: a 3 MB conversation renders in full."""
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} " + "x" * 30_000}
                for i in range(100)]
    text = render_chat(REAL_TEMPLATES["chatml"], messages, source="model.gguf")
    assert len(text) > 3_000_000 and text.count("<|im_start|>") == 102


SLOW = ("steps", "ran longer than")  # whichever of the two limits a slow machine meets first

# template text -> what the refusal says (or one of several)
HOSTILE_TEMPLATES = {
    "nested range loops": ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
                           SLOW),
    "nested string loops": ("{% for a in 'x' * 99999 %}{% for b in 'y' * 99999 %}{{ '' }}{% endfor %}{% endfor %}",
                            SLOW),
    "huge range": ("{{ range(10**9) | length }}", "range(1000000000) has 1,000,000,000 items"),
    "astronomic range": ("{% for i in range(10**100) %}{% endfor %}", "has about 10^100 items"),
    "huge range in a loop": ("{% for i in range(10**9) %}{{ i }}{% endfor %}", "over the limit of 100,000"),
    "string repetition": ("{{ 'x' * 10**10 }}", "a repetition would be 10,000,000,000 characters"),
    "list repetition": ("{{ ['x' * 1000] * 10**6 }}", "a repetition would be"),
    "recursive macro": ("{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}", "calls nest deeper than 64"),
    "recursive loop": ("{% for x in [1] recursive %}{{ loop([1]) }}{% endfor %}", "calls nest deeper than 64"),
    "exponential macro": ("{% macro m(n) %}{% if n < 40 %}{{ m(n + 1) }}{{ m(n + 1) }}{% endif %}{% endmacro %}"
                          "{{ m(0) }}", SLOW),
    "doubling concatenation": ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                               "{% endfor %}{{ ns.s }}", "a '~' concatenation would be"),
    "huge integer": ("{{ 2 ** (10 ** 9) }}", "bits is over the limit"),
    "percent format width": ("{{ '%0999999999d' % 1 }}", "a formatted string would be"),
    "format method width": ("{{ '{:>999999999}'.format(1) }}", "a formatted string would be"),
    "filter width": ("{{ 'x' | center(10**9) }}", "the filter 'center' was given 1,000,000,000"),
    "replace amplification": ("{{ ('x' * 900000).replace('', 'yy') }}", "a replace would be"),
    "join of shared references": ("{% set s = 'x' * 900000 %}{% set l = [s] %}{% set l = l + l %}"
                                  "{{ l | join }}", "a '+' would be"),
    "nested literals": ("{% set a = ['x' * 200000] %}{% set b = [a, a, a, a, a, a] %}{{ [b, b, b, b] | string }}",
                        "a literal would be"),
    "block of fresh copies": ("{% set s = 'x' * 900000 %}{% set x %}{% for i in range(99999) %}{{ s ~ '' }}"
                              "{% endfor %}{% endset %}{{ x | length }}", "output values add up to more than"),
    "output too large": ("{% for i in range(3000) %}{{ 'x' * 999 }}{% endfor %}", "the output would be"),
    "deeply nested expression": ("{{ " + "(" * 50_000 + "1" + ")" * 50_000 + " }}", "nests too deeply"),
    "lipsum loop": ("{{ lipsum(999999) }}", "'lipsum' is undefined"),
    "python internals": ("{{ ''.__class__.__mro__ }}", "reaches for Python internals"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_TEMPLATES))
def test_hostile_templates_are_refused_in_one_line_with_bounded_memory(name):
    template, expected = HOSTILE_TEMPLATES[name]
    threads = set(threading.enumerate())
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(SpecDeskError) as refused:
            render_chat(template, [{"role": "user", "content": "hi"}], source="evil.gguf")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    elapsed = time.monotonic() - started
    message = str(refused.value)
    assert "\n" not in message and message.startswith("the chat template of evil.gguf "), message
    assert any(e in message for e in ((expected,) if isinstance(expected, str) else expected)), message
    # Bounds that only a missing limit can break (each case alone would take minutes or GBs).
    assert elapsed < TemplateLimits().max_seconds + 60, f"{name}: {elapsed:.1f} s"
    assert peak < 200 * 2**20, f"{name}: {peak / 2**20:.0f} MB"
    # the deadline needs no watcher thread (one an earlier test left may end meanwhile: only new ones count)
    assert not set(threading.enumerate()) - threads


def test_the_time_limit_ends_a_slow_template():
    """A loop that stays under the step limit but not the deadline (the render's own CPU time) is stopped at it."""
    limits = TemplateLimits(max_seconds=0.3, max_steps=10**9)
    started = time.monotonic()
    with pytest.raises(SpecDeskError, match="ran longer than 0.3 s"):
        render_chat("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
                    [], source="slow.gguf", limits=limits)
    assert time.monotonic() - started < 60  # the deadline held: without it, hours


def test_an_oversized_template_is_refused_before_parsing():
    with pytest.raises(SpecDeskError, match="the chat template of big.gguf was refused: it is 300,000 characters"):
        render_chat("x" * 300_000, [], source="big.gguf")


# --- prompts against the context ---------------------------------------------------
@pytest.fixture(scope="module")
def small_engine(demo_family):
    from specdesk.engines.llama.engine import LlamaEngine

    engine = LlamaEngine(demo_family["target_gguf"], n_ctx=256, n_threads=1)
    yield engine
    engine.close()


def test_a_50_mb_prompt_is_refused_before_tokenizing(small_engine):
    from specdesk.app.chat.prompting import text_tokens

    prompt = "def parse(argv):\n    return argv\n" * (50 * 2**20 // 34)
    started = time.monotonic()
    with pytest.raises(PromptTooLong) as refused:  # raised only by the check that runs before tokenizing
        text_tokens(small_engine, prompt)
    message = str(refused.value)
    assert "\n" not in message and "more than the context of 256 tokens can hold" in message
    assert time.monotonic() - started < 120  # a bound on a hang only; PromptTooLong itself shows the early check


def test_text_that_may_fit_still_goes_to_the_tokenizer(small_engine):
    from specdesk.app.chat.prompting import text_tokens

    # Longer than the context in characters, but not provably too long: tokenized, then the
    # engine's own token count decides.
    prompt = "ab " * 200
    tokens = text_tokens(small_engine, prompt)
    assert tokens == small_engine.tokenize(prompt)


def test_the_bound_never_exceeds_real_token_counts(small_engine):
    """Soundness of the quick check: on real text, and on text made of the vocabulary's
    longest token, no token covers more characters than max_token_chars says."""
    from specdesk.app.storage.paths import assets_dir
    from specdesk.engines.speculation.loop import max_token_chars

    model = small_engine.target
    longest = max(range(model.n_vocab), key=lambda t: len(model.token_bytes(t)))
    texts = load_prompts(assets_dir() / "prompts" / "code.jsonl")
    texts += [Path(json.__file__).read_text(), model.token_bytes(longest).decode("utf-8", "replace") * 50]
    for special in (False, True):
        bound = max_token_chars(model, special)
        for text in texts:
            tokens = model.tokenize(text, add_bos=False, parse_special=special)
            assert len(tokens) * bound >= len(text), (special, text[:40])
            check_prompt_text(text, len(tokens) + 1, model, special)  # it fits: never refused


def test_a_lone_surrogate_in_a_prompt_is_one_line(small_engine):
    from specdesk.app.chat.prompting import text_tokens

    with pytest.raises(SpecDeskError, match=r"character 3 is a lone surrogate \('\\udc80'\)"):
        text_tokens(small_engine, "ab\udc80cd")


def test_a_huge_chat_message_is_refused_as_too_long_not_as_a_slow_template(small_engine):
    """The demo template loops over a message's lines: 2 million lines would stop it on its
    step limit, a reason that misleads. The message is refused as too long before rendering."""
    from specdesk.app.chat.prompting import chat_prompt

    with pytest.raises(PromptTooLong, match="the prompt is too long: 12,000,000 characters"):
        chat_prompt(small_engine, [{"role": "user", "content": "x = 1\n" * 2_000_000}])


def test_a_long_conversation_keeps_the_most_turns_that_fit(small_engine):
    from specdesk.app.chat.prompting import chat_prompt, fit_chat

    conversation = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: sort the list {i}"}
                    for i in range(3001)]
    tokens, dropped = fit_chat(small_engine, conversation, reserve=32)
    assert len(tokens) + 32 <= small_engine.n_ctx
    assert tokens == chat_prompt(small_engine, conversation[dropped:])
    assert len(chat_prompt(small_engine, conversation[dropped - 1:])) + 32 > small_engine.n_ctx  # one more would not fit


def test_a_conversation_drops_oldest_turns_before_one_long_message_is_refused(small_engine):
    from specdesk.app.chat.prompting import fit_chat

    huge = "word " * 300_000
    conversation = [{"role": "user", "content": huge}, {"role": "assistant", "content": "ok"},
                    {"role": "user", "content": "sort a list"}]
    tokens, dropped = fit_chat(small_engine, conversation, reserve=16)
    assert dropped >= 1 and 0 < len(tokens) + 16 <= small_engine.n_ctx
    with pytest.raises(SpecDeskError) as refused:
        fit_chat(small_engine, [{"role": "user", "content": huge}], reserve=16)
    assert is_prompt_too_long(refused.value)


# --- CLI: one line, exit status 2 ---------------------------------------------------
def run_specdesk(*argv: str, stdin: str = "", timeout: float = 120, env: dict | None = None):
    return subprocess.run([sys.executable, "-m", "specdesk.ui.cli", *argv], input=stdin, capture_output=True,
                          text=True, timeout=timeout, env=env or dict(os.environ, SPECDESK_LLAMA_LOG=""))


def assert_one_line_error(result, expected: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("specdesk: error: "), result.stderr
    assert expected in lines[0], lines[0]


def _prompt_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    invalid = tmp_path / "latin1.jsonl"
    invalid.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    surrogate = tmp_path / "surrogate.jsonl"
    surrogate.write_text('{"prompt": "a\\ud800b"}\n')
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"prompt": "ok"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    folder = tmp_path / "folder.jsonl"
    folder.mkdir()
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    return {
        "invalid UTF-8": (invalid, "latin1.jsonl, line 2: not UTF-8 text (byte 0xe9)"),
        "lone surrogate": (surrogate, "surrogate.jsonl, line 1: the prompt has a lone surrogate ('\\ud800')"),
        "100k-deep JSON": (deep, "deep.jsonl, line 2: JSON nested too deeply"),
        "a directory": (folder, "folder.jsonl: is a folder, not a regular file"),
        "a FIFO": (fifo, "fifo.jsonl: is a FIFO (named pipe), not a regular file"),
    }


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_bad_prompts_files_are_refused_by_name(tmp_path):
    for name, (path, expected) in _prompt_files(tmp_path).items():
        with pytest.raises(SpecDeskError) as refused:
            load_prompts(path)
        assert expected in str(refused.value) and "\n" not in str(refused.value), name


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_cli_bad_arguments_and_files_give_one_line_and_status_2(tmp_path, demo_family):
    target = demo_family["target_gguf"]
    compare = ["compare", "--target", target, "--method", "ngram", "--threads", "1", "--max-tokens", "4"]
    taken = tmp_path / "taken.txt"
    taken.write_text("mine")
    cases = {
        "negative seed": (compare + ["--seed", "-1"], "--seed -1 is out of range: use 0 to 4294967295"),
        "demo build over a file": (["demo", "build", "--small", "--out", str(taken)],
                                   f"--out {taken} exists and is not a folder"),
        "screenshot size": (["screenshot", "--out", str(tmp_path / "shots"), "--size", "40000x40000"],
                            "--size 40000x40000 is out of range: each side must be 1 to 8192 pixels"),
        "screenshot size text": (["screenshot", "--out", str(tmp_path / "shots"), "--size", "big"],
                                 "--size 'big' is not WIDTHxHEIGHT"),
    }
    for name, (path, expected) in _prompt_files(tmp_path).items():
        cases[f"prompts file: {name}"] = (compare + ["--prompts", str(path)], expected)
    for name, (argv, expected) in cases.items():
        result = run_specdesk(*argv, timeout=300)  # a FIFO opened for reading would block: the timeout fails it
        assert_one_line_error(result, expected)
    assert taken.read_text() == "mine" and not (tmp_path / "shots").exists()


def test_terminal_chat_goes_on_after_an_over_long_message(demo_family):
    huge = "def parse(argv): return argv " * 40_000  # about 1.1 MB on one line
    result = run_specdesk("chat", "--target", demo_family["target_gguf"], "--method", "ngram", "--ctx", "256",
                          "--max-tokens", "8", "--threads", "1", stdin=f"{huge}\nsort a list\n\n", timeout=300)
    assert result.returncode == 0, result.stderr
    refusals = [line for line in result.stderr.splitlines() if line.startswith("specdesk: ")]
    assert len(refusals) == 1 and "the prompt is too long" in refusals[0], result.stderr
    replies = [line for line in result.stderr.splitlines() if line.startswith("[8 tokens")]
    assert len(replies) == 1, result.stderr  # the next message was answered, in full
    assert "Traceback" not in result.stderr


def test_screenshot_leaves_no_temporary_folders(demo_family, demo_cache_dir, tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, SPECDESK_CACHE_DIR=str(demo_cache_dir), TMPDIR=str(scratch), QT_QPA_PLATFORM="offscreen",
               SPECDESK_LLAMA_LOG="")
    result = run_specdesk("screenshot", "--out", str(tmp_path / "shots"), "--threads", "1", "--size", "640x480",
                          timeout=600, env=env)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "shots").iterdir()) == ["compare.png", "main-window.png", "pairing.png"]
    assert [p.name for p in scratch.iterdir() if p.name.startswith("specdesk-")] == []


# --- settings.json and history.sqlite3 ------------------------------------------------
def test_settings_with_hostile_values_fall_back_per_field_and_are_kept(tmp_path):
    from specdesk.app.storage.settings import Settings, read_settings

    path = tmp_path / "settings.json"
    original = ('{"k": 6, "seed": 2147483648, "max_tokens": 99999999999999999999, "temperature": NaN, '
                '"top_p": "high", "threads": -1, "method": "warp", "recent_targets": ["a.gguf", 5], '
                '"target_path": "x\\u0000y", "compare_prompt": "hi"}').encode()
    path.write_bytes(original)
    settings, notice = read_settings(path)
    assert settings == Settings(k=6, compare_prompt="hi")  # NaN is refused, not clamped to 10
    assert "\n" not in notice and "temperature = NaN" in notice and "seed = 2147483648" in notice
    [aside] = tmp_path.glob("settings.json.bad-*")
    assert aside.read_bytes() == original and not path.exists()
    assert f"the file was kept as {aside.name}" in notice


@pytest.mark.parametrize("content, reason", [
    (b"[" * 100_000 + b"]" * 100_000, "is JSON nested too deeply"),
    (b'{"k": 1' + b"9" * 5000 + b"}", "is not valid JSON"),
    (b"\xff\xfe{}", "is not UTF-8 text"),
    (b"[1, 2]", "is not a JSON object"),
])
def test_unreadable_settings_give_defaults_and_are_kept(tmp_path, content, reason):
    from specdesk.app.storage.settings import Settings, read_settings

    path = tmp_path / "settings.json"
    path.write_bytes(content)
    settings, notice = read_settings(path)
    assert settings == Settings() and reason in notice and "\n" not in notice
    [aside] = tmp_path.glob("settings.json.bad-*")
    assert aside.read_bytes() == content


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_settings_fifo_does_not_block(tmp_path):
    from specdesk.app.storage.settings import read_settings

    os.mkfifo(tmp_path / "settings.json")
    settings, notice = read_settings(tmp_path / "settings.json")
    assert "is not a regular file" in notice


def foreign_database(path: Path) -> str:
    db = sqlite3.connect(path)
    db.executescript("CREATE TABLE notes(id INTEGER PRIMARY KEY, text TEXT); INSERT INTO notes(text) VALUES ('x');"
                     "CREATE TABLE chats(id INTEGER PRIMARY KEY, something TEXT);")
    db.commit()
    db.close()
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_another_programs_database_is_refused_untouched(tmp_path):
    from specdesk.app.storage.history import History

    path = tmp_path / "history.sqlite3"
    digest = foreign_database(path)
    with pytest.raises(SpecDeskError, match="another program's SQLite database \\(tables: chats, notes\\)"):
        History(path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.sqlite3"]  # no -wal / -shm left either


def test_a_database_with_our_table_names_but_not_our_columns_is_refused(tmp_path):
    from specdesk.app.storage.history import History

    path = tmp_path / "history.sqlite3"
    db = sqlite3.connect(path)
    db.executescript("CREATE TABLE chats(id INTEGER PRIMARY KEY, topic TEXT); INSERT INTO chats(topic) VALUES ('x');")
    db.close()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(SpecDeskError, match="another program's SQLite database \\(tables: chats\\)"):
        History(path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_our_database_is_marked_and_an_unmarked_one_of_ours_is_adopted(tmp_path):
    from specdesk.app.storage.history import APPLICATION_ID, History

    path = tmp_path / "history.sqlite3"
    history = History(path)
    history.create_chat("kept")
    history._db.execute("PRAGMA application_id = 0")  # as written before the mark existed
    history.close()
    history = History(path)
    assert [c.title for c in history.chats()] == ["kept"]
    history.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    db.close()


def test_a_history_path_that_is_a_folder_is_refused(tmp_path):
    from specdesk.app.storage.history import History

    (tmp_path / "history.sqlite3").mkdir()
    with pytest.raises(SpecDeskError, match="not a regular file"):
        History(tmp_path / "history.sqlite3")


def test_a_temporary_history_removes_its_folder():
    from specdesk.app.storage.history import History

    history = History.temporary()
    history.create_chat("session only")
    folder = history.path.parent
    assert folder.name.startswith("specdesk-") and folder.is_dir()
    history.close()
    assert not folder.exists()


# --- the app starting with both -----------------------------------------------------------
@pytest.mark.parametrize("settings_content", [
    b'{"k": 4, "seed": 2147483648, "top_k": 4294967296, "temperature": NaN, "max_tokens": 256}',
    b"[" * 100_000 + b"]" * 100_000,
])
def test_the_app_starts_with_a_bad_settings_file_and_a_foreign_database(qtbot, tmp_path, monkeypatch,
                                                                         settings_content):
    pytest.importorskip("pytestqt")
    from PySide6.QtWidgets import QMessageBox

    from specdesk.ui.main_window import MainWindow

    config, data = tmp_path / "config", tmp_path / "data"
    config.mkdir()
    data.mkdir()
    monkeypatch.setenv("SPECDESK_CONFIG_DIR", str(config))
    monkeypatch.setenv("SPECDESK_DATA_DIR", str(data))
    (config / "settings.json").write_bytes(settings_content)
    digest = foreign_database(data / "history.sqlite3")
    shown = []
    monkeypatch.setattr(QMessageBox, "critical", lambda parent, title, text, *a, **k: shown.append(text))

    window = MainWindow(autoload=False)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: len(shown) == 2, timeout=10_000)
    assert all("\n" not in text for text in shown), shown
    assert "settings.json" in shown[0] and "the file was kept as settings.json.bad-" in shown[0]
    assert "another program's SQLite database" in shown[1] and "will not be kept" in shown[1]
    assert window.controls.seed_spin.value() == 0 and window.controls.temperature_spin.value() == 0.0
    temporary = window.history.path.parent
    assert temporary.is_dir() and window.history.create_chat("this session")

    window.close()
    assert not temporary.exists()  # the fallback history's folder goes with it
    assert hashlib.sha256((data / "history.sqlite3").read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in data.iterdir()) == ["history.sqlite3"]
    [aside] = config.glob("settings.json.bad-*")
    assert aside.read_bytes() == settings_content
    saved = json.loads((config / "settings.json").read_text())  # defaults, saved at close beside the kept file
    assert saved["seed"] == 0 and saved["temperature"] == 0.0


# --- tokenizer.json sizes ------------------------------------------------------------
def gemma_sized_tokenizer(folder: Path, n_tokens: int = 262_144) -> Path:
    """A real BPE tokenizer.json with Gemma 3's vocabulary size, indented as the hub's files
    are: about 35 MB, over the 16 MiB that config files get (Gemma 3's own is 33 MB)."""
    import random

    base = [chr(c) for c in range(0x4E00, 0x4E00 + 4096)]  # one character, three UTF-8 bytes, each
    vocab = {t: i for i, t in enumerate(base)}
    tokens, merges = list(base), []
    rng = random.Random(0)
    while len(vocab) < n_tokens:
        a, b = tokens[rng.randrange(len(tokens))], tokens[rng.randrange(len(tokens))]
        if len(a) + len(b) <= 22 and a + b not in vocab:
            vocab[a + b] = len(vocab)
            tokens.append(a + b)
            merges.append([a, b])
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
             "vocab": vocab, "merges": merges}
    data = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": None, "post_processor": None, "decoder": None, "model": model}
    folder.mkdir(exist_ok=True)
    path = folder / "tokenizer.json"
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
    return path


def test_a_tokenizer_the_size_of_gemma_3s_loads(tmp_path):
    pytest.importorskip("tokenizers")
    from specdesk.engines.hf_config import MAX_CONFIG_BYTES
    from specdesk.engines.torch.tokenizer import MAX_TOKENIZER_BYTES, HfTokenizer

    path = gemma_sized_tokenizer(tmp_path / "gemma-sized")
    assert 33_384_568 <= path.stat().st_size <= MAX_TOKENIZER_BYTES and path.stat().st_size > MAX_CONFIG_BYTES
    tokenizer = HfTokenizer(path.parent)
    assert tokenizer.vocab.n_tokens == 262_144
    assert tokenizer.tokenize("\u4e00\u4e01\u4e02", add_bos=False) == [0, 1, 2]


@pytest.mark.parametrize("size", [218 * 10**6, 2 * 2**30], ids=["218MB", "2GB"])
def test_an_oversized_tokenizer_is_refused_before_any_parse(tmp_path, size):
    from specdesk.engines.torch.tokenizer import MAX_TOKENIZER_BYTES, HfTokenizer

    folder = tmp_path / "model"
    folder.mkdir()
    with open(folder / "tokenizer.json", "wb") as f:
        f.truncate(size)  # sparse: no disk used
    tracemalloc.start()
    try:
        with pytest.raises(SpecDeskError) as refused:
            HfTokenizer(folder)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20  # nothing of the file was read: reading it would hold its whole size
    message = str(refused.value)
    assert "\n" not in message and f"{size} bytes is not a plausible tokenizer.json file" in message
    assert f"the limit is {MAX_TOKENIZER_BYTES}" in message


# --- clients that go away, engines that stop (the CLI's and serve's watchdogs) -------------
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and sockets")
def test_twenty_abandoned_requests_are_all_stopped_and_the_next_client_is_answered(demo_family):
    import socket

    from test_serve import MODEL, raw_post, read_metrics, start_limited_server, stop_server

    child, url = start_limited_server(demo_family["target_gguf"], "--ctx", "4096")
    try:
        host, port = url.removeprefix("http://").removesuffix("/v1").split(":")
        body = json.dumps({"model": MODEL, "prompt": "import os\n", "max_tokens": 4000, "temperature": 0}).encode()
        abandoned = []
        for _ in range(20):
            s = socket.create_connection((host, int(port)), timeout=30)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            abandoned.append(s)
        time.sleep(0.3)  # the first has started; the others wait for the engine
        for s in abandoned:
            s.close()
        short = json.dumps({"model": MODEL, "prompt": "import os\n", "max_tokens": 8, "temperature": 0}).encode()
        status, text = raw_post(url, "/v1/completions", short, key=None, timeout=120)
        assert status == 200 and json.loads(text)["usage"]["completion_tokens"] == 8
        metrics = read_metrics(url)
        aborted = 'specdesk:request_success_total{finished_reason="abort"}'
        finished = 'specdesk:request_success_total{finished_reason="length"}'
        # the run in progress was stopped; the waiting ones were dropped before they started
        assert metrics.get(aborted, 0) >= 1 and metrics.get(finished) == 1, metrics  # length: the short one only
        assert metrics["specdesk:generation_tokens_total"] < 4000, metrics
        assert metrics["specdesk:num_requests_running"] == metrics["specdesk:num_requests_waiting"] == 0
    finally:
        stop_server(child)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the engine process through /proc")
def test_compare_ends_an_engine_that_stops_answering_in_one_line(demo_family):
    """`specdesk compare` waits on the engine as `chat` does: a stopped engine process is ended
    after Stop's grace, with one line and exit status 2 (tests/test_engine_host.py has chat)."""
    import re
    import signal

    from test_serve import engine_processes

    child = subprocess.Popen([sys.executable, "-u", "-m", "specdesk.app.main", "compare", "--target",
                              demo_family["target_gguf"], "--method", "ngram", "--threads", "1", "--ctx", "4096",
                              "--max-tokens", "4000", "--prompt", "import os\n"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not engine_processes(child.pid):
            assert child.poll() is None and time.monotonic() < deadline, "no engine process started"
            time.sleep(0.1)
        time.sleep(2.0)  # loaded and comparing by now (a stop while it loads gets the load's longer grace)
        (host,) = engine_processes(child.pid)
        os.kill(host, signal.SIGSTOP)
        _, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    errors = [line for line in err.splitlines() if line.startswith("specdesk")]
    assert child.returncode == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert re.match(r"specdesk: error: the engine process for specdesk-demo-target-F16\.gguf sent nothing for \d+ s "
                    r".*\(it is stopped or stuck\) and was ended$", errors[0]), errors[0]


@pytest.mark.parametrize("spins", [0, 1, 2])
def test_a_cancellation_that_comes_with_the_engines_next_piece_is_never_lost(spins):
    """serve stops the run of a client that went away by cancelling the request's task; a
    cancellation that comes as the engine's next piece arrives must still be raised (Python
    3.11's asyncio.wait_for returns the piece and drops it), and the piece stays queued."""
    import asyncio

    from specdesk.app.serving.engine_queue import next_item

    async def scenario() -> None:
        queue: asyncio.Queue = asyncio.Queue()
        task = asyncio.ensure_future(next_item(queue, 60))
        await asyncio.sleep(0)  # waiting for the engine
        queue.put_nowait(("text", "a"))
        for _ in range(spins):
            await asyncio.sleep(0)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert queue.get_nowait() == ("text", "a")
        with pytest.raises(asyncio.TimeoutError):
            await next_item(queue, 0.01)
        queue.put_nowait(("result", None))
        assert await next_item(queue, 1) == ("result", None)

    asyncio.run(scenario())
