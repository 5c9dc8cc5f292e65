"""Reading ColocGRPOJob manifests from files (or stdin) with errors a user can act on."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from colocgrpo_operator.api.model import CLUSTER_RUNTIME_KIND, RUNTIME_KIND, ColocGRPOJob
from colocgrpo_operator.api.runtime import RuntimeKey, runtimes_by_key, with_runtime
from colocgrpo_operator.api.validation import JobSpecError, parse_job


class ManifestError(ValueError):
    """The file cannot be read or is not YAML; the message names the file."""


def describe_yaml_error(error: yaml.YAMLError) -> str:
    """'invalid YAML (line L, column C): problem' on one line (PyYAML's own text spans several)."""
    mark = getattr(error, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
    problem = getattr(error, "problem", None) or str(error)
    return f"invalid YAML{where}: {problem}"


def load_documents(path: str) -> list[Any]:
    """All YAML documents in PATH ('-' is stdin), skipping empty ones."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as error:
        raise ManifestError(f"{path}: cannot read: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise ManifestError(f"{path}: not a text file") from None
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as error:
        raise ManifestError(f"{path}: {describe_yaml_error(error)}") from None
    if not documents:
        raise ManifestError(f"{path}: no YAML documents")
    return documents


def read_runtimes(paths: list[str]) -> tuple[dict[RuntimeKey, dict[str, Any]], list[str]]:
    """The (Cluster)ColocGRPORuntimes in PATHS, by (kind, name), and one printable line per unreadable file."""
    runtimes: dict[RuntimeKey, dict[str, Any]] = {}
    problems = []
    for path in paths:
        try:
            runtimes.update(runtimes_by_key(load_documents(path)))
        except ManifestError as error:
            problems.append(f"error: {error}")
    return runtimes, problems


def read_jobs(
    path: str, namespace: str | None = None, runtimes: dict[RuntimeKey, dict[str, Any]] | None = None
) -> tuple[list[tuple[str, ColocGRPOJob]], list[str]]:
    """The valid ColocGRPOJobs in PATH and one printable line per problem.

    Each job comes with its label: PATH, or PATH[i] when the file holds several documents.
    Problems are `error: ...` for a file that cannot be read, else `<label>: <field path>: ...`
    for every bad field of every invalid document. NAMESPACE fills in metadata.namespace
    where a document leaves it unset. A job that names a runtime (spec.runtimeRef) is merged with
    it (api/runtime.py): one of RUNTIMES, or a runtime document in PATH itself, which is not a job.
    """
    try:
        documents = load_documents(path)
    except ManifestError as error:
        return [], [f"error: {error}"]
    jobs: list[tuple[str, ColocGRPOJob]] = []
    problems: list[str] = []
    known = {**(runtimes or {}), **runtimes_by_key(documents)}
    for index, document in enumerate(documents):
        label = path if len(documents) == 1 else f"{path}[{index}]"
        if isinstance(document, dict) and document.get("kind") in (RUNTIME_KIND, CLUSTER_RUNTIME_KIND):
            continue
        if namespace and isinstance(document, dict) and isinstance(document.get("metadata"), dict):
            document["metadata"].setdefault("namespace", namespace)
        try:
            jobs.append((label, parse_job(with_runtime(document, known))))
        except JobSpecError as error:
            problems.extend(f"{label}: {line}" for line in error.lines())
    return jobs, problems


class _ReadableDumper(yaml.SafeDumper):
    """Multi-line strings (embedded config files, system prompts) as literal blocks."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_ReadableDumper.add_representer(str, _represent_str)


def dump_documents(objects: list[Any]) -> str:
    return yaml.dump_all(objects, Dumper=_ReadableDumper, sort_keys=False, width=120, allow_unicode=True)
