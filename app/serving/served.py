"""Chat and compare against served engines (app/serving/endpoint.py): `ServedSession`, a server
as a chat backend (app/runtime/backend.py) for `specdesk chat --endpoint URL`, `specdesk compare
--endpoint URL [--baseline-endpoint URL2]` and the app's Servers menu.

Compare runs each prompt on a baseline and a speculative arm, alternating which goes first,
with the same sampling, and reports the local compare's JSON (app/runtime/compare.CompareReport).
With one endpoint the baseline is the same server with speculation switched off per request
(specdesk serve's "speculative" field); other servers cannot do that, so the baseline is a
second endpoint (the same model served without speculation, or another speculation setup).
Servers send text, not token ids, so greedy identity is checked on the text.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Generator, Optional, Sequence

from specdesk.engines.types import SamplingParams, SpecConfig, SpecDeskError, StepEvent

from ..runtime.backend import ChatOutcome, ChatSettings
from ..runtime.compare import CompareReport, PromptResult
from ..storage.credentials import load_key
from .endpoint import Endpoint, EndpointError, ServedRun

BASELINE = {"method": "none"}  # specdesk serve's per-request switch


@dataclass(frozen=True)
class ServedPromptResult(PromptResult):
    """A prompt's two replies from servers: compared on their text."""

    baseline_run: Optional[ServedRun] = None
    speculative_run: Optional[ServedRun] = None

    @property
    def identical(self) -> bool:
        return self.baseline.text == self.speculative.text

    def first_divergence(self) -> Optional[int]:
        return None  # no token ids from a server: see first_text_difference

    def first_text_difference(self) -> Optional[int]:
        a, b = self.baseline.text, self.speculative.text
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return i
        return None if len(a) == len(b) else min(len(a), len(b))


def user_message(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def compare_served(speculative: Endpoint, baseline: Optional[Endpoint], prompts: list[str],
                   sampling: SamplingParams, max_tokens: int,
                   on_event: Optional[Callable[[str, int, StepEvent], None]] = None,
                   cancel: Optional[threading.Event] = None, warm: bool = True) -> CompareReport:
    if not prompts:
        raise SpecDeskError("no prompts to compare")
    cancel = cancel or threading.Event()
    if baseline is None and not speculative.info.switches_speculation:
        raise EndpointError(f"{speculative.url} ({speculative.info.kind}) cannot switch speculation off per "
                            "request: give the same model served without speculation as --baseline-endpoint URL")

    def run(label: str, index: int, prompt: str, tokens: int) -> ServedRun:
        callback = None if on_event is None else (lambda e: on_event(label, index, e))
        if label == "baseline" and baseline is None:
            return speculative.chat(user_message(prompt), sampling, tokens, cancel, callback, speculative=BASELINE)
        endpoint = baseline if label == "baseline" else speculative
        return endpoint.chat(user_message(prompt), sampling, tokens, cancel, callback)

    if warm:  # first requests pay for allocations and caches on the server
        for label in ("baseline", "speculative"):
            run(label, -1, prompts[0], 4)
    results = []
    for index, prompt in enumerate(prompts):
        runs = {}
        order = ("baseline", "speculative") if index % 2 == 0 else ("speculative", "baseline")
        for label in order:
            runs[label] = run(label, index, prompt, max_tokens)
        results.append(ServedPromptResult(prompt, runs["baseline"].result, runs["speculative"].result,
                                          runs["baseline"], runs["speculative"]))
        if cancel.is_set():
            break
    k = max((len(r.speculative.stats.per_position_drafted) for r in results), default=0)
    # the server's draft model is its own business: "draft" stays None; the baseline arm is in report_json
    return CompareReport(f"served:{speculative.info.kind}", speculative.target_label, None, "served", k,
                         sampling.temperature, tuple(results))


def report_json(report: CompareReport, speculative: Endpoint, baseline: Optional[Endpoint]) -> dict:
    """The local compare's JSON, plus where each arm ran and where its numbers came from."""
    payload = report.to_json()
    payload["endpoint"] = {"url": speculative.url, "model": speculative.model, "kind": speculative.info.kind}
    payload["baseline_endpoint"] = None if baseline is None else {
        "url": baseline.url, "model": baseline.model, "kind": baseline.info.kind}
    runs = [r.speculative_run for r in report.results if isinstance(r, ServedPromptResult)]
    payload["speculative"]["numbers_from"] = sorted({r.numbers.source for r in runs if r is not None})
    return payload


# --- a server as a chat backend ---------------------------------------------------------
class ServedSession:
    """A server as app/runtime/backend.ChatBackend: its replies stream from `endpoint`; Compare's
    baseline is `baseline`, or the same server with speculation off per request where it can
    (specdesk serve). The server cuts a conversation to its context and chooses its own
    method; its numbers are its own and are not kept with this machine's measurements."""

    def __init__(self, endpoint: Endpoint, baseline: Optional[Endpoint] = None):
        self.endpoint = endpoint
        self.baseline = baseline

    @property
    def label(self) -> str:
        return f"{self.endpoint.model} at {self.endpoint.url}"

    @property
    def baseline_label(self) -> str:
        """What Compare's baseline arm runs on."""
        return "no speculation" if self.baseline is None else f"{self.baseline.model} at {self.baseline.url}"

    @property
    def needs_baseline(self) -> bool:
        """Compare needs a baseline server: this one cannot switch speculation off per request."""
        return self.baseline is None and not self.endpoint.info.switches_speculation

    def meta(self) -> dict:
        """Where a reply came from, as the chat history keeps it (never the API key)."""
        return {"url": self.endpoint.url, "model": self.endpoint.model}

    local = False  # the server chooses its own method; the window's model pickers do not apply

    def stream_unit(self) -> str:
        """What its stream counts: tokens, or characters where it cannot tell."""
        return self.endpoint.stream_unit()

    def answered_by(self, spec: SpecConfig, last_choice: Optional[str] = None) -> str:
        return self.endpoint.model

    def origin(self, spec: SpecConfig) -> dict:
        return {"server": self.meta()}

    def compare_refusal(self, spec: SpecConfig) -> Optional[str]:
        if not self.needs_baseline:
            return None
        return (f"{self.endpoint.url} ({self.endpoint.info.kind}) cannot switch speculation off per request: add the "
                "server again with a baseline server (the same model without speculation)")

    def arm_titles(self, spec: SpecConfig) -> tuple[str, str]:
        return self.baseline_label, self.label

    def chat(self, messages: list[dict], settings: ChatSettings, cancel: threading.Event
             ) -> Generator[StepEvent, None, ChatOutcome]:
        run = yield from self.endpoint.stream_chat(messages, settings.sampling, settings.max_tokens, cancel)
        return ChatOutcome(run.result, numbers=run.numbers.source, note=run.note)

    def record(self, settings: ChatSettings, outcome: ChatOutcome, tally) -> None:
        """Nothing to keep here: the server measured the reply on its own hardware."""

    def compare(self, prompts: Sequence[str], settings: ChatSettings, cancel: threading.Event,
                on_event: Optional[Callable[[str, int, StepEvent], None]] = None,
                chat: bool = True) -> CompareReport:
        """Prompts go to the server as chat messages (a chat API has no raw completion here)."""
        def forward(label: str, index: int, event: StepEvent) -> None:
            if index >= 0:  # not the warm-up requests
                on_event(label, index, event)

        return compare_served(self.endpoint, self.baseline, list(prompts), settings.sampling, settings.max_tokens,
                              forward if on_event is not None else None, cancel)

    def chart_k(self, settings: ChatSettings) -> int:
        """llama-server's chunks carry running draft counts (read as one step each); other
        servers' numbers come with the reply's end."""
        return 1 if self.endpoint.info.kind == "llama-server" else 0

    def token_bytes(self) -> None:
        """A server sends text, not token ids: each chunk is one piece, never tinted."""
        return None

    def compare_json(self, report: CompareReport) -> dict:
        return report_json(report, self.endpoint, self.baseline)

    def new_chat(self) -> None:
        """A server keeps nothing between requests that a new chat should forget."""

    def close(self) -> None:
        self.endpoint.close()
        if self.baseline is not None:
            self.baseline.close()


# --- the commands ------------------------------------------------------------------
def add_endpoint_options(parser, compare: bool) -> None:
    parser.add_argument("--endpoint", metavar="URL",
                        help="an OpenAI-compatible server (vLLM, SGLang, llama-server, specdesk serve, ...) "
                             "instead of local models")
    parser.add_argument("--model", dest="endpoint_model", metavar="ID",
                        help="the server's model id (default: the first it lists)")
    parser.add_argument("--api-key", dest="endpoint_api_key", metavar="KEY",
                        help="the server's API key (default: the one stored for it, if any)")
    if compare:
        parser.add_argument("--baseline-endpoint", metavar="URL",
                            help="the baseline arm on another server (the same model without speculation); "
                                 "needed unless --endpoint is specdesk serve")
        parser.add_argument("--baseline-model", metavar="ID", help="the baseline server's model id")
        parser.add_argument("--baseline-api-key", metavar="KEY", help="the baseline server's API key")


def open_endpoint(url: str, model: Optional[str], api_key: Optional[str]) -> Endpoint:
    endpoint = Endpoint(url, model=model)
    endpoint.api_key = api_key or load_key(endpoint.url)
    endpoint.probe()
    return endpoint
