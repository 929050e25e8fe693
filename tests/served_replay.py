"""A small local HTTP server that replays a recorded OpenAI-compatible server (tests/served/*.json).

The recordings are marked as such in their "recording" field: vLLM and SGLang need GPUs, so
their documented response and metrics shapes are replayed here. The replay can also misbehave
on purpose: require an API key, drop the stream after some chunks, forget the model, or
serve metrics that are not Prometheus text.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

RECORDINGS = Path(__file__).parent / "served"


def load(name: str) -> dict:
    return json.loads((RECORDINGS / name).read_text())


class Replay:
    def __init__(self, recording: dict, api_key: str | None = None, drop_after: int | None = None,
                 model_gone: bool = False, metrics_text: str | None = None, whole: bool = False,
                 chunk_interval_s: float = 0.0):
        self.recording = recording
        self.api_key = api_key
        self.drop_after = drop_after
        self.model_gone = model_gone
        self.metrics_text = metrics_text
        self.whole = whole  # answer with one JSON reply, as a server that does not stream
        self.chunk_interval_s = chunk_interval_s  # the pause before each streamed chunk, as a server decodes
        self.replied = False
        self.requests: list[dict] = []
        replay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _authorised(self) -> bool:
                if replay.api_key and self.headers.get("Authorization") != f"Bearer {replay.api_key}":
                    self._json(401, {"error": {"message": "Invalid API key", "type": "authentication_error"}})
                    return False
                return True

            def _json(self, status: int, payload: dict) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if not self._authorised():
                    return
                if self.path == "/v1/models":
                    self._json(200, replay.recording["models"])
                elif self.path == "/metrics":
                    text = replay.metrics_text or replay.recording["metrics_after" if replay.replied else
                                                                 "metrics_before"]
                    body = text.encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self._json(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if not self._authorised():
                    return
                replay.requests.append(body)
                if replay.model_gone:
                    self._json(404, {"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                               "type": "NotFoundError", "code": 404}})
                    return
                if replay.whole:
                    stream = replay.recording["stream"]
                    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in stream if c["choices"])
                    replay.replied = True
                    self._json(200, {**stream[-1], "object": "chat.completion", "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}]})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for i, chunk in enumerate(replay.recording["stream"]):
                    if replay.drop_after is not None and i >= replay.drop_after:
                        self.wfile.flush()
                        self.close_connection = True
                        return  # the connection closes without [DONE]
                    time.sleep(replay.chunk_interval_s)
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                replay.replied = True
                self.wfile.write(b"data: [DONE]\n\n")
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Replay":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
