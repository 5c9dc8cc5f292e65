"""Reading ColocGRPOJob manifests from files (or stdin) with errors a user can act on."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml


class ManifestError(ValueError):
    """The file cannot be read or is not YAML; the message names the file."""


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
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise ManifestError(f"{path}: invalid YAML{where}: {problem}") from None
    if not documents:
        raise ManifestError(f"{path}: no YAML documents")
    return documents


class _ReadableDumper(yaml.SafeDumper):
    """Multi-line strings (embedded config files, system prompts) as literal blocks."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_ReadableDumper.add_representer(str, _represent_str)


def dump_documents(objects: list[Any]) -> str:
    return yaml.dump_all(objects, Dumper=_ReadableDumper, sort_keys=False, width=120, allow_unicode=True)
