"""Chat and compare against served engines (app/serving/endpoint.py): `specdesk chat --endpoint URL`
and `specdesk compare --endpoint URL [--baseline-endpoint URL2]`.

Compare runs each prompt on a baseline and a speculative arm, alternating which goes first,
with the same sampling, and reports the local compare's JSON (app/runtime/compare.CompareReport).
With one endpoint the baseline is the same server with speculation switched off per request
(specdesk serve's "speculative" field); other servers cannot do that, so the baseline is a
second endpoint (the same model served without speculation, or another speculation setup).
Servers send text, not token ids, so greedy identity is checked on the text.
"""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from specdesk.engines.types import SamplingParams, SpecDeskError, StepEvent

from ..runtime.compare import CompareReport, PromptResult
from ..storage.credentials import load_key
from .endpoint import Endpoint, EndpointError, ServedRun, printable

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


def served_sampling(args) -> SamplingParams:
    if args.max_tokens < 1:
        raise SpecDeskError(f"--max-tokens {args.max_tokens} is out of range: use at least 1")
    return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)


def describe_numbers(run: ServedRun) -> str:
    s = run.result.stats
    parts = [f"{s.tokens} tokens", f"{s.tok_per_s:.1f} tok/s"]
    if s.drafted:
        parts += [f"acceptance {s.acceptance_rate:.2f}", f"{s.mean_accepted_length:.2f} tok/pass"]
    if s.per_position_drafted and s.drafted:
        parts.append("per position " + " ".join(f"{a:.2f}" for a in s.per_position_acceptance))
    parts.append(f"numbers: {run.numbers.source}")
    return " · ".join(parts)


def cmd_served_chat(args) -> int:
    from ..main import user_turns

    endpoint = open_endpoint(args.endpoint, args.endpoint_model, args.endpoint_api_key)
    sampling = served_sampling(args)
    print(printable(f"SpecDesk chat · {endpoint.target_label} · {endpoint.info.describe()}", one_line=True)
          + " · empty line or Ctrl-D to quit, /new for a new chat", file=sys.stderr)
    messages: list[dict] = []
    for _ in user_turns(messages):
        cancel = threading.Event()
        print("model> ", end="", flush=True)
        try:
            run = endpoint.chat(messages, sampling, args.max_tokens, cancel,
                                on_event=lambda e: print(printable(e.text), end="", flush=True))
        except KeyboardInterrupt:
            cancel.set()
            print("\n[stopped]")
            messages.pop()
            continue
        except EndpointError as e:
            print(f"\n[partial reply, {len(e.partial)} characters]" if e.partial else "", file=sys.stderr)
            print(f"specdesk: {e}", file=sys.stderr)
            if e.partial:
                messages.append({"role": "assistant", "content": e.partial})
            else:
                messages.pop()
            continue
        messages.append({"role": "assistant", "content": run.result.text})
        print(f"\n[{describe_numbers(run)}]" + (f"\n[{printable(run.note, one_line=True)}]" if run.note else ""),
              file=sys.stderr)
    return 0


def cmd_served_compare(args) -> int:
    from ..main import compare_prompts, format_table

    prompts = compare_prompts(args)
    sampling = served_sampling(args)
    speculative = open_endpoint(args.endpoint, args.endpoint_model, args.endpoint_api_key)
    baseline = None
    if args.baseline_endpoint:
        baseline = open_endpoint(args.baseline_endpoint, args.baseline_model or args.endpoint_model,
                                 args.baseline_api_key or args.endpoint_api_key)
    report = compare_served(speculative, baseline, prompts, sampling, args.max_tokens)
    payload = report_json(report, speculative, baseline)
    if args.json == "-":
        print(json.dumps(payload))
        return 0
    print(printable(f"speculative: {speculative.target_label} ({speculative.info.kind}) · baseline: "
                    + (f"{baseline.target_label} ({baseline.info.kind})" if baseline is not None
                       else "the same server, speculation off per request"), one_line=True))
    # a server does not say how long drafting took: leave out the local table's time split
    print("\n".join(line for line in format_table(report).splitlines() if not line.startswith("time drafting")))
    for i, result in enumerate(report.results):
        at = result.first_text_difference() if isinstance(result, ServedPromptResult) else None
        if report.temperature == 0 and at is not None:
            print(f"prompt {i + 1}: texts differ from character {at}")
    if args.json:
        Path(args.json).write_text(json.dumps(payload) + "\n")
    return 0
