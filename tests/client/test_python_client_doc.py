"""docs/python-client.md's example is true to the client: its imports resolve, its job is valid and planned
offline as written, and every call it shows is a method of ColocGRPOClient (or of what one returns)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from colocgrpo_operator.api import parse_job
from colocgrpo_operator.client import ColocGRPOClient, JobState, LogLine, Progress

PAGE = Path(__file__).resolve().parents[2] / "docs" / "python-client.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)


def test_every_import_of_the_examples_resolves():
    for block in blocks():
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom) and node.module:
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name), f"{node.module}.{alias.name}"


def test_the_examples_job_is_valid_and_planned_as_written():
    first = blocks()[0]
    offline = first.split("client = ColocGRPOClient", 1)[0]  # everything before the cluster
    scope: dict = {}
    exec(compile(offline, str(PAGE), "exec"), scope)  # builds the job and prints its plan
    job = scope["job"]
    assert parse_job(job.to_dict()).spec.resources.gpus_per_node == 8
    assert job.to_dict()["spec"]["vllm"]["tensorParallelSize"] == 2


def test_every_call_the_page_names_exists():
    text = PAGE.read_text()
    calls = set(re.findall(r"client\.(\w+)\(", text)) | set(re.findall(r"^\| `(\w+)\(", text, flags=re.M))
    calls |= {name for pair in re.findall(r"^\| `(\w+)\(name\)`, `(\w+)\(name\)`", text, flags=re.M) for name in pair}
    assert {"submit", "wait", "progress", "logs", "all_logs", "get", "list", "delete", "suspend", "resume"} <= calls
    for name in calls:
        assert callable(getattr(ColocGRPOClient, name, None)), name
    for name in re.findall(r"`(\w+)`", text.split("`JobState` (from", 1)[1].split("\n\n", 1)[0]):
        assert hasattr(JobState, name) or name in ("get", "list", "wait", "watch", "object", "ColocGRPOJob"), name
    assert {"prefixed", "notice", "rank", "pod", "text"} <= set(dir(LogLine)) | set(LogLine.__dataclass_fields__)
    assert {"step", "max_steps", "reward", "metrics", "reward_history"} <= set(Progress.__dataclass_fields__)
