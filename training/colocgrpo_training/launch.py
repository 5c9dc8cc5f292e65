"""`colocgrpo-launch ARGS` (also `python -m colocgrpo_training.launch`): `accelerate launch ARGS`, ending with the
exit code the ranks agreed on.

The pod command of every job that runs more than one process. accelerate's launcher ends with 1 whenever a rank
ends with anything but 0, and with a traceback when the pod's SIGTERM reaches it (torch's elastic agent stops the
ranks, then raises), so the pod's exit code would not say what its ranks agreed on: that they stopped at a
checkpoint because of a SIGTERM (143, a preemption), or that the config is invalid (2). Each rank records the code
it exits with (`record_exit_code`, which `entrypoint.exit_process` calls) in a folder this launcher names for it;
when the launcher failed and every rank of this pod recorded the same code, the pod exits with that code.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path
from typing import NoReturn

EXIT_CODES_ENV = "COLOCGRPO_EXIT_CODES_DIR"


def record_exit_code(code: int) -> None:
    """Record this rank's exit code for the launcher of its pod (nothing without a launcher's folder)."""
    folder = os.environ.get(EXIT_CODES_ENV)
    if not folder:
        return
    rank = os.environ.get("LOCAL_RANK", "0")
    record = {"code": code, "localWorldSize": int(os.environ.get("LOCAL_WORLD_SIZE", "1"))}
    path = Path(folder) / f"rank-{rank}.json"
    try:
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(record))
        partial.replace(path)  # the launcher never reads half a record
    except OSError:
        pass  # the pod then exits with the launcher's own code


def agreed_exit_code(folder: Path) -> int | None:
    """The code every rank of the pod recorded, or None when one did not record (it was killed) or they differ."""
    records = []
    for path in sorted(folder.glob("rank-*.json")):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            return None
    codes = {record.get("code") for record in records}
    sizes = {record.get("localWorldSize") for record in records}
    if len(codes) != 1 or sizes != {len(records)}:
        return None
    (code,) = codes
    return code if isinstance(code, int) else None


def _accelerate_launch(argv: list[str]) -> int:
    """`accelerate launch ARGV` in this process (torch's elastic agent runs here, as under `accelerate launch`)."""
    from accelerate.commands.launch import launch_command, launch_command_parser

    args = launch_command_parser().parse_args(argv)
    try:
        launch_command(args)
    except SystemExit as error:
        return error.code if isinstance(error.code, int) else (0 if error.code is None else 1)
    except Exception:  # a rank failed (ChildFailedError), or the pod's SIGTERM stopped the agent (SignalException)
        traceback.print_exc()
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run `accelerate launch` with `argv` (default: the process's arguments) and return the pod's exit code."""
    folder = Path(tempfile.mkdtemp(prefix="colocgrpo-exit-codes-"))
    os.environ[EXIT_CODES_ENV] = str(folder)  # inherited by every rank
    try:
        code = _accelerate_launch(sys.argv[1:] if argv is None else argv)
        agreed = agreed_exit_code(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if code != 0 and agreed is not None and agreed != code:
        print(f"colocgrpo-launch: every rank exited {agreed}; so does the pod (the launcher ended with {code})",
              file=sys.stderr, flush=True)  # fmt: skip
        return agreed
    return code


def console_main() -> NoReturn:
    """The `colocgrpo-launch` console script."""
    sys.exit(main())


if __name__ == "__main__":
    console_main()
