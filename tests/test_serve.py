"""`specdesk serve` as a real process, spoken to by the real `openai` client (and plain HTTP).

Its replies must equal the in-process engine's for the same request: greedy, and sampled
with a seed; /metrics must add up to the per-request numbers each response carries.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")

from specdesk.app.runtime.generation import run_once  # noqa: E402
from specdesk.app.chat.prompting import chat_prompt  # noqa: E402
from specdesk.engines.types import GenerationRequest, SamplingParams, SpecConfig  # noqa: E402

API_KEY = "sk-specdesk-test"
MODEL = "specdesk-demo-target-F16"
CHAT = [{"role": "user", "content": "Write a function that parses command line arguments."}]


def start_server(*options: str):
    """`specdesk serve` with these options on a free localhost port: (process, its /v1 URL)."""
    child = subprocess.Popen([sys.executable, "-m", "specdesk.app.main", "serve", "--port", "0", *options],
                             stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    url, lines = None, []
    deadline = time.monotonic() + 120
    while url is None and time.monotonic() < deadline and child.poll() is None:
        if select.select([child.stderr], [], [], 1.0)[0]:
            line = child.stderr.readline()
            lines.append(line)
            match = re.search(r"at (http://\S+/v1)", line)
            url = match.group(1) if match else None
    assert url is not None, "".join(lines)
    return child, url


def stop_server(child) -> None:
    child.send_signal(signal.SIGINT)
    try:
        child.wait(15)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        pytest.fail("specdesk serve did not stop on Ctrl-C")


@pytest.fixture(scope="module")
def server(demo_family):
    """`specdesk serve` on the small demo pair (draft, k = 4)."""
    child, url = start_server("--target", demo_family["target_gguf"], "--draft", demo_family["draft_gguf"],
                              "--method", "draft", "--k", "4", "--threads", "1", "--api-key", API_KEY)
    yield url
    stop_server(child)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server, api_key=API_KEY, max_retries=0, timeout=120)


def reference(local, demo_family, tokens, max_tokens: int, sampling=SamplingParams(), method: str = "draft"):
    spec = SpecConfig(method=method, k=4, draft_path=demo_family["draft_gguf"] if method == "draft" else None)
    local.reset_chat()
    return run_once(local, GenerationRequest(tuple(tokens), max_tokens=max_tokens, sampling=sampling, spec=spec))


def http(server: str, path: str, body: bytes | None = None, key: str | None = API_KEY) -> tuple[int, dict | str]:
    request = urllib.request.Request(server.removesuffix("/v1") + path, data=body, method="POST" if body else "GET")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, text = response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def streamed_chat(client, **kwargs) -> tuple[str, list]:
    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, stream=True,
                                                 stream_options={"include_usage": True}, **kwargs))
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks


def test_models_lists_the_target(client):
    assert [m.id for m in client.models.list()] == [MODEL]


@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=0.8, seed=3)], ids=["greedy", "seeded"])
def test_chat_equals_the_in_process_engine_streamed_and_not(client, local, demo_family, sampling):
    expected = reference(local, demo_family, chat_prompt(local, CHAT), 40,
                         SamplingParams(temperature=sampling["temperature"], seed=sampling.get("seed", 0)))
    assert expected.text.strip() or not sampling.get("seed")  # the small model's greedy reply is blank lines
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=40, **sampling)
    assert reply.choices[0].message.content == expected.text
    assert reply.usage.completion_tokens == len(expected.tokens) == reply.specdesk["tokens"]
    assert reply.choices[0].finish_reason == {"length": "length", "eos": "stop"}[expected.finish_reason]
    numbers = reply.specdesk
    assert numbers["method"] == "draft" and numbers["k"] == 4 and numbers["tok_per_s"] > 0
    assert numbers["draft_tokens"] == sum(numbers["drafted_per_position"]) > 0
    assert numbers["accepted_tokens"] == sum(numbers["accepted_per_position"])
    assert len(numbers["acceptance_per_position"]) == 4

    text, chunks = streamed_chat(client, max_tokens=40, **sampling)
    assert text == expected.text
    assert chunks[0].choices[0].delta.role == "assistant"
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == len(expected.tokens)
    assert last.usage.prompt_tokens == reply.usage.prompt_tokens
    assert last.specdesk["draft_tokens"] == numbers["draft_tokens"]  # same run, same drafts


def test_completions_equal_the_in_process_engine_streamed_and_not(client, local, demo_family):
    prompt = "import argparse\n\n\ndef main("
    expected = reference(local, demo_family, local.tokenize(prompt), 32)
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=32, temperature=0)
    assert reply.choices[0].text == expected.text and reply.usage.completion_tokens == len(expected.tokens)
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=32, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == expected.text
    assert chunks[-1].choices[0].finish_reason == "length" and chunks[-1].specdesk["tokens"] == len(expected.tokens)


def test_stop_sequences_cut_the_text(client, local, demo_family):
    expected = reference(local, demo_family, chat_prompt(local, CHAT), 40, SamplingParams(temperature=0.8, seed=3))
    words = expected.text.split()
    stop = words[len(words) // 2]
    cut = expected.text[: expected.text.index(stop)]
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=40, temperature=0.8, seed=3,
                                           stop=[stop])
    assert reply.choices[0].message.content == cut and reply.choices[0].finish_reason == "stop"
    text, _ = streamed_chat(client, max_tokens=40, temperature=0.8, seed=3, stop=stop)
    assert text == cut


def test_a_request_can_ask_for_a_baseline_or_another_k(client):
    base = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24, temperature=0,
                                          extra_body={"speculative": {"method": "none"}})
    spec = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24, temperature=0,
                                          extra_body={"speculative": {"method": "ngram", "k": 2}})
    assert base.choices[0].message.content == spec.choices[0].message.content  # speculation is lossless
    assert base.specdesk["method"] == "none" and base.specdesk["draft_tokens"] == 0 and base.specdesk["k"] == 0
    assert spec.specdesk["method"] == "ngram" and len(spec.specdesk["drafted_per_position"]) == 2


def read_metrics(server: str) -> dict[str, float]:
    status, text = http(server, "/metrics")
    assert status == 200
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_metrics_are_the_sums_of_the_per_request_numbers(client, server):
    before = read_metrics(server)
    replies = [client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=n, temperature=t, seed=1)
               for n, t in ((16, 0), (30, 0.8), (8, 0))]
    _, chunks = streamed_chat(client, max_tokens=20, temperature=0)
    numbers = [r.specdesk for r in replies] + [chunks[-1].specdesk]
    usages = [r.usage for r in replies] + [chunks[-1].usage]
    after = read_metrics(server)

    def delta(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    assert delta("specdesk:spec_decode_num_drafts_total") == sum(n["drafts"] for n in numbers) > 0
    assert delta("specdesk:spec_decode_num_draft_tokens_total") == sum(n["draft_tokens"] for n in numbers)
    assert delta("specdesk:spec_decode_num_accepted_tokens_total") == sum(n["accepted_tokens"] for n in numbers)
    for position in range(4):
        assert delta(f'specdesk:spec_decode_num_accepted_tokens_per_pos_total{{position="{position}"}}') == \
            sum(n["accepted_per_position"][position] for n in numbers)
    assert delta("specdesk:generation_tokens_total") == sum(u.completion_tokens for u in usages)
    assert delta("specdesk:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert sum(delta(name) for name in after if name.startswith("specdesk:request_success_total")) == 4


def test_refusals_say_what_is_wrong(client, server):
    status, body = http(server, "/v1/models", key=None)
    assert status == 401 and "API key" in body["error"]["message"]
    assert http(server, "/metrics", key="wrong")[0] == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server, api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.chat.completions.create(model="gpt-4o", messages=CHAT)
    status, body = http(server, "/v1/chat/completions", body=b'{"model": "x", "messages": [')
    assert status == 400 and "not valid JSON" in body["error"]["message"]
    for fields, words in (({"temperature": -1}, "temperature"), ({"max_tokens": 0}, "max_tokens"),
                          ({"top_p": 2}, "top-p"), ({"extra_body": {"speculative": {"k": 99}}}, "k 99"),
                          ({"messages": []}, "messages")):
        arguments = {"model": MODEL, "messages": CHAT, **fields}
        with pytest.raises(openai.BadRequestError, match=words):
            client.chat.completions.create(**arguments)


def test_clients_at_once_are_served_in_turn(client, local, demo_family):
    expected = reference(local, demo_family, chat_prompt(local, CHAT), 24).text
    results, errors = [], []

    def ask(stream: bool) -> None:
        try:
            if stream:
                results.append(streamed_chat(client, max_tokens=24, temperature=0)[0])
            else:
                results.append(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24,
                                                              temperature=0).choices[0].message.content)
        except Exception as e:  # noqa: BLE001 - collected and reported below
            errors.append(e)

    threads = [threading.Thread(target=ask, args=(i % 2 == 0,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors and results == [expected] * 6


def test_serve_listens_on_localhost_unless_told(server):
    assert server.startswith("http://127.0.0.1:")


def engine_processes(server_pid: int) -> list[int]:
    """The server's engine host processes (multiprocessing 'spawn' children), from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            if parent == server_pid and b"spawn_main" in command:
                found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the engine process through /proc")
def test_an_engine_that_aborts_mid_request_gets_an_error_and_the_next_request_a_new_engine(demo_family, local):
    child, url = start_server("--target", demo_family["target_gguf"], "--method", "none", "--threads", "1",
                              "--ctx", "4096")
    try:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
        with pytest.raises(openai.APIError, match=r"engine process .* stopped \(SIGABRT\) while generating"):
            for i, _ in enumerate(client.completions.create(model=MODEL, prompt="import os\n", max_tokens=4000,
                                                            temperature=0, stream=True)):
                if i == 3:
                    (host,) = engine_processes(child.pid)
                    os.kill(host, signal.SIGABRT)  # what llama.cpp's GGML_ASSERT does
        expected = reference(local, demo_family, local.tokenize("import os\n"), 16, method="none")
        reply = client.completions.create(model=MODEL, prompt="import os\n", max_tokens=16, temperature=0)
        assert reply.choices[0].text == expected.text and child.poll() is None
        assert len(engine_processes(child.pid)) == 1  # the dead one was reaped, a new one serves
    finally:
        stop_server(child)


# --- hostile clients ----------------------------------------------------------------------
def raw_post(server: str, path: str, body: bytes, key: str | None = API_KEY, timeout: float = 60) -> tuple[int, str]:
    """POST bytes as they are (urllib would not send some of these) and read the answer."""
    request = urllib.request.Request(server.removesuffix("/v1") + path, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def read_answer(sock) -> bytes:
    """An HTTP answer with a JSON error body, read from a raw socket (headers and body may come apart)."""
    answer = b""
    while b"}}" not in answer:
        more = sock.recv(65536)
        if not more:
            break
        answer += more
    return answer


def test_bodies_that_would_hurt_the_server_are_refused_before_the_engine_sees_them(server):
    before = read_metrics(server)
    deep = b'{"model": "' + MODEL.encode() + b'", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    cases = [
        (deep, 400, "more than 64 levels deep"),
        (json.dumps({"model": MODEL, "prompt": "a\ud800b"}).encode(), 400, "lone surrogate"),
        (json.dumps({"model": MODEL, "prompt": "x" * 7_000_000}).encode(), 400, "the prompt is too long"),
        (json.dumps({"model": MODEL, "prompt": list(range(100_000))}).encode(), 400, "the context holds"),
        (b'{"model": "' + MODEL.encode() + b'", "prompt": "x", "temperature": NaN}', 400, "not a JSON number"),
    ]
    for field, value in (("seed", -1), ("seed", 2**40), ("top_k", 2**40), ("max_tokens", 2**40),
                         ("presence_penalty", 5.5), ("top_logprobs", -3)):
        cases.append((json.dumps({"model": MODEL, "prompt": "x", field: value}).encode(), 400,
                      f"'{field}' {value} is out of range"))
    for body, status, words in cases:
        got, text = raw_post(server, "/v1/completions", body)
        assert got == status and words in json.loads(text)["error"]["message"], (words, text[:300])
        assert "Traceback" not in text and len(text) < 2000
    many = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}] * 5000}).encode()
    status, text = raw_post(server, "/v1/chat/completions", many)
    assert status == 400 and "'messages' has 5,000 messages: send at most 4,096" in text
    # a body over the limit is refused from its Content-Length, before it is read
    import socket

    host, port = server.removeprefix("http://").removesuffix("/v1").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Authorization: Bearer {API_KEY}\r\nContent-Length: {9 * 2**20}\r\n\r\n".encode() + b"{")
        answer = read_answer(s).decode()
    assert answer.startswith("HTTP/1.1 413 ") and "over 8 MiB" in answer, answer
    after = read_metrics(server)
    assert after["specdesk:prompt_tokens_total"] == before["specdesk:prompt_tokens_total"]  # nothing was tokenized
    status, body = http(server, "/v1/models")
    assert status == 200 and body["data"][0]["id"] == MODEL  # and the server is still there


def test_a_client_that_goes_away_stops_its_generation(demo_family):
    import socket

    child, url = start_limited_server(demo_family["target_gguf"], "--ctx", "4096")
    try:
        host, port = url.removeprefix("http://").removesuffix("/v1").split(":")
        body = json.dumps({"model": MODEL, "prompt": "import os\n", "max_tokens": 4000, "temperature": 0}).encode()
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            time.sleep(0.3)  # the run has started; a non-streamed client hears nothing until it ends
        aborted = 'specdesk:request_success_total{finished_reason="abort"}'
        deadline = time.monotonic() + 60
        while aborted not in read_metrics(url):
            assert time.monotonic() < deadline, "the abandoned request was never stopped"
            time.sleep(0.2)
        metrics = read_metrics(url)
        assert metrics[aborted] == 1 and metrics["specdesk:num_requests_running"] == 0
        assert metrics["specdesk:generation_tokens_total"] < 4000  # stopped, not run to its end
    finally:
        stop_server(child)


def test_an_open_address_without_a_key_is_refused_unless_asked_for(demo_family):
    from specdesk.app.serving.serve import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("no-such-host.invalid")
    run = subprocess.run([sys.executable, "-m", "specdesk.app.main", "serve", "--host", "0.0.0.0", "--port", "0",
                          "--target", demo_family["target_gguf"]], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "--host 0.0.0.0 lets other machines reach the server" in run.stderr and "--insecure-no-key" in run.stderr


def test_no_response_body_names_a_path_of_the_servers_files(server, demo_family):
    """Issue 48, 5: a request for method mtp on a model without MTP layers got a 400 naming the
    model file's absolute path. Every body the server sends here is checked for the folders its
    files lie in, and every error for any absolute path at all."""
    absolute = re.compile(r"(?<![\w.:/-])/(?!v1/)[\w.+~-]+/[\w./+~-]+")
    folders = {str(Path(demo_family[role]).resolve().parent) for role in ("target_gguf", "draft_gguf")}
    folders |= {str(Path(demo_family["target_gguf"]).parent), str(Path.cwd())}
    bodies: list[tuple[int, str]] = []

    def post(path: str, body: dict, key: str | None = API_KEY) -> tuple[int, str]:
        answer = raw_post(server, path, json.dumps({"model": MODEL, "max_tokens": 4, **body}).encode(), key)
        bodies.append(answer)
        return answer

    mtp = {"speculative": {"method": "mtp"}}
    for stream in (False, True):
        status, text = post("/v1/chat/completions", {"messages": CHAT, "stream": stream, **mtp})
        assert "this GGUF has no MTP (NextN) layers" in text and "specdesk-demo-target-F16.gguf" in text, text
        assert status == (200 if stream else 400)  # streamed, the error is the stream's last event
        assert post("/v1/completions", {"prompt": "import os\n", "stream": stream, **mtp})[0] == (200 if stream
                                                                                                 else 400)
    post("/v1/chat/completions", {"messages": CHAT, "stream": True})
    post("/v1/completions", {"prompt": "import os\n"})
    post("/v1/chat/completions", {"messages": CHAT}, key="wrong")
    post("/v1/chat/completions", {"messages": CHAT, "model": "elsewhere"})
    post("/v1/completions", {"prompt": list(range(100_000))})
    bodies += [(status, json.dumps(body) if isinstance(body, dict) else body)
               for status, body in (http(server, "/v1/models"), http(server, "/metrics"))]
    for status, text in bodies:
        assert not [folder for folder in folders if folder in text], text[:400]
        if status >= 400 or '"error"' in text:
            assert not absolute.findall(text), text[:400]


@pytest.mark.parametrize("path, field, value", [
    ("/v1/chat/completions", "logit_bias", {"50256": -100}), ("/v1/chat/completions", "logprobs", True),
    ("/v1/chat/completions", "top_logprobs", 3), ("/v1/completions", "logprobs", 1), ("/v1/completions", "best_of", 3),
])
def test_fields_the_server_cannot_honour_are_refused_by_name(server, path, field, value):
    """Issue 48, 5: logit_bias, logprobs and best_of were silently ignored."""
    request = {"model": MODEL, "max_tokens": 2, field: value}
    request.update({"messages": CHAT} if path.endswith("chat/completions") else {"prompt": "import os\n"})
    if field == "top_logprobs":
        request["logprobs"] = False  # top_logprobs alone asks for them too
    status, text = raw_post(server, path, json.dumps(request).encode())
    error = json.loads(text)["error"]
    assert status == 400 and error["param"] == field and error["message"].startswith(f"'{field}' "), text
    # values that ask for nothing pass, as OpenAI clients send them
    harmless = {"logit_bias": {}, "logprobs": False, "top_logprobs": 0, "best_of": 1}[field]
    assert raw_post(server, path, json.dumps({**request, field: harmless}).encode())[0] == 200


def start_limited_server(target: str, *options: str, open_files: int | None = None):
    """start_server, with this many open files allowed (both limits: as `ulimit -n` sets them)."""
    import resource

    def limit() -> None:
        if open_files:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

    child = subprocess.Popen([sys.executable, "-m", "specdesk.app.main", "serve", "--port", "0", "--target", target,
                              "--method", "none", "--threads", "1", *options],
                             stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, preexec_fn=limit)
    url, lines = None, []
    deadline = time.monotonic() + 120
    while url is None and time.monotonic() < deadline and child.poll() is None:
        if select.select([child.stderr], [], [], 1.0)[0]:
            line = child.stderr.readline()
            lines.append(line)
            match = re.search(r"at (http://\S+/v1)", line)
            url = match.group(1) if match else None
    assert url is not None, "".join(lines)
    return child, url


def closed_by_server(sock, timeout: float = 60) -> bool:
    """Whether the server closes this connection within `timeout` (a reset counts: the server
    may close it before reading what was sent)."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True


@pytest.mark.skipif(sys.platform == "win32", reason="sets the open-files limit with resource")
def test_half_open_connections_never_keep_a_client_out(demo_family):
    import socket

    child, url = start_limited_server(demo_family["target_gguf"], "--request-timeout", "5", open_files=256)
    held = []
    try:
        host, port = url.removeprefix("http://").removesuffix("/v1").split(":")
        for _ in range(300):  # more than the server has descriptors for
            s = socket.create_connection((host, int(port)), timeout=30)
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")  # ... and the rest never comes
            held.append(s)
        status, body = http(url, "/v1/models", key=None)
        assert status == 200 and body["data"][0]["id"] == MODEL
        # the oldest were closed for newer ones, and every one that stays silent is closed in time
        assert closed_by_server(held[0]) and closed_by_server(held[-1])
        # headers that came, and a body that does not: 408 once the same time has passed
        with socket.create_connection((host, int(port)), timeout=60) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            assert s.recv(65536).startswith(b"HTTP/1.1 408 ")
    finally:
        for s in held:
            s.close()
        child.send_signal(signal.SIGINT)
        try:
            _, err = child.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            _, err = child.communicate()
    assert "Traceback" not in err and len(err.splitlines()) < 20, err[-3000:]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the engine process through /proc")
def test_a_stopped_engine_times_out_the_request_and_is_replaced(demo_family, local):
    child, url = start_limited_server(demo_family["target_gguf"], "--ctx", "4096", "--engine-timeout", "20")
    try:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
        (host,) = engine_processes(child.pid)
        os.kill(host, signal.SIGSTOP)  # a step that never returns looks exactly like this
        with pytest.raises(openai.APIStatusError) as caught:
            client.completions.create(model=MODEL, prompt="import os\n", max_tokens=16, temperature=0)
        assert caught.value.status_code == 503 and "stopped or stuck" in caught.value.message
        expected = reference(local, demo_family, local.tokenize("import os\n"), 16, method="none")
        reply = client.completions.create(model=MODEL, prompt="import os\n", max_tokens=16, temperature=0)
        assert reply.choices[0].text == expected.text
        assert engine_processes(child.pid) != [host]  # the stopped one was ended; a new one serves
    finally:
        stop_server(child)


def test_many_large_bodies_at_once_are_refused_past_the_servers_budget(server):
    import socket

    host, port = server.removeprefix("http://").removesuffix("/v1").split(":")
    part = b"x" * (7 * 2**20)  # each under the 8 MiB limit; ten of them over the 64 MiB for all at once
    senders = []
    try:
        for _ in range(10):
            s = socket.create_connection((host, int(port)), timeout=60)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      + f"Authorization: Bearer {API_KEY}\r\nContent-Length: {len(part) + 10}\r\n\r\n".encode())
            senders.append(s)
        for s in senders:
            try:
                s.sendall(part)  # and the last 10 bytes never come
            except OSError:  # refused already, and closed
                pass
        answered, _, _ = select.select(senders, [], [], 30)  # the refusals come at once; the rest wait
        answers = b"".join(read_answer(s) for s in answered)
        assert b"HTTP/1.1 503 " in answers and b"receiving too many large requests" in answers, answers[:500]
        assert http(server, "/v1/models")[0] == 200
    finally:
        for s in senders:
            s.close()


def test_an_unexpected_error_is_one_line_for_the_client_and_a_traceback_in_the_log(caplog):
    import asyncio
    import errno

    from specdesk.app.runtime.engine_client import EngineHostDied
    from specdesk.app.serving.hardening import quiet_accept_errors
    from specdesk.app.serving.request_checks import RequestError, as_request_error

    try:
        raise RuntimeError("KeyError: 'x'\n  File \"/secret/path.py\", line 1")
    except RuntimeError as e:
        error = as_request_error(e)
    assert error.status == 500 and re.fullmatch(r"internal error [0-9a-f]{8}: the details are in the server log",
                                                error.message)
    assert "/secret/path.py" in caplog.text and error.message.split()[2].rstrip(":") in caplog.text
    died = as_request_error(EngineHostDied("the engine process stopped (SIGKILL) while generating", "last lines"))
    assert died.status == 503 and died.message == "the engine process stopped (SIGKILL) while generating"
    assert as_request_error(MemoryError()).status == 503
    assert as_request_error(RequestError(400, "x")).message == "x"

    async def accept_fails_three_times() -> None:
        async with quiet_accept_errors(None):
            loop = asyncio.get_running_loop()
            for _ in range(3):
                loop.call_exception_handler({"message": "socket.accept() out of system resource",
                                             "exception": OSError(errno.EMFILE, "Too many open files")})

    import contextlib
    import io

    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        asyncio.run(accept_fails_three_times())
    assert stderr.getvalue().count("\n") == 1 and "Too many open files" in stderr.getvalue()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the engine process through /proc")
def test_an_engine_that_produces_nothing_for_the_engine_timeout_gets_the_request_a_503(demo_family):
    # --engine-timeout is for an engine that still answers but makes no progress; a stopped one
    # shows it too, sooner than the heartbeat watchdog (2 s) ends it
    child, url = start_limited_server(demo_family["target_gguf"], "--engine-timeout", "0.2")
    try:
        (host,) = engine_processes(child.pid)
        os.kill(host, signal.SIGSTOP)
        status, text = raw_post(url, "/v1/completions", json.dumps({"model": MODEL, "prompt": "x"}).encode(), key=None)
        assert status == 503 and "the engine did not answer within 0.2 s" in text and "Traceback" not in text
    finally:
        stop_server(child)
