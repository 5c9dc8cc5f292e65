"""kopf.run with every handler of the operator: what `colocgrpo-operator` runs once it leads.

Importing this module imports kopf and registers the handlers (handlers.py, and through it the
startup, login and cleanup ones of startup.py).
"""

from __future__ import annotations

import asyncio
import threading

import kopf

from colocgrpo_operator.kopf_glue import handlers  # noqa: F401  (registers the handlers)
from colocgrpo_operator.kopf_glue.config import OperatorConfig
from colocgrpo_operator.kopf_glue.namespaces import new_insights
from colocgrpo_operator.kube.credentials import Credentials


def run_kopf(
    config: OperatorConfig, credentials: Credentials, loop: asyncio.AbstractEventLoop, ready_flag: threading.Event
) -> None:
    """Run kopf with the operator's handlers on `loop` until it stops. `ready_flag` is set once the
    startup handlers are done and kopf watches.

    No kopf peering: leader election (kube/leadership.py) decides who reconciles. The startup and
    login handlers (startup.py) read `config` and `credentials` from kopf's memo, and the namespace
    rescan (namespaces.py) shares kopf's Insights.
    """
    # kopf's view of which namespaces to serve, shared with the namespace rescan that adds the
    # ones kopf's own observer can miss (namespaces.py).
    insights = new_insights()
    kopf.run(
        loop=loop,
        standalone=True,  # no kopf peering: leader election decides who reconciles
        clusterwide=config.clusterwide,
        namespaces=list(config.namespaces),
        ready_flag=ready_flag,
        insights=insights,
        # Read by the startup and login handlers (startup.py).
        memo=kopf.Memo(config=config, credentials=credentials, insights=insights),
    )
