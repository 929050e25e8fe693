"""Served engines (app/serving/endpoint.py, app/serving/served.py): against a real `specdesk serve`, and against
replayed recordings of vLLM and SGLang (tests/served/*.json, marked as recordings) for the
servers that need GPUs. The real llama-server is in tests/test_llama_server.py.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from served_replay import Replay, load  # noqa: E402

from specdesk.app.serving.endpoint import (Endpoint, EndpointError, StreamReader, base_url, parse_metrics,  # noqa: E402
                                   served_stats)
from specdesk.app.serving.served import compare_served  # noqa: E402
from specdesk.app.serving.transport import ServerRedirected  # noqa: E402
from specdesk.engines.types import SamplingParams  # noqa: E402

CHAT = [{"role": "user", "content": "Write a function that parses command line arguments."}]


# --- pure pieces, on literals ------------------------------------------------------------
def test_base_url_takes_what_users_type():
    assert base_url("localhost:8080") == "http://localhost:8080"
    assert base_url("http://gpu-box:8000/v1/") == "http://gpu-box:8000"
    assert base_url("https://team.example/llm/v1") == "https://team.example/llm"
    with pytest.raises(EndpointError, match="not a server address"):
        base_url("ftp://x")


def test_prometheus_text_is_read_and_a_bad_line_is_named():
    samples = parse_metrics('# HELP a x\na_total{position="0",tp="1"} 3\na_total{position="0",tp="0"} 2\n'
                            'a_total{position="1"} 1.5e0\nb 7 1764500000\n', "srv/metrics")
    assert samples.total("a_total") == 6.5 and samples.total("b") == 7 and samples.total("c") is None
    assert samples.by_label("a_total", "position") == {"0": 5.0, "1": 1.5}
    with pytest.raises(EndpointError, match=r"srv/metrics, line 2: not Prometheus text"):
        parse_metrics("ok 1\n<html>oops</html>\n", "srv/metrics")


def test_llama_server_chunks_give_running_counts_and_the_final_numbers():
    reader = StreamReader("srv")
    events = [reader.feed("data: " + json.dumps({"choices": [{"delta": {"content": text}}], "timings": timings}))
              for text, timings in (("a", {"predicted_n": 1}), ("bc", {"predicted_n": 3, "draft_n": 4,
                                                                         "draft_n_accepted": 1}))]
    reader.feed("data: " + json.dumps({"choices": [{"delta": {}, "finish_reason": "length"}],
                                       "timings": {"predicted_n": 3, "draft_n": 4, "draft_n_accepted": 1}}))
    reader.feed("data: [DONE]")
    assert events == [("a", 1, 0, 0), ("bc", 2, 4, 1)]
    assert reader.done and reader.finish_reason == "length" and reader.text == "abc"
    numbers = reader.per_request_numbers()
    assert (numbers.drafted, numbers.accepted, numbers.source) == (4, 1, "per request")
    stats = served_stats(reader.completion_tokens(), 1.0, numbers)
    assert stats.passes == 2 and stats.mean_accepted_length == 1.5  # 3 tokens, one of them an accepted draft


# --- recorded vLLM and SGLang, replayed -----------------------------------------------------
@pytest.mark.parametrize("name", ["vllm_per_request.json", "vllm_counters.json", "sglang_per_request.json"])
def test_recorded_servers_fill_the_charts_from_their_own_numbers(name):
    recording = load(name)
    expected = recording["expected"]
    with Replay(recording) as replay:
        endpoint = Endpoint(replay.url)
        info = endpoint.probe()
        assert info.kind == expected["kind"] and endpoint.model == recording["models"]["data"][0]["id"]
        events = []
        run = endpoint.chat(CHAT, SamplingParams(), 64, on_event=events.append)
    sent = replay.requests[0]
    assert sent["stream"] and sent["stream_options"]["include_usage"]
    assert sent.get("return_spec_tokens_details") is (True if info.kind == "sglang" else None)
    stats = run.result.stats
    assert run.result.text == "".join(c["choices"][0]["delta"].get("content") or ""
                                      for c in recording["stream"] if c["choices"])
    assert (stats.tokens, stats.drafted, stats.accepted) == (expected["tokens"], expected["drafted"],
                                                             expected["accepted"])
    assert stats.passes == expected.get("passes", expected["tokens"] - expected["accepted"])
    if "per_position_accepted" in expected:
        assert list(stats.per_position_accepted) == expected["per_position_accepted"]
        assert list(stats.per_position_drafted) == expected["per_position_drafted"]
    if "histogram" in expected:
        assert list(stats.accepted_length_histogram) == expected["histogram"]
    # vLLM gives a running token count on each chunk; without one (and no tokenizer) the events
    # count characters and say so, never chunks as if they were tokens
    counted = sum(len(e.tokens) for e in events)
    if info.kind == "vllm":
        assert counted == expected["tokens"] and run.unit == endpoint.stream_unit() == "tokens"
    else:
        assert counted == len(run.result.text) and run.unit.startswith("characters") == \
            endpoint.stream_unit().startswith("characters")
    source = {"vllm_per_request.json": "per request", "vllm_counters.json": "metric deltas",
              "sglang_per_request.json": "per request"}[name]
    assert run.numbers.source == source and run.note is None
    assert ("lifetime averages" in info.describe()) is (info.kind == "sglang")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_failures_are_one_line_and_keep_the_partial_reply():
    recording = load("vllm_counters.json")
    with pytest.raises(EndpointError, match=r"^cannot reach http://127\.0\.0\.1:\d+: "):
        Endpoint(f"127.0.0.1:{free_port()}").probe()
    with Replay(recording, api_key="sk-right") as replay:
        with pytest.raises(EndpointError, match="refused the API key .HTTP 401: Invalid API key"):
            Endpoint(replay.url, api_key="sk-wrong").probe()
        assert Endpoint(replay.url, api_key="sk-right").probe().kind == "vllm"
    with Replay(recording, drop_after=6) as replay:
        endpoint = Endpoint(replay.url)
        with pytest.raises(EndpointError, match="closed the stream mid-reply") as caught:
            endpoint.chat(CHAT)
    sent = "".join(c["choices"][0]["delta"].get("content") or "" for c in recording["stream"][:6])
    assert caught.value.partial == sent and sent and "\n" not in str(caught.value)
    with Replay(recording) as replay:
        endpoint = Endpoint(replay.url)
        endpoint.probe()
        replay.model_gone = True
        with pytest.raises(EndpointError, match="does not serve model 'meta-llama/Llama-3.3-70B-Instruct' now"):
            endpoint.chat(CHAT)
        with pytest.raises(EndpointError, match="does not serve model 'gone'"):
            Endpoint(replay.url, model="gone").probe()
    with Replay(recording) as replay:
        endpoint = Endpoint(replay.url)
        endpoint.probe()
        replay.metrics_text = "vllm:spec_decode_num_drafts_total 1\nthis is not prometheus\n"
        run = endpoint.chat(CHAT)  # the reply stands; the numbers it could not read are said
    assert run.result.text and run.note and "line 2: not Prometheus text" in run.note
    assert run.numbers.source == "none"


def test_a_server_that_answers_without_streaming_still_gives_its_numbers():
    recording = load("vllm_per_request.json")
    with Replay(recording, whole=True) as replay:
        events = []
        run = Endpoint(replay.url).chat(CHAT, SamplingParams(), 64, on_event=events.append)
    assert len(events) == 1 and run.result.text == events[0].text and run.result.finish_reason == "length"
    assert (run.result.stats.tokens, run.result.stats.accepted) == (53, 10) and run.numbers.source == "per request"


def test_one_endpoint_compare_needs_a_server_that_switches_speculation():
    with Replay(load("vllm_counters.json")) as replay:
        with pytest.raises(EndpointError, match="cannot switch speculation off per request: .*--baseline-endpoint"):
            compare_served(Endpoint(replay.url), None, ["x"], SamplingParams(), 8)


# --- a real specdesk serve -------------------------------------------------------------------
@pytest.fixture(scope="module")
def serve(demo_family):
    from test_serve import start_server, stop_server

    child, url = start_server("--target", demo_family["target_gguf"], "--draft", demo_family["draft_gguf"],
                              "--method", "draft", "--k", "4", "--threads", "1", "--api-key", "sk-served")
    yield url
    stop_server(child)


def test_specdesk_serve_numbers_are_the_replies_own(serve):
    endpoint = Endpoint(serve, api_key="sk-served")
    info = endpoint.probe()
    assert info.kind == "specdesk" and info.switches_speculation and info.metrics
    before = endpoint.scrape()
    run = endpoint.chat(CHAT, SamplingParams(), 40)
    after = endpoint.scrape()
    raw, stats = run.numbers.raw, run.result.stats
    assert run.numbers.source == "per request" and stats.tokens == raw["tokens"] == 40
    assert (stats.drafted, stats.accepted, stats.passes) == (raw["draft_tokens"], raw["accepted_tokens"],
                                                             raw["passes"])
    assert list(stats.per_position_accepted) == raw["accepted_per_position"]
    assert list(stats.accepted_length_histogram) == raw["accepted_length_histogram"]
    assert sum(stats.accepted_length_histogram) == stats.passes
    for position, accepted in enumerate(raw["accepted_per_position"]):
        name = "specdesk:spec_decode_num_accepted_tokens_per_pos_total"
        moved = after.by_label(name, "position")[str(position)] - before.by_label(name, "position").get(str(position), 0)
        assert moved == accepted
    assert stats.drafted > 0 and stats.tok_per_s > 0


def test_compare_on_one_specdesk_serve_switches_speculation_off_per_request(serve):
    endpoint = Endpoint(serve, api_key="sk-served")
    labels = []
    report = compare_served(endpoint, None, ["import argparse\n", "def main("], SamplingParams(), 24,
                            on_event=lambda label, index, e: labels.append((label, index)), warm=False)
    assert report.identical_outputs is True
    assert report.baseline.drafted == 0 and report.speculative.drafted > 0
    firsts = [next(label for label, i in labels if i == index) for index in (0, 1)]
    assert firsts == ["baseline", "speculative"]  # the order alternates
    from specdesk.app.serving.served import report_json

    payload = report_json(report, endpoint, None)
    assert {"baseline", "speculative", "speedup", "identical_outputs", "prompts"} <= set(payload)
    assert payload["speculative"]["numbers_from"] == ["per request"]


def test_cancel_ends_the_stream(serve):
    endpoint = Endpoint(serve, api_key="sk-served")
    cancel = threading.Event()
    run = endpoint.chat(CHAT, SamplingParams(), 400, cancel, on_event=lambda e: cancel.set())
    assert run.result.finish_reason == "cancelled" and run.result.stats.tokens < 400


def test_cli_compare_and_chat_on_endpoints(capsys, monkeypatch):
    from specdesk.app.main import main

    # the recordings reply with 53 tokens, whatever max tokens says: asking for fewer would cut them
    with Replay(load("vllm_per_request.json")) as speculative, Replay(load("vllm_counters.json")) as baseline:
        assert main(["compare", "--endpoint", speculative.url, "--prompt", "def f(", "--max-tokens", "64"]) == 2
        assert "cannot switch speculation off per request" in capsys.readouterr().err
        assert main(["compare", "--endpoint", speculative.url, "--baseline-endpoint", baseline.url,
                     "--prompt", "def f(", "--max-tokens", "64", "--json", "-"]) == 0
        payload = json.loads(capsys.readouterr().out)
        assert payload["identical_outputs"] is True and payload["speculative"]["drafted"] == 129
        assert payload["endpoint"]["kind"] == "vllm" and payload["baseline_endpoint"]["url"] == baseline.url
        assert {"baseline", "speculative", "speedup", "prompts", "temperature", "k"} <= set(payload)
        monkeypatch.setattr("sys.stdin", __import__("io").StringIO("hello\n\n"))
        assert main(["chat", "--endpoint", speculative.url, "--max-tokens", "64"]) == 0
        out = capsys.readouterr()
        assert "def parse_args" in out.out and "acceptance 0.08 · 1.23 tok/pass" in out.err
        assert "numbers: per request" in out.err


# --- hostile servers ---------------------------------------------------------------------------
MODELS = {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "someone"}]}


class Hostile:
    """A loopback server that answers /v1/models with a model list, /metrics with 404, and
    chat completions with whatever `chat(conn)` writes on the raw socket. It keeps each
    request's headers and counts the bytes it managed to send."""

    def __init__(self, chat=None, models: dict = MODELS, redirect_to: str | None = None,
                 moved: dict[str, str] | None = None):
        self.chat, self.models, self.redirect_to = chat, models, redirect_to
        self.moved = moved or {}  # path -> where a 302 sends it
        self.requests: list[tuple[str, dict]] = []
        self.sent = 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                more = conn.recv(65536)
                if not more:
                    return
                data += more
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split()[1]
            headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
            while len(body) < int(headers.get("content-length", 0)):
                body += conn.recv(65536)
            self.requests.append((path, headers))
            try:
                if self.redirect_to is not None or path in self.moved:
                    location = self.moved.get(path) or f"{self.redirect_to}{path}"
                    self.send(conn, f"HTTP/1.1 302 Found\r\nLocation: {location}\r\n"
                                    "Content-Length: 0\r\nConnection: close\r\n\r\n".encode())
                elif path.rstrip("/") == "/v1/models":
                    self.send_json(conn, self.models)
                elif path == "/metrics" or self.chat is None:
                    self.send(conn, b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                else:
                    self.chat(self, conn)
            except OSError:  # the client hung up: what these tests want
                pass

    def send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.sent += len(data)

    def send_json(self, conn: socket.socket, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                  + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)

    def stream_head(self, conn: socket.socket) -> None:
        self.send(conn, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")

    def __enter__(self) -> "Hostile":
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.server.close()


def chunk(text: str) -> bytes:
    return f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': text}}]})}\n\n".encode()


def test_the_api_key_never_reaches_another_host_and_https_never_falls_back_to_http():
    import httpx2

    with Hostile() as elsewhere, Hostile(redirect_to=None) as origin:
        origin.redirect_to = elsewhere.url  # another port is another server
        endpoint = Endpoint(origin.url, api_key="sk-secret")
        with pytest.raises(ServerRedirected, match=r"redirected /v1/models to another server, "
                                                   rf"{re.escape(elsewhere.url)}: the redirect was not followed"):
            endpoint.list_models()
        assert origin.requests[0][1]["authorization"] == "Bearer sk-secret"
        assert elsewhere.requests == []  # neither the request nor the key went there
    with Hostile(moved={"/v1/models": "/v1/models/"}) as origin:  # the same server: followed, with the key
        assert Endpoint(origin.url, api_key="sk-secret").list_models()[0]["id"] == "m"
        assert [(path, headers["authorization"]) for path, headers in origin.requests] == \
            [("/v1/models", "Bearer sk-secret"), ("/v1/models/", "Bearer sk-secret")]
    endpoint = Endpoint("https://gpu-box.example", api_key="sk-secret")
    downgrade = httpx2.Response(302, headers={"location": "http://gpu-box.example/v1/models"},
                               request=httpx2.Request("GET", "https://gpu-box.example/v1/models"))
    with pytest.raises(EndpointError, match="from https to http is refused"):
        endpoint._check_redirect(downgrade)
    upgrade = httpx2.Response(302, headers={"location": "https://gpu-box.example/v2"},
                             request=httpx2.Request("GET", "https://gpu-box.example/v1/models"))
    endpoint._check_redirect(upgrade)  # https to https on the same server is fine
    to_https = httpx2.Response(301, headers={"location": "https://gpu-box.example/v1/models"},
                              request=httpx2.Request("GET", "http://gpu-box.example/v1/models"))
    Endpoint("http://gpu-box.example")._check_redirect(to_https)  # and so is http to https on the same host


def test_a_redirect_to_another_server_ends_chat_and_compare_with_status_2(capsys, monkeypatch):
    """Issue 48, 3: the POST was sent on as a GET to another host, whose answer read as an empty
    reply: "[0 tokens]" and exit status 0 in chat, "runs": 0 in compare's JSON."""
    from specdesk.app.main import main

    def anything(server, conn):  # what the other host answers to whatever comes
        server.send_json(conn, {"object": "list", "data": []})

    with Hostile(anything) as elsewhere, \
            Hostile(moved={"/v1/chat/completions": f"{elsewhere.url}/v1/chat/completions"}) as origin:
        expected = (f"specdesk: error: {origin.url} redirected /v1/chat/completions to another server, "
                    f"{elsewhere.url}: the redirect was not followed")
        monkeypatch.setattr("sys.stdin", __import__("io").StringIO("hello\nand again\n\n"))
        assert main(["chat", "--endpoint", origin.url, "--max-tokens", "16"]) == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("specdesk:")]
        assert len(errors) == 1 and errors[0].startswith(expected), errors
        assert main(["compare", "--endpoint", origin.url, "--baseline-endpoint", origin.url, "--prompt", "def f(",
                     "--max-tokens", "8", "--json", "-"]) == 2
        out = capsys.readouterr()
        assert out.out == "" and out.err.startswith(expected) and out.err.count("\n") == 1, out
        assert elsewhere.requests == []
    # on the same server, a 302 would turn the POST into a GET without its body: not followed either
    with Hostile(anything, moved={"/v1/chat/completions": "/v1/chat/completions/"}) as origin:
        with pytest.raises(ServerRedirected, match="answered POST /v1/chat/completions with HTTP 302 to "
                                                   "/v1/chat/completions/: the redirect was not followed"):
            Endpoint(origin.url).chat(CHAT, max_tokens=8)
        assert [path for path, _ in origin.requests] == ["/v1/models", "/metrics", "/v1/chat/completions"]


def test_a_json_answer_that_is_not_a_chat_completion_is_an_error_not_an_empty_reply():
    def not_a_completion(server, conn):
        server.send_json(conn, {"object": "list", "data": []})

    with Hostile(not_a_completion) as server:
        with pytest.raises(EndpointError, match="answered with JSON that is not a chat completion .no choices."):
            Endpoint(server.url).chat(CHAT, max_tokens=8)


def test_a_line_without_end_is_refused_at_its_limit():
    def one_line_forever(server, conn):
        server.stream_head(conn)
        server.send(conn, b"data: ")
        piece = b"x" * 65536
        while server.sent < 2**30:
            server.send(conn, piece)

    with Hostile(one_line_forever) as server:
        with pytest.raises(EndpointError, match="sent a line over 1024 KiB"):
            Endpoint(server.url).chat(CHAT, max_tokens=8)
        time.sleep(0.5)
        assert server.sent < 64 * 2**20  # the client stopped reading at 1 MiB (socket buffers hold the rest)


def test_a_reply_longer_than_max_tokens_is_cut_there():
    with Replay(load("vllm_per_request.json")) as replay:  # its reply has 53 tokens, counted on every chunk
        run = Endpoint(replay.url).chat(CHAT, SamplingParams(), 16)
    assert run.result.finish_reason == "length" and run.result.stats.tokens <= 16 and run.result.text


def test_an_endless_stream_is_cut_at_max_tokens():
    def endless(server, conn):
        server.stream_head(conn)
        while server.sent < 2**30:
            server.send(conn, chunk("y" * 65536))

    with Hostile(endless) as server:
        run = Endpoint(server.url).chat(CHAT, max_tokens=8)
        assert run.result.finish_reason == "length" and run.result.text == "y" * 65536 * 8
        time.sleep(0.5)
        assert server.sent < 64 * 2**20


def test_slow_or_silent_servers_end_in_one_line_within_their_timeouts():
    def trickle(server, conn):  # one byte at a time, never a whole line
        server.stream_head(conn)
        while True:
            server.send(conn, b"x")
            time.sleep(0.1)

    def one_chunk_then_silence(server, conn):
        server.stream_head(conn)
        server.send(conn, chunk("hello"))
        time.sleep(60)

    def never_answers(server, conn):
        time.sleep(60)

    with Hostile(trickle) as server:
        endpoint = Endpoint(server.url, timeout=2)
        endpoint.seconds_per_token = 0.25
        with pytest.raises(EndpointError, match=r"did not finish the reply within its deadline of 3 s"):
            endpoint.chat(CHAT, max_tokens=4)
    with Hostile(one_chunk_then_silence) as server:
        endpoint = Endpoint(server.url)
        endpoint.idle_timeout = 1
        with pytest.raises(EndpointError, match=r"sent nothing for 1 s mid-reply") as caught:
            endpoint.chat(CHAT, max_tokens=4)
        assert caught.value.partial == "hello"
    with Hostile(never_answers) as server:
        with pytest.raises(EndpointError, match=r"did not answer within 1 s"):
            Endpoint(server.url, timeout=1).chat(CHAT, max_tokens=4)


def test_a_stream_without_text_ends_at_the_idle_limit_not_the_total_deadline():
    """Issue 48, 1: `data: {}` forever used to run to the total deadline (120 s + 2 s a token):
    events without text restart no clock, as bytes without a line do not."""
    from specdesk.app.serving.transport import IDLE_TIMEOUT_S

    def events_without_text(server, conn):
        server.stream_head(conn)
        while True:
            server.send(conn, b"data: {}\n\n")
            time.sleep(0.02)

    with Hostile(events_without_text) as server:
        endpoint = Endpoint(server.url, timeout=5)
        endpoint.idle_timeout = 1
        started = time.monotonic()
        with pytest.raises(EndpointError) as caught:
            endpoint.chat(CHAT, max_tokens=16)  # the total deadline: 5 s + 16 x 2 s
        elapsed = time.monotonic() - started
    message = str(caught.value)
    assert re.fullmatch(rf"{re.escape(server.url)} sent [\d,]+ lines \([\d,]+ bytes\) but no text for 1 s \(the "
                        r"limit for a reply that brings no text\), after 0 characters", message), message
    assert elapsed < 5, elapsed
    assert IDLE_TIMEOUT_S + 1 < 30  # with the defaults, such a stream ends within 30 s


def test_thinking_and_tool_calls_keep_a_reply_alive():
    """What a reasoning model streams before its answer (reasoning_content) is output too: a
    reply that thinks for longer than the idle limit is not ended for it."""
    def thinks_then_answers(server, conn):
        server.stream_head(conn)
        for _ in range(12):  # 2.4 s of thinking, over the 1 s limit
            server.send(conn, f"data: {json.dumps({'choices': [{'delta': {'reasoning_content': 'hm'}}]})}\n\n"
                        .encode())
            time.sleep(0.2)
        server.send(conn, chunk("done") + b"data: [DONE]\n\n")

    with Hostile(thinks_then_answers) as server:
        endpoint = Endpoint(server.url)
        endpoint.idle_timeout = 1
        assert endpoint.chat(CHAT, max_tokens=16).result.text == "done"


def test_a_trickling_server_is_ended_in_one_line_naming_the_limit_and_what_it_did():
    """Issue 48, 2: a chunk sent a byte at a time ended at the total deadline as "a chunk that
    is not JSON ('{')", the part of a line the cut left."""
    def trickle_a_chunk(server, conn):
        server.stream_head(conn)
        for byte in chunk("hello") * 100:
            server.send(conn, bytes([byte]))
            time.sleep(0.1)

    with Hostile(trickle_a_chunk) as server:
        endpoint = Endpoint(server.url, timeout=2)  # the total deadline: 2 s + 4 x 2 s
        endpoint.idle_timeout = 1
        started = time.monotonic()
        with pytest.raises(EndpointError) as caught:
            endpoint.chat(CHAT, max_tokens=4)
        assert time.monotonic() - started < 5
        assert re.fullmatch(rf"{re.escape(server.url)} trickled [\d,]+ bytes in 1 s without ending one line \(the "
                            r"limit for a reply that brings no text is 1 s\), after 0 characters", str(caught.value))
        endpoint = Endpoint(server.url, timeout=2)  # the total deadline first: still its own reason
        endpoint.seconds_per_token = 0.25
        with pytest.raises(EndpointError) as caught:
            endpoint.chat(CHAT, max_tokens=4)
        assert str(caught.value) == f"{server.url} did not finish the reply within its deadline of 3 s, after 0 " \
                                    "characters"


def test_terminal_escapes_from_a_server_are_never_printed(capsys, monkeypatch):
    from specdesk.app.serving.endpoint import printable
    from specdesk.app.main import main

    assert printable("a\x1b[31mred\x1b[0m\x1b]0;title\x07 b\rc\x9b2Jd\u202eе\n\tok") == "ared bcdе\n\tok"
    assert printable("one\ntwo", one_line=True) == "one two"
    evil = "\x1b]0;pwned\x07m\x1b[2J"

    def reply(server, conn):
        server.stream_head(conn)
        server.send(conn, chunk("\x1b[31mred\x1b[0m text") + b"data: [DONE]\n\n")

    with Hostile(reply, models={"data": [{"id": evil}]}) as server:
        monkeypatch.setattr("sys.stdin", __import__("io").StringIO("hello\n\n"))
        assert main(["chat", "--endpoint", server.url, "--max-tokens", "16"]) == 0
        out = capsys.readouterr()
        assert "red text" in out.out and "\x1b" not in out.out + out.err and " · m · " in out.err
        with pytest.raises(EndpointError) as caught:
            Endpoint(server.url, model="\x1b[2Jgone").probe()
        assert "\x1b" not in str(caught.value)


def test_lines_are_split_within_their_limits():
    from specdesk.app.serving.endpoint import iter_lines

    reader = StreamReader("srv")
    assert list(iter_lines(iter([b"data: a\r\n", b"\ndata", b": b\n"]), threading.Event(), "srv", reader)) == \
        ["data: a", "", "data: b"]
    with pytest.raises(EndpointError, match="sent a reply over 1 MiB"):
        list(iter_lines(iter([b"x" * 65535 + b"\n"] * 20), threading.Event(), "srv", reader, max_reply=2**20))
