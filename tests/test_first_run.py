"""The first-run card: it says what the demo model is, suggests a pair that fits, downloads both
files from the hub (a local server that speaks its API) with progress, and hands them over."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hub_server import HubServer  # noqa: E402

from specdesk.app.models.choose import choose_for  # noqa: E402
from specdesk.app.models.curated import HubFile, SuggestedPair  # noqa: E402
from specdesk.app.models.library import read_model  # noqa: E402
from specdesk.ui import first_run  # noqa: E402
from specdesk.ui.job_thread import running_threads  # noqa: E402

TIMEOUT_MS = 120_000


@pytest.fixture
def served_pair(tmp_path, monkeypatch, demo_family):
    """The demo target and draft served under a suggested pair's hub names."""
    target, draft = Path(demo_family["target_gguf"]).read_bytes(), Path(demo_family["draft_gguf"]).read_bytes()
    with HubServer() as server:
        server.add_repo("acme/Demo-Target-GGUF", {"demo-target-F16.gguf": target}, tags=["gguf"])
        server.add_repo("acme/Demo-Draft-GGUF", {"demo-draft-F16.gguf": draft}, tags=["gguf"])
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        pair = SuggestedPair("Demo with its draft", HubFile("acme/Demo-Target-GGUF", "demo-target-F16.gguf", len(target)),
                             HubFile("acme/Demo-Draft-GGUF", "demo-draft-F16.gguf", len(draft)), "tests",
                             1 << 20)
        server.throttle_s = 0.0005  # progress reaches the card before the end
        yield server, pair


@pytest.fixture(autouse=True)
def cards_shut_down(monkeypatch):
    """Every card a test made ends its download thread, even when the test failed halfway (a
    thread left running would fail the next file's thread check instead)."""
    made = []
    original = first_run.FirstRunCard.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(self)
    monkeypatch.setattr(first_run.FirstRunCard, "__init__", init)
    yield
    for card in made:
        card.shutdown()


def test_the_card_downloads_the_suggested_pair_and_hands_over_a_compatible_draft(qtbot, served_pair):
    server, pair = served_pair
    card = first_run.FirstRunCard(pair, 16_000_000_000, "RAM")
    qtbot.addWidget(card)
    card.show()
    assert "demo model" in card.demo.text() and "standard library" in card.demo.text()
    assert pair.name in card.suggestion.text() and "16.0 GB" in card.suggestion.text()
    assert pair.target.repo in card.suggestion.toolTip()  # where it comes from, without crowding the card
    progress = []
    card._lane.progressed.connect(lambda item: progress.append(item[1][2]))
    with qtbot.waitSignal(card.use_pair, timeout=TIMEOUT_MS) as got:
        card.get_button.click()
        assert card.get_button.text() == "Cancel" and card.progress.isVisible()
    target, draft = got.args
    assert Path(target).name == "demo-target-F16.gguf" and Path(draft).name == "demo-draft-F16.gguf"
    assert progress and progress == sorted(progress)  # one bar over both files, never going back
    assert card.progress.value() == first_run.PROGRESS_STEPS
    entries = [read_model(target), read_model(draft)]
    assert choose_for(target, entries, records=[]).draft == draft  # the loaded draft is compatible
    card.shutdown()
    assert running_threads() == []


def test_a_cancelled_download_resumes(qtbot, served_pair, tmp_path):
    server, pair = served_pair
    card = first_run.FirstRunCard(pair, 16 << 30, "RAM")
    qtbot.addWidget(card)
    server.hold_at = 4096

    def partial_written() -> bool:
        # Bytes of the target on disk: the card reports "downloading … 0 B" as soon as the response
        # opens, and a cancel before the first chunk is written leaves nothing to resume from.
        return any(p.stat().st_size > 0 for p in (tmp_path / "hf-cache").rglob("*.incomplete"))

    with qtbot.waitSignal(card._lane.failed, timeout=TIMEOUT_MS):
        card.get_button.click()
        qtbot.waitUntil(lambda: partial_written() and "downloading the target" in card.status.text(),
                        timeout=TIMEOUT_MS)
        card.get_button.click()  # Cancel
        server.released.set()
    assert card.get_button.text() == "Resume download"
    assert "cancelled" in card.status.text()
    server.hold_at = None
    with qtbot.waitSignal(card.use_pair, timeout=TIMEOUT_MS):
        card.get_button.click()
    assert any(r.range and r.range.startswith("bytes=") and r.range != "bytes=0-" for r in server.log
               if r.path.startswith("/cdn/"))  # picked up where it stopped
    card.shutdown()
    assert running_threads() == []


def test_no_suggestion_on_a_machine_too_small_says_what_to_do(qtbot):
    card = first_run.FirstRunCard(None, 1 << 30, "RAM")
    qtbot.addWidget(card)
    assert not card.get_button.isEnabled()
    assert "too little" in card.suggestion.text() and "Models tab" in card.suggestion.text()
    with qtbot.waitSignal(card.dismissed, timeout=1000):
        card.close_button.click()
    assert card.isHidden()
    card.shutdown()


PAIRS = [SuggestedPair(f"{size} GB pair", HubFile("acme/t", f"t{size}.gguf", size * 10**9), HubFile("acme/d", "d.gguf", 5 * 10**8),
                       "tests", 2 * 10**9) for size in (2, 5, 9, 20)]


def test_the_suggestion_is_sized_by_speed_as_well_as_memory():
    from specdesk.app.models.curated import MIN_TOKENS_PER_S, estimated_tokens_per_s, suggest

    memory = 20 * 10**9  # fits every pair but the 20 GB one (with its draft and overhead: 22.5 GB)
    assert suggest(memory, PAIRS).target.bytes == 9 * 10**9  # memory alone: the largest that fits
    fast = 200 * 10**9  # a machine that reads 200 GB/s: the 9 GB target at about 17 tokens/s
    assert suggest(memory, PAIRS, fast).target.bytes == 9 * 10**9
    two_cores = 8 * 10**9  # 8 GB/s: 9 GB gives 0.7 tokens/s, 2 GB about 3
    slow = suggest(memory, PAIRS, two_cores)
    assert slow.target.bytes == 2 * 10**9 and estimated_tokens_per_s(slow, two_cores) < MIN_TOKENS_PER_S
    middling = 40 * 10**9  # 5 GB at 6 tokens/s is too slow, 2 GB at 15 is not
    assert suggest(memory, PAIRS, middling).target.bytes == 2 * 10**9
    assert suggest(1 * 10**9, PAIRS, fast) is None


def test_this_machines_read_speed_is_measured():
    from specdesk.app.models.curated import read_speed

    speed = read_speed(threads=1, total_bytes=64 * 2**20, repeats=2)
    assert 10**8 < speed < 10**13  # bytes a second: some 0.1 GB/s to 10 TB/s is a machine's memory


def test_the_card_says_the_read_speed_and_the_tokens_a_second_to_expect(qtbot):
    card = first_run.FirstRunCard(PAIRS[0], 24 * 10**9, "RAM", read_bytes_per_s=8 * 10**9)
    qtbot.addWidget(card)
    text = card.suggestion.text()
    assert PAIRS[0].name in text and "read at 8.0 GB/s" in text and "about 3 tokens/s" in text
    assert "slower still" in card.suggestion.toolTip() and "measured" in card.suggestion.toolTip()
    card.shutdown()
