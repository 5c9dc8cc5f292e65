"""Lines every rank of a pod writes to the stream they share, each in one write.

The ranks of a pod share its stdout and stderr, and the pods run Python unbuffered, where `print` writes a text and
its newline apart: two ranks announcing the same verdict or the same stop at the same moment then merge into one line
and an empty one, in `kubectl logs` and for anything that reads them line by line. One write of up to PIPE_BUF bytes
(4 KiB on Linux) to a pipe is never interleaved with another.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TextIO


def say_line(text: str, stream: TextIO | None = None) -> None:
    """Write `text` and its newline to `stream` (default stdout) in one write, after what Python still holds for it.

    A stream without a file descriptor (a test's captured stream) gets a plain `print`."""
    stream = sys.stdout if stream is None else stream
    with contextlib.suppress(Exception):
        stream.flush()
    data = (text + "\n").encode(errors="replace")
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        print(text, file=stream, flush=True)
        return
    while data:  # a pipe takes all of a line this short at once; a partial write goes on where it stopped
        try:
            written = os.write(fd, data)
        except OSError:
            return
        data = data[written:]
