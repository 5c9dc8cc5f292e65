"""A TCP relay from the real node's link to the API server on loopback.

The dev cluster's API server listens on 127.0.0.1 only. The real node (kubelet, kube-proxy) and its pods
live in a network namespace of their own, joined to this machine by one veth link; they reach the API
server at the host end of that link, where this relay listens and passes every connection on, bytes
unchanged (TLS goes end to end), to the API server's loopback address. It listens on that one address of
the link, never on the machine's other interfaces.

    python -m colocgrpo_dev.cluster.node.relay LISTEN_HOST PORT TARGET_HOST TARGET_PORT
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(ConnectionError, OSError):
            if writer.can_write_eof():
                writer.write_eof()


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError, OSError):
        await writer.wait_closed()


async def relay(listen_host: str, listen_port: int, target_host: str, target_port: int) -> None:
    """Serve until SIGTERM or SIGINT: each accepted connection is joined to a new one to the target."""

    async def serve(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            target_reader, target_writer = await asyncio.open_connection(target_host, target_port)
        except OSError:
            await _close(client_writer)
            return
        await asyncio.gather(_pipe(client_reader, target_writer), _pipe(target_reader, client_writer))
        await _close(client_writer)
        await _close(target_writer)

    server = await asyncio.start_server(serve, listen_host, listen_port, reuse_address=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    listen_host, listen_port, target_host, target_port = args
    asyncio.run(relay(listen_host, int(listen_port), target_host, int(target_port)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
