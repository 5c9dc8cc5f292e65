"""Every relative link in README.md, CHANGELOG.md and docs/ resolves: the file or folder exists, and an
`#anchor` into a Markdown file names one of its headings (GitHub's heading ids)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted(
    [REPO / "README.md", REPO / "CHANGELOG.md", *(REPO / "docs").rglob("*.md")],
)
PAGES = [page for page in PAGES if "raw" not in page.relative_to(REPO).parts]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where a `[x](y)` is not a link."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def heading_ids(markdown: str) -> set[str]:
    """The ids GitHub gives a page's headings: lower case, punctuation dropped, spaces to dashes, -N for repeats."""
    ids: set[str] = set()
    seen: dict[str, int] = {}
    for heading in HEADING.findall(FENCE.sub("", markdown)):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        ids.add(slug if count == 0 else f"{slug}-{count}")
    return ids


def relative_links(page: Path) -> list[str]:
    links = LINK.findall(prose(page.read_text()))
    return [link for link in links if not re.match(r"^[a-z][a-z0-9+.-]*:", link)]


CASES = [(page, link) for page in PAGES for link in relative_links(page)]


def test_the_manual_has_links_to_check():
    assert len(PAGES) >= 10, PAGES
    assert len(CASES) >= 50, len(CASES)


@pytest.mark.parametrize(("page", "link"), CASES, ids=[f"{page.relative_to(REPO)}:{link}" for page, link in CASES])
def test_relative_link_resolves(page, link):
    path, _, anchor = link.partition("#")
    target = (page.parent / path).resolve() if path else page
    assert target.exists(), f"{page.relative_to(REPO)} links to {link}, which does not exist"
    assert REPO in target.parents or target == REPO, f"{page.relative_to(REPO)} links outside the repository: {link}"
    if anchor and target.suffix == ".md":
        ids = heading_ids(target.read_text())
        assert anchor in ids, f"{page.relative_to(REPO)} links to {link}: no such heading in {target.name}"


def test_heading_ids_follow_github():
    text = "# The ColocGRPOJob API (`colocgrpo.io/v1alpha1`)\n## What vLLM's sleep mode does\n## Results\n## Results\n"
    assert heading_ids(text) == {
        "the-colocgrpojob-api-colocgrpoiov1alpha1",
        "what-vllms-sleep-mode-does",
        "results",
        "results-1",
    }
