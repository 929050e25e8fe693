"""app/serving/request_checks.py's pure pieces on literals: a request body checked before it is
parsed, and a refusal's words for a client (tests/test_serve.py has them on a real server)."""

from __future__ import annotations

import pytest

from specdesk.app.serving.request_checks import RequestError, json_depth, parse_body, private_paths, without_paths


def test_pure_body_checks():
    assert json_depth(b'{"a": [1, {"b": "[[[[{{{"}], "c": "\\"]"}') == 3
    assert json_depth(b"[]" * 1000) == 1 and json_depth(b"") == 0
    assert parse_body(b'{"a": "\\ud83d\\ude00"}') == {"a": "\U0001F600"}  # a surrogate pair is text
    for data, words in ((b'{"a": "\\udc00"}', "lone surrogate"), (b"[" * 65 + b"]" * 65, "64 levels"),
                        (b'{"a": Infinity}', "not a JSON number"), (b'{"a": 1' + b"0" * 5000 + b"}", "not valid JSON"),
                        (b"\xff\xfe{}", "not valid JSON")):
        with pytest.raises(RequestError, match=words):
            parse_body(data)


def test_messages_for_clients_name_files_by_name_only():
    private = private_paths("/srv/models/team/target-F16.gguf", None)
    assert without_paths("/srv/models/team/target-F16.gguf: this GGUF has no MTP (NextN) layers", private) == \
        "target-F16.gguf: this GGUF has no MTP (NextN) layers"
    assert without_paths("cannot read '/home/u/.cache/specdesk/demo/ab12/tokenizer.json' (denied)") == \
        "cannot read 'tokenizer.json' (denied)"
    assert without_paths("C:\\Users\\u\\models\\m.gguf: bad; \\\\nas\\share\\d.gguf too") == "m.gguf: bad; d.gguf too"
    untouched = ("'model' is required: GET /v1/models lists it; /metrics; http://gpu-box:8000/v1/chat/completions; "
                 "3 tok/s; 1/2; 'meta-llama/Llama-3.3-70B' is not served here")
    assert without_paths(untouched) == untouched
