"""The README and docs/ hold together: every relative link names a file in the repository (and a
heading there, when it names one), every page in docs/ is reachable from the README, and the
README stays short enough to read in one sitting (details live in docs/)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 250
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def prose(markdown: str) -> str:
    """The text outside fenced code blocks and code spans, where a link is a link."""
    return CODE_SPAN.sub("", FENCE.sub("", markdown))


def link_targets(markdown: str) -> list[str]:
    """The targets of inline links and images, in order."""
    return LINK.findall(prose(markdown))


def is_external(target: str) -> bool:
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) is not None


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: inline code and link syntax dropped, lower case,
    punctuation removed, spaces turned into hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every heading's anchor, with GitHub's -1, -2 suffixes for repeated headings."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", markdown)):
        base = slug(heading)
        n = seen.get(base, 0)
        found.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return found


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of `page` whose file (or heading) is not in the repository."""
    problems = []
    text = page.read_text(encoding="utf-8")
    for target in link_targets(text):
        if is_external(target):
            continue
        path_part, _, fragment = target.partition("#")
        dest = page if not path_part else (page.parent / unquote(path_part)).resolve()
        if not path_part and not fragment:
            continue
        if root.resolve() not in dest.parents and dest != root.resolve():
            problems.append(f"{target}: outside the repository")
        elif not dest.exists():
            problems.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest.read_text(encoding="utf-8")):
            problems.append(f"{target}: no heading with that anchor in {dest.name}")
    return problems


def test_slugs_follow_githubs_rule():
    assert slug("The llama.cpp backend and CPU code") == "the-llamacpp-backend-and-cpu-code"
    assert slug("`specdesk serve`: an OpenAI-compatible API") == "specdesk-serve-an-openai-compatible-api"
    assert slug("Native drafters on GGUF targets (MTP, DFlash, EAGLE-3)") == \
        "native-drafters-on-gguf-targets-mtp-dflash-eagle-3"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


def test_links_in_code_are_not_links_and_external_ones_are_not_checked():
    text = ("See [the map](docs/ARCHITECTURE.md#layers) and ![shot](docs/a.png \"title\").\n"
            "`[not](a-link.md)` and\n```\n[nor](this.md)\n```\n[web](https://example.org/x)\n")
    assert link_targets(text) == ["docs/ARCHITECTURE.md#layers", "docs/a.png", "https://example.org/x"]
    assert is_external("https://example.org/x") and not is_external("docs/a.png")


def test_a_broken_link_is_reported_with_its_reason(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title\n\n## Some part\n", encoding="utf-8")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/a.md#some-part) [gone](docs/b.md) [anchor](docs/a.md#nothing) "
                    "[up](../x.md) [here](#title)\n# Title\n", encoding="utf-8")
    assert broken_links(page, tmp_path) == [
        "docs/b.md: no such file",
        "docs/a.md#nothing: no heading with that anchor in a.md",
        "../x.md: outside the repository",
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_every_page_in_docs_is_linked_from_the_readme():
    readme = ROOT / "README.md"
    linked = {(readme.parent / t.partition("#")[0]).resolve()
              for t in link_targets(readme.read_text(encoding="utf-8")) if not is_external(t)}
    unlinked = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert unlinked == []


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move details into docs/"
