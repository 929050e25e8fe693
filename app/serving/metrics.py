"""GET /metrics of `specdesk serve`: counters named like vLLM's and llama-server's, so one dashboard
reads all three (prometheus.py reads such text from other servers)."""

from __future__ import annotations


class Metrics:
    """Counters named like vLLM's and llama-server's, so one dashboard reads all three. The
    exposition format is a few lines of text; no client library is bundled for it."""

    def __init__(self, prefix: str = "specdesk") -> None:
        self.prefix = prefix
        self.drafts = self.draft_tokens = self.accepted_tokens = 0
        self.accepted_per_pos: list[int] = []
        self.prompt_tokens = self.generation_tokens = 0
        self.requests: dict[str, int] = {}
        self.running = self.waiting = 0

    def record(self, summary: dict, prompt_tokens: int, finish_reason: str) -> None:
        self.drafts += summary["drafts"]
        self.draft_tokens += summary["draft_tokens"]
        self.accepted_tokens += summary["accepted_tokens"]
        for i, n in enumerate(summary["accepted_per_position"]):
            if i >= len(self.accepted_per_pos):
                self.accepted_per_pos.append(0)
            self.accepted_per_pos[i] += n
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += summary["tokens"]
        self.requests[finish_reason] = self.requests.get(finish_reason, 0) + 1

    def render(self) -> str:
        p = self.prefix
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, int]]) -> None:
            lines.append(f"# HELP {p}:{name} {help_text}")
            lines.append(f"# TYPE {p}:{name} {kind}")
            full = f"{p}:{name}_total" if kind == "counter" else f"{p}:{name}"
            lines.extend(f"{full}{labels} {value}" for labels, value in samples)

        metric("spec_decode_num_drafts", "counter", "Verification steps that checked draft tokens.",
               [("", self.drafts)])
        metric("spec_decode_num_draft_tokens", "counter", "Draft tokens proposed.", [("", self.draft_tokens)])
        metric("spec_decode_num_accepted_tokens", "counter", "Draft tokens accepted.", [("", self.accepted_tokens)])
        metric("spec_decode_num_accepted_tokens_per_pos", "counter", "Draft tokens accepted, per draft position.",
               [(f'{{position="{i}"}}', n) for i, n in enumerate(self.accepted_per_pos)])
        metric("request_success", "counter", "Requests finished, by finish reason.",
               [(f'{{finished_reason="{r}"}}', n) for r, n in sorted(self.requests.items())])
        metric("prompt_tokens", "counter", "Prompt tokens processed.", [("", self.prompt_tokens)])
        metric("generation_tokens", "counter", "Tokens generated.", [("", self.generation_tokens)])
        metric("num_requests_running", "gauge", "Requests generating now.", [("", self.running)])
        metric("num_requests_waiting", "gauge", "Requests waiting for the engine.", [("", self.waiting)])
        return "\n".join(lines) + "\n"
