"""The operator's probes, served from a thread for the process's whole life (standby included).

- `GET /healthz` (liveness): 200 while the process works: a standby, or an operator whose event
  loop answers within LOOP_TIMEOUT_SECONDS (a stuck loop is what kopf's own liveness endpoint
  detects; this one does the same, and also answers before kopf starts and while standing by).
- `GET /readyz` (readiness): 200 `active` once kopf has started on the replica that holds the
  Lease (or on the only replica, without leader election); 200 `standby: ...` on a replica that
  has read the Lease and waits to take over; 503 otherwise (still starting, or the API server
  cannot be reached). A standby counts as ready on purpose: an unready standby would hold every
  rolling update and `helm install --wait` forever, and "which replica reconciles" is the Lease's
  holderIdentity (and the `colocgrpo_leader` gauge), not a probe's business.
"""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from colocgrpo_operator.kube.leadership import LeaderElector

LOOP_TIMEOUT_SECONDS = 5.0


class Probes:
    """What the probe endpoints report; the CLI fills it in as the operator starts."""

    def __init__(self, elector: LeaderElector | None):
        self.elector = elector
        self.loop: asyncio.AbstractEventLoop | None = None  # kopf's, once it runs
        self.started = threading.Event()  # kopf's ready_flag: startup handlers done, watching

    def liveness(self) -> tuple[int, str]:
        loop = self.loop
        if loop is None or loop.is_closed() or not loop.is_running():
            return 200, "ok"
        try:
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(LOOP_TIMEOUT_SECONDS)
        except Exception:
            return 503, f"the event loop did not answer within {LOOP_TIMEOUT_SECONDS:g} s"
        return 200, "ok"

    def readiness(self) -> tuple[int, str]:
        elector = self.elector
        if elector is None:
            return (200, "active") if self.started.is_set() else (503, "starting")
        where = f"Lease {elector.namespace}/{elector.name}"
        if elector.state == "leading":
            text = f"the {where} is held by {elector.identity}"
            return (200, f"active: {text}") if self.started.is_set() else (503, f"starting: {text}")
        if elector.state == "standby":
            if not elector.reachable:
                return 503, f"standby: the {where} cannot be read yet"
            return 200, f"standby: the {where} is held by {elector.holder or 'no one'}"
        return 503, f"leader election {elector.state}"


def serve_probes(probes: Probes, port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Serve /healthz and /readyz on `port` in a daemon thread; shutdown() stops it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                code, text = probes.liveness()
            elif path == "/readyz":
                code, text = probes.readiness()
            else:
                code, text = 404, "not found (try /healthz or /readyz)"
            payload = (text + "\n").encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: no access log
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="colocgrpo-probes", daemon=True).start()
    return server
