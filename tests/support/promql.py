"""PromQL the way Prometheus reads it, for tests: Prometheus' own parser (tests/support/promql-selectors, built from
its Go module by the build.sh there and cached) lists the series selectors of an expression, and `matching`
tells which scraped samples a selector picks (the label matchers' semantics: regexes are anchored)."""

from __future__ import annotations

import json
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


@cache
def selectors_binary() -> Path:
    result = subprocess.run(
        ["bash", str(REPO / "tests" / "support" / "promql-selectors" / "build.sh")],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"building promql-selectors failed:\n{result.stderr}")
    return Path(result.stdout.strip().splitlines()[-1])


def selectors(exprs: list[str]) -> list[dict[str, Any]]:
    """For each expression: {"expr", "error" (when it does not parse), "selectors": [[matcher, ...], ...]}, each
    matcher {"name", "type" ("=", "!=", "=~", "!~"), "value"}; the metric name is the matcher on `__name__`."""
    result = subprocess.run(
        [str(selectors_binary())], input=json.dumps(exprs), capture_output=True, text=True, check=True
    )
    parsed: list[dict[str, Any]] = json.loads(result.stdout)
    return parsed


def _matches(matcher: dict[str, str], labels: dict[str, str]) -> bool:
    value = labels.get(matcher["name"], "")
    kind, wanted = matcher["type"], matcher["value"]
    if kind == "=":
        return value == wanted
    if kind == "!=":
        return value != wanted
    found = re.fullmatch(wanted, value) is not None
    return found if kind == "=~" else not found


def matching(selector: list[dict[str, str]], samples: list[tuple[str, dict[str, str], float]]) -> list[Any]:
    """The samples (name, labels, value) that every matcher of `selector` accepts."""
    return [sample for sample in samples if all(_matches(m, {**sample[1], "__name__": sample[0]}) for m in selector)]


def scraped_samples(exposition: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a Prometheus text exposition, as (series name, labels, value)."""
    from prometheus_client.parser import text_string_to_metric_families

    return [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    ]
