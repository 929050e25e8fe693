"""The tokens/s chart of a served reply agrees with the footer's figure (the server's token
count over the stream's decode time): on a replayed vLLM stream, with and without its running
token counts, and on a real `specdesk serve`, whose chunks carry several tokens each.
Events go through the app's own batcher (ui/jobs.EventBatcher) into the chart panel."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

sys.path.insert(0, str(Path(__file__).parent))

from served_replay import Replay, load  # noqa: E402

from specdesk.app.serving.endpoint import Endpoint  # noqa: E402
from specdesk.app.serving.stream import UNIT_CHARACTERS, UNIT_TOKENIZER, UNIT_TOKENS  # noqa: E402
from specdesk.engines.types import SamplingParams  # noqa: E402

CHAT = [{"role": "user", "content": "Write a function that parses command line arguments."}]


@pytest.fixture
def charts(qapp):
    from specdesk.ui.charts import ChartPanel

    panel = ChartPanel()
    yield panel
    panel.deleteLater()


def chart_reply(charts, endpoint: Endpoint, max_tokens: int):
    """One served reply drawn as the app draws it; (the run, the chart's tok/s curve after the reply)."""
    from specdesk.ui.jobs import EventBatcher

    charts.start_run(0)
    charts.set_unit(endpoint.stream_unit())
    batcher = EventBatcher(1, "chat", 0, None, charts.add_batch, interval_s=0.0)
    run = endpoint.chat(CHAT, SamplingParams(), max_tokens, on_event=batcher)
    batcher.flush()
    charts.finish_run(run.result.stats)
    charts.refresh()
    return run, charts.rates()


def curve_rate(t: np.ndarray, rate: np.ndarray) -> float:
    """The figure a user reads off the curve when the reply has ended: its last point, the
    rate over the chart's trailing window (at least 16 chunks and 0.2 s)."""
    return float(rate[-1])


def vllm_stream(steps: int = 60) -> dict:
    """A vLLM reply with speculative decoding, in vLLM's stream format: one chunk per step
    carrying that step's tokens (1 + its accepted drafts, k = 3), usage on every chunk
    (stream_options.continuous_usage_stats), then the usage chunk with
    metrics.speculative_decoding (--per-request-spec-decode-metrics summary)."""
    recording = copy.deepcopy(load("vllm_per_request.json"))
    model = recording["models"]["data"][0]["id"]
    words = "def parse ( argv ) : parser = argparse . ArgumentParser ( ) return parser".split()
    base = {"id": "chatcmpl-rate", "object": "chat.completion.chunk", "created": 1764500000, "model": model}
    usage = lambda n: {"prompt_tokens": 21, "completion_tokens": n, "total_tokens": 21 + n}  # noqa: E731
    stream = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                    "finish_reason": None}], "usage": usage(0)}]
    tokens, histogram = 0, [0, 0, 0, 0]
    for step in range(steps):
        accepted = (0, 2, 1, 3)[step % 4]
        histogram[accepted] += 1
        text = "".join(" " + words[(tokens + i) % len(words)] for i in range(1 + accepted))
        tokens += 1 + accepted
        last = step == steps - 1
        stream.append({**base, "choices": [{"index": 0, "delta": {"content": text},
                                            "finish_reason": "length" if last else None}], "usage": usage(tokens)})
    stream.append({**base, "choices": [], "usage": usage(tokens), "metrics": {"speculative_decoding": {
        "num_spec_steps": steps, "num_draft_tokens": 3 * steps, "num_accepted_draft_tokens": tokens - steps,
        "acceptance_histogram": histogram}}})
    recording["stream"] = stream
    recording["expected"] = {"kind": "vllm", "tokens": tokens}
    return recording


def vllm_without_running_counts() -> dict:
    """The same vLLM reply from a server that sends usage only on its last chunk (an older vLLM,
    or one that ignores continuous_usage_stats)."""
    recording = copy.deepcopy(load("vllm_per_request.json"))
    for chunk in recording["stream"]:
        if chunk["choices"]:
            chunk.pop("usage", None)
    return recording


def test_a_replayed_vllm_streams_chart_matches_the_footer(charts):
    recording = vllm_stream()
    with Replay(recording, chunk_interval_s=0.02) as replay:
        run, (t, rate) = chart_reply(charts, Endpoint(replay.url), 200)
    footer = run.result.stats.tok_per_s
    assert run.unit == UNIT_TOKENS and run.result.stats.tokens == recording["expected"]["tokens"]
    assert footer > 0 and abs(curve_rate(t, rate) - footer) <= 0.1 * footer, (curve_rate(t, rate), footer)
    assert charts.rate_scale == 1.0 and charts.rate_title == "tokens / s"


def test_a_stream_without_running_counts_is_charted_in_characters_then_scaled_to_the_servers_tokens(charts):
    recording = vllm_without_running_counts()
    with Replay(recording, chunk_interval_s=0.01) as replay:
        run, _ = chart_reply(charts, Endpoint(replay.url), 64)
    counted = charts.series.tokens[charts.series.n - 1]
    assert run.unit == UNIT_CHARACTERS and counted == len(run.result.text)  # chunks are not counted as tokens
    assert run.result.stats.tokens == recording["expected"]["tokens"]
    assert counted * charts.rate_scale == pytest.approx(run.result.stats.tokens)
    assert charts.rate_title == "tokens / s"  # the finished chart is in tokens


def test_the_rate_title_says_when_the_stream_counts_characters(charts):
    units = {}
    for name in ("vllm_per_request.json", "sglang_per_request.json"):
        with Replay(load(name)) as replay:
            units[name] = Endpoint(replay.url).stream_unit()
    assert units == {"vllm_per_request.json": UNIT_TOKENS, "sglang_per_request.json": UNIT_CHARACTERS}
    charts.set_unit(UNIT_CHARACTERS)
    assert charts.rate_title.startswith("characters / s (") and "no token counts" in charts.rate_title
    charts.set_unit(UNIT_TOKENS)
    assert charts.rate_title == "tokens / s"


@pytest.fixture(scope="module")
def serve(demo_family):
    from test_serve import start_server, stop_server

    child, url = start_server("--target", demo_family["target_gguf"], "--draft", demo_family["draft_gguf"],
                              "--method", "draft", "--k", "4", "--threads", "1")
    yield url
    stop_server(child)


def test_specdesk_serves_chart_matches_the_footer(charts, serve):
    endpoint = Endpoint(serve)
    run, (t, rate) = chart_reply(charts, endpoint, 200)
    stats = run.result.stats
    assert stats.tokens == 200 and stats.accepted > 0  # chunks carried several tokens: chunks are not tokens
    assert run.unit == UNIT_CHARACTERS
    footer = stats.tok_per_s
    assert abs(curve_rate(t, rate) - footer) <= 0.1 * footer, (curve_rate(t, rate), footer)


def test_reset_empties_the_charts(charts):
    with Replay(load("vllm_per_request.json")) as replay:
        chart_reply(charts, Endpoint(replay.url), 64)
    assert charts.series.steps > 0 and charts.status.text() != "no run yet"
    charts.reset()
    charts.refresh()
    t, rate = charts.rates()
    assert len(t) == 0 and charts.current_stats() is None and charts.status.text() == "no run yet"
    assert charts.rate_curve.getData()[0] is None or len(charts.rate_curve.getData()[0]) == 0


def test_with_the_targets_tokenizer_the_live_chart_counts_tokens(charts, serve, local):
    """A caller that knows the target's tokenizer (here the served demo target's own) gets
    events counted in tokens while the reply streams; the finished chart is the footer's."""
    chunks: list[str] = []

    def count_tokens(text: str) -> int:
        chunks.append(text)
        return len(local.tokenize(text, add_bos=False))

    endpoint = Endpoint(serve, count_tokens=count_tokens)
    assert endpoint.stream_unit() == UNIT_TOKENIZER
    run, (t, rate) = chart_reply(charts, endpoint, 200)
    counted = charts.series.tokens[charts.series.n - 1]
    assert run.unit == UNIT_TOKENIZER and "".join(chunks) == run.result.text
    assert counted == sum(max(1, len(local.tokenize(c, add_bos=False))) for c in chunks) != len(run.result.text)
    footer = run.result.stats.tok_per_s
    assert abs(curve_rate(t, rate) - footer) <= 0.1 * footer, (curve_rate(t, rate), footer)
