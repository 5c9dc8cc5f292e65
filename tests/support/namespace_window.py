"""`colocgrpo-operator` with kopf's namespace-observer window held open, for the race test.

kopf's namespace observer lists the namespaces, then starts a watch that lists them again and
drops that second listing's events (kopf_glue/namespaces.py). This runner wraps kopf's
`queueing.watcher` so that, for the namespaces resource only, it first creates the file
$COLOCGRPO_NAMESPACE_WINDOW.open and then waits until $COLOCGRPO_NAMESPACE_WINDOW.close exists:
a test creates its namespace in between, exactly inside the window, every time.

Run as `python -m support.namespace_window <colocgrpo-operator arguments>`.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

WINDOW_ENV = "COLOCGRPO_NAMESPACE_WINDOW"


def hold_the_window(base: Path) -> None:
    from kopf._core.reactor import queueing

    original = queueing.watcher

    async def watcher(*, resource: Any, **kwargs: Any) -> None:
        if resource.group == "" and resource.plural == "namespaces":
            base.with_suffix(".open").touch()
            while not base.with_suffix(".close").exists():
                await asyncio.sleep(0.05)
        await original(resource=resource, **kwargs)

    queueing.watcher = watcher  # type: ignore[assignment]


def main(argv: list[str]) -> int:
    from colocgrpo_operator.daemon import keep_out_unused_clients
    from colocgrpo_operator.daemon import main as operator_main

    keep_out_unused_clients()  # before kopf is imported, as `colocgrpo-operator` does
    hold_the_window(Path(os.environ[WINDOW_ENV]))
    return operator_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
