"""Running the cluster's command-line tools with errors that say what went wrong."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence


class CommandFailed(subprocess.CalledProcessError):
    """CalledProcessError whose message carries the tool's own output (kubectl/kwokctl errors)."""

    def __str__(self) -> str:
        output = "\n".join(part.strip() for part in (self.stderr, self.output) if part and part.strip())
        return f"{' '.join(map(str, self.cmd))} exited {self.returncode}:\n{output}"


def run(
    cmd: Sequence[str],
    *,
    input: str | None = None,
    check: bool = True,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(cmd), input=input, capture_output=True, text=True, env=env)
    if check and done.returncode:
        raise CommandFailed(done.returncode, done.args, done.stdout, done.stderr)
    return done
