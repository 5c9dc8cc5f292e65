"""The figures of the GRPO step against TRL have one source: the results on README.md and the benchmark pages are
what `python -m bench.pair_table` writes from the raw files their markers name, and differ from them nowhere."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from bench import pair_table

REPO = pair_table.REPO


def blocks(name: str, repo: Path = REPO) -> list[re.Match[str]]:
    return list(pair_table.BLOCK.finditer((repo / name).read_text()))


def test_the_pages_show_what_the_raw_files_give():
    stale = pair_table.stale_pages()
    assert not stale, "\n\n".join(stale.values()) + "\nrewrite with: python -m bench.pair_table --write"


def test_readme_and_the_benchmark_pages_quote_one_series():
    found = {name: {m["name"]: m for m in blocks(name)} for name in pair_table.PAGES}
    current = {name: by_name[pair_table.CURRENT] for name, by_name in found.items()}
    assert {name: m["kind"] for name, m in current.items()} == {
        "README.md": "headline",
        "docs/benchmarks/README.md": "headline",
        "docs/benchmarks/gpu.md": "table",
    }
    assert len({m["args"] for m in current.values()}) == 1, "the pages quote different runs"
    headline = current["README.md"]["body"]
    assert re.search(r"\*\*\d\.\d{3}×\*\*", headline), headline  # a ratio, as the table gives it
    assert all(headline in m["body"] for m in current.values())


def test_the_gpu_page_opens_with_the_table():
    text = (REPO / "docs/benchmarks/gpu.md").read_text()
    results = text.index("\n## Results\n")
    first = pair_table.BLOCK.search(text)
    assert first is not None and first["name"] == pair_table.CURRENT
    between = text[results : first.start()].strip().splitlines()
    assert [line for line in between if line and not line.startswith("#")] == [], between
    assert text.index("\n## ") == results, "a section stands before the results"


@pytest.fixture
def copy_of_pages(tmp_path: Path) -> Path:
    """The pages in a scratch repository whose raw files are the real ones."""
    for name in pair_table.PAGES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench/results").symlink_to(REPO / "bench/results")
    return tmp_path


def test_a_figure_changed_by_hand_is_found(copy_of_pages: Path):
    readme = copy_of_pages / "README.md"
    body = blocks("README.md", copy_of_pages)[0]["body"]
    ratio = re.search(r"\*\*(\d\.\d{3})×\*\*", body)
    assert ratio is not None
    readme.write_text(readme.read_text().replace(body, body.replace(ratio[1], "0.300", 1)))
    stale = pair_table.stale_pages(copy_of_pages)
    assert list(stale) == ["README.md"]
    diff = stale["README.md"].splitlines()
    assert any(line.startswith("-") and "**0.300×**" in line for line in diff), diff
    assert any(line.startswith("+") and f"**{ratio[1]}×**" in line for line in diff), diff


def test_writing_new_runs_changes_the_current_blocks_only(copy_of_pages: Path):
    deferred_before = {m["name"]: m.group(0) for m in blocks("docs/benchmarks/gpu.md", copy_of_pages)}
    run = "bench/results/pair-2e9977d-0.json"
    pair_table.write_pages(run, copy_of_pages)
    assert not pair_table.stale_pages(copy_of_pages)
    for name in pair_table.PAGES:
        current = {m["name"]: m for m in blocks(name, copy_of_pages)}[pair_table.CURRENT]
        assert current["args"] == run
        assert "**0.336×**" in current["body"] and "(1 pair)" in current["body"]
    after = {m["name"]: m.group(0) for m in blocks("docs/benchmarks/gpu.md", copy_of_pages)}
    assert after["deferred"] == deferred_before["deferred"]
    assert after[pair_table.CURRENT] != deferred_before[pair_table.CURRENT]


def test_the_command_line_stores_its_runs_relative_to_the_repository():
    args = pair_table.parser().parse_args(
        [str(REPO / "bench/results/pair-e70b707-0.json"), "--machine", "pair-e70b707-0.json=first machine"]
    )
    stored = pair_table.stored_args(args)
    assert stored == "bench/results/pair-e70b707-0.json '--machine=pair-e70b707-0.json=first machine'"
    parsed = pair_table.block_args(stored)
    assert parsed.runs == [REPO / "bench/results/pair-e70b707-0.json"]
    assert parsed.machine == ["pair-e70b707-0.json=first machine"]
