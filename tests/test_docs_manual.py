"""The repository reads as a manual, not a log: no text names a machine by letter, cites an issue by number,
counts device time or plans the next measurement. Checked over every file git tracks or would track, but the
raw benchmark records (`bench/results/`, kept as they were written) and this file, which lists the
patterns."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RAW = "bench/results/"

# What a log says and a manual does not, with why each is out of place.
PATTERNS = {
    r"\b[Mm]achines? [A-F]\b": "a machine named by letter: describe it by what was measured about it",
    r"\b[Ii]ssues? #?[0-9]+": "an issue number: say what the thing is, not where it was asked for",
    r"\b[Dd]evice[- ](time|budget)\b": "a device budget: how much machine time a session had is not a result",
    r"\bbudget_left\b|\bGPU budget\b|\bGPU time (is|was) (scarce|left|spent)\b": "a device budget",
    r"\b[Nn]ext (GPU|device|session)\b|\bGPU session\b": "a plan for the next measurement",
    r"\b(is|are) due next\b|\bnext (GPU )?visit\b": "a plan for the next measurement",
}


def checked_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    me = Path(__file__).resolve().relative_to(REPO).as_posix()
    return [REPO / name for name in listed if name and not name.startswith(RAW) and name != me]


def findings(text: str) -> list[str]:
    """`line: matched text (why)` for every pattern found in `text`."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, why in PATTERNS.items():
            for match in re.finditer(pattern, line):
                found.append(f"{number}: {match.group(0)!r} ({why})")
    return found


def test_the_checked_files_include_the_docs_the_bench_and_the_code():
    names = {path.relative_to(REPO).as_posix() for path in checked_files()}
    for expected in ("README.md", "CHANGELOG.md", "docs/benchmarks/gpu.md", "bench/pair_table.py"):
        assert expected in names
    assert any(name.startswith("operator/") for name in names) and any(name.startswith("training/") for name in names)
    assert not any(name.startswith(RAW) for name in names)


@pytest.mark.parametrize(
    "line",
    [
        "ran on machine C, after the four above",
        "Machines A and B ran commit e70b707",
        "and issue #21 stays open on it",
        "Issue 33 asks for it",
        "with too little of the session's device time left",
        "the next GPU session starts with PARTS=integrity",
        "what is due next",
    ],
)
def test_a_log_line_is_found(line):
    assert findings(line), line


@pytest.mark.parametrize(
    "line",
    [
        "A profile showed 1.0 s of GPU time in a step of 3.5 s",
        "the machine with boot id fe7e38b2, 16 cores",
        "pytorch/pytorch#190489 tracks the abort",
        "a skipped contender: skipped (time budget)",
        "machine-readable reasons",
    ],
)
def test_a_manual_line_is_not(line):
    assert not findings(line), line


def test_no_file_reads_as_a_log():
    problems = []
    for path in checked_files():
        try:
            text = path.read_text()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary files, and files deleted in the working tree
        problems += [f"{path.relative_to(REPO)}:{found}" for found in findings(text)]
    assert not problems, "\n".join(problems)
