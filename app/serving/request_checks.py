"""What a client sends `specdesk serve` (app/serving/asgi.py), checked before the engine sees
it, and what a client is told when it is refused.

The body's size, nesting and text are checked before it is parsed (`parse_body`); each field
before it is used (`parse_params`, `chat_messages`, `completion_prompt`), out-of-range values
and fields the server cannot honour (`logit_bias`, `logprobs`, `best_of`) being a 400 naming
the field. A refusal is one line (`RequestError`, `as_request_error`) and never names where
the server's files lie (`without_paths`): a client knows the model by its id.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from specdesk.engines.methods import method_info, uses_file
from specdesk.engines.types import MAX_DRAFT_TOKENS, METHODS, SamplingParams, SpecConfig, SpecDeskError

from ..options import MAX_SEED
from ..runtime.engine_client import EngineHostDied

log = logging.getLogger("specdesk.serve")

MAX_STOP_SEQUENCES = 4
MAX_BODY_BYTES = 8 * 2**20  # a request body: far above a prompt that fills a 128k-token context
MAX_MESSAGES = 4096  # in one chat request
MAX_JSON_DEPTH = 64  # nesting of arrays and objects in a request body; OpenAI's requests use under 8
MAX_INT_FIELD = 2**31 - 1  # top_k, max_tokens: llama.cpp reads them as 32-bit ints


class RequestError(Exception):
    """A request the server refuses: HTTP status and one message for the client."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind


def error_body(error: RequestError, private: tuple[str, ...] = ()) -> dict:
    """The JSON of a refusal, with no absolute path of the server's files in it (`without_paths`)."""
    return {"error": {"message": without_paths(error.message, private), "type": error.kind, "param": error.param,
                      "code": "model_not_found" if error.status == 404 else None}}


# An absolute path left in a message: POSIX (two parts or more; the API's own routes are not
# paths), Windows (C:\... or \\server\share\...). Each becomes its last part, the file's name.
ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/\\-])(?:/(?!v1/|metrics\b)[^\s/'\"`]+(?:/[^\s/'\"`]*)+"
                           r"|[A-Za-z]:\\[^\s'\"`]+|\\\\[^\s'\"`]+)")


def without_paths(text: str, private: tuple[str, ...] = ()) -> str:
    """`text` for a client: the server's model files (`private`: absolute paths, longest first)
    and any other absolute path named by their last part. A client knows the model by its id;
    where its files lie on the server is not its business."""
    for path in private:
        text = text.replace(path, Path(path).name)
    return ABSOLUTE_PATH.sub(lambda m: re.split(r"[/\\]", m.group(0).rstrip("/\\"))[-1], text)


def private_paths(*paths: Optional[str]) -> tuple[str, ...]:
    """The absolute forms of the server's model files and folders (as given, and resolved),
    longest first, for `without_paths`."""
    found = set()
    for path in paths:
        if path:
            found |= {str(Path(path).absolute()), os.path.realpath(path)}
    return tuple(sorted(found, key=len, reverse=True))


# --- the body ----------------------------------------------------------------------
STRING_LITERAL = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # paired or lone: only then is the slower check made


def json_depth(data: bytes) -> int:
    """How deep arrays and objects nest in JSON text, counted outside its strings, without
    parsing it (json.loads recurses once per level, so depth is checked first)."""
    bare = np.frombuffer(STRING_LITERAL.sub(b'""', data), np.uint8)
    step = (bare == ord("[")).astype(np.int32) + (bare == ord("{")) - (bare == ord("]")) - (bare == ord("}"))
    return int(np.cumsum(step).max(initial=0))


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def parse_body(data: bytes) -> Any:
    """A request body as JSON, within MAX_BODY_BYTES and MAX_JSON_DEPTH, with no NaN or
    Infinity and no lone surrogate in its strings (text that cannot be encoded)."""
    if len(data) > MAX_BODY_BYTES:
        raise RequestError(413, f"the request body is over {MAX_BODY_BYTES // 2**20} MiB: send a shorter prompt")
    if json_depth(data) > MAX_JSON_DEPTH:
        raise RequestError(400, f"the request body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep")
    try:
        body = json.loads(data, parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise RequestError(400, f"the request body is not valid JSON: {str(e).splitlines()[0][:200]}") from None
    if SURROGATE_ESCAPE.search(data):
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError(400, "the request body has a lone surrogate escape (\\ud800 to \\udfff without its "
                               "pair): it is not valid text") from None
    return body


# --- its fields --------------------------------------------------------------------
@dataclass(frozen=True)
class Params:
    sampling: SamplingParams
    spec: SpecConfig
    max_tokens: Optional[int]  # None: until the context is full
    stops: tuple[str, ...]
    stream: bool
    include_usage: bool


def _field(body: dict, name: str, kind: type, default: Any) -> Any:
    """body[name] as `kind` (an int is a float too; a bool is never a number), or `default` when absent."""
    value = body.get(name)
    if value is None:
        return default
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        wanted = {float: "a number", int: "an integer", bool: "true or false", dict: "an object"}.get(kind, kind.__name__)
        raise RequestError(400, f"'{name}' must be {wanted}, not {json.dumps(value)[:40]}", name)
    return value


def _bounded(body: dict, name: str, kind: type, default: Any, low: float, high: float) -> Any:
    """A numeric field within [low, high] (both allowed); out of range is a 400 naming the range."""
    value = _field(body, name, kind, default)
    if value is not None and not (low <= value <= high):  # NaN is refused too: it compares false
        raise RequestError(400, f"'{name}' {json.dumps(value)[:40]} is out of range: use {low} to {high}", name)
    return value


def parse_params(body: dict, defaults: SamplingParams, server_spec: SpecConfig, draft_path: Optional[str]) -> Params:
    """The sampling, speculation and stopping fields of a request; out-of-range values are 400s."""
    if _field(body, "n", int, 1) != 1:
        raise RequestError(400, "'n' must be 1: one engine serves one completion per request", "n")
    seed = _bounded(body, "seed", int, None, 0, MAX_SEED)
    # Accepted for OpenAI clients and not used: still numbers in OpenAI's ranges, or a 400.
    for name in ("presence_penalty", "frequency_penalty"):
        _bounded(body, name, float, None, -2.0, 2.0)
    _bounded(body, "top_logprobs", int, None, 0, 20)
    refuse_unsupported(body)
    try:
        sampling = SamplingParams(
            temperature=_field(body, "temperature", float, defaults.temperature),
            top_p=_field(body, "top_p", float, defaults.top_p),
            top_k=_bounded(body, "top_k", int, defaults.top_k, 0, MAX_INT_FIELD),
            seed=secrets.randbits(31) if seed is None else seed,  # as OpenAI's: no seed, no repeatability
        )
    except SpecDeskError as e:
        raise RequestError(400, str(e)) from None
    max_tokens = _bounded(body, "max_completion_tokens", int, None, 1, MAX_INT_FIELD)
    max_tokens = _bounded(body, "max_tokens", int, max_tokens, 1, MAX_INT_FIELD)
    stop = body.get("stop")
    stops = (stop,) if isinstance(stop, str) else stop or ()
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError(400, "'stop' must be a string or a list of non-empty strings", "stop")
    if len(stops) > MAX_STOP_SEQUENCES:
        raise RequestError(400, f"'stop' has {len(stops)} sequences: use at most {MAX_STOP_SEQUENCES}", "stop")
    options = _field(body, "stream_options", dict, {})
    return Params(sampling, parse_speculative(body.get("speculative"), server_spec, draft_path), max_tokens,
                  tuple(stops), bool(_field(body, "stream", bool, False)),
                  bool(options.get("include_usage", False)))


def parse_speculative(value: Any, server_spec: SpecConfig, draft_path: Optional[str]) -> SpecConfig:
    """The request's own method / k (the documented "speculative" field), else the server's."""
    if value is None:
        return server_spec
    if not isinstance(value, dict):
        raise RequestError(400, "'speculative' must be an object like {\"method\": \"none\", \"k\": 0}", "speculative")
    method = value.get("method", server_spec.method)
    if method not in METHODS:
        raise RequestError(400, f"speculative method {method!r} is unknown: use one of {', '.join(METHODS)}",
                           "speculative.method")
    k = value.get("k", server_spec.k if server_spec.method != "none" else 4)
    if not isinstance(k, int) or isinstance(k, bool) or not (method == "none" or 1 <= k <= MAX_DRAFT_TOKENS):
        raise RequestError(400, f"speculative k {k!r} is out of range: use 1 to {MAX_DRAFT_TOKENS}", "speculative.k")
    if method_info(method).file_required and not draft_path:
        raise RequestError(400, f"speculative method {method!r} needs a drafter: start the server with --draft FILE",
                           "speculative.method")
    try:
        return SpecConfig(method=method, k=k if method != "none" else server_spec.k,
                          draft_path=draft_path if uses_file(method) else None,
                          draft_p_min=server_spec.draft_p_min)
    except SpecDeskError as e:
        raise RequestError(400, str(e), "speculative") from None


def chat_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty list of {role, content} objects", "messages")
    if len(messages) > MAX_MESSAGES:
        raise RequestError(400, f"'messages' has {len(messages):,} messages: send at most {MAX_MESSAGES:,}",
                           "messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(400, f"messages[{i}] must be an object with a 'role'", f"messages[{i}]")
        content = message.get("content") or ""
        if isinstance(content, list):  # content parts: only text is understood
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise RequestError(400, f"messages[{i}]: only text content parts are supported", f"messages[{i}]")
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(content, str):
            raise RequestError(400, f"messages[{i}].content must be a string", f"messages[{i}].content")
        out.append({"role": message["role"], "content": content})
    return out


def completion_prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    raise RequestError(400, "'prompt' must be a non-empty string (or one list of token ids)", "prompt")


def refuse_unsupported(body: dict) -> None:
    """OpenAI fields this server cannot honour are refused by name, never silently ignored
    (a client asking for them would take the reply for what it asked): a value that asks for
    nothing (null, false, {}, 1) passes."""
    if body.get("logit_bias") not in (None, {}):
        raise RequestError(400, "'logit_bias' is not supported: this server cannot bias tokens; send the request "
                           "without it", "logit_bias")
    for name in ("logprobs", "top_logprobs"):
        value = body.get(name)
        if value is not None and value is not False and not (name == "top_logprobs" and value == 0):
            raise RequestError(400, f"'{name}' is not supported: this server returns no log-probabilities; send the "
                               "request without it", name)
    best_of = body.get("best_of")
    if best_of is not None and not (isinstance(best_of, int) and not isinstance(best_of, bool) and best_of == 1):
        raise RequestError(400, "'best_of' must be 1: one engine serves one completion per request", "best_of")


def as_request_error(error: BaseException) -> RequestError:
    """The answer for an error: what a client can act on in one line; anything else is an
    internal error whose details (and traceback) go to the server log under an id."""
    if isinstance(error, RequestError):
        return error
    if isinstance(error, EngineHostDied):  # the next request starts a fresh engine process
        log.warning("%s\n%s", error, error.details)
        return RequestError(503, str(error).splitlines()[0], kind="server_error")
    if isinstance(error, SpecDeskError):
        return RequestError(400, str(error).splitlines()[0])
    if isinstance(error, MemoryError):
        return RequestError(503, "the engine ran out of memory: send a shorter prompt or fewer max_tokens",
                            kind="server_error")
    ident = secrets.token_hex(4)
    log.error("internal error %s", ident, exc_info=error)
    return RequestError(500, f"internal error {ident}: the details are in the server log", kind="server_error")
