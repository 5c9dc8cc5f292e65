"""Local TCP ports for the processes the developer tools, the tests and the benchmarks start."""

from __future__ import annotations

import socket
import threading

_LOCK = threading.Lock()
_GIVEN: set[int] = set()


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now and that this process has not handed out before.

    The kernel picks it (bind to port 0), so it is free at the moment of asking; remembering what was
    handed out keeps two callers in one process (concurrent chaos workers, an operator's liveness and
    metrics ports) from ever getting the same one, which the kernel alone does not promise once the probe
    socket is closed.
    """
    with _LOCK:
        while True:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port: int = sock.getsockname()[1]
            if port not in _GIVEN:
                _GIVEN.add(port)
                return port
