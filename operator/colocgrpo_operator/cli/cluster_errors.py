"""The cluster-facing commands' flags (`--kubeconfig`, `--context`, `-n`, as kubectl names them), the
Python client they all use (`connect`), and one clean line, not a traceback, when such a command
cannot use the cluster or the job is not there.

A user with no kubeconfig, a malformed one, a failing exec plugin, the wrong context or a
stopped cluster otherwise meets a urllib3 traceback. Commands that talk to the API server wrap their
handler with `reports_cluster_errors`; these failures then exit 1, as kubectl's do, with a line
that says what to check. The client's own errors (a job that does not exist, a job that has ended)
exit 1 too, with the client's line; 2 is left to usage errors, which argparse reports.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse

    from colocgrpo_operator.client import ColocGRPOClient

# As kubectl: 1 for a refused or failed request and for an object that does not exist.
EXIT_CLUSTER_ERROR = 1
EXIT_NOT_FOUND = 1
# Who the command's writes (suspend, resume) are recorded as, in metadata.managedFields.
FIELD_MANAGER = "colocgrpo-cli"


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """`-n/--namespace`, `--kubeconfig` and `--context`, with kubectl's meanings."""
    parser.add_argument("--namespace", "-n", default=None, help="default: the kubeconfig context's namespace")
    parser.add_argument(
        "--kubeconfig", default=None, metavar="FILE", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)"
    )
    parser.add_argument(
        "--context", default=None, metavar="NAME", help="the kubeconfig context to use (default: its current one)"
    )


def connect(args: argparse.Namespace) -> ColocGRPOClient:
    """The Python client for the cluster and namespace the flags of `add_cluster_flags` name."""
    from colocgrpo_operator.client import ColocGRPOClient

    return ColocGRPOClient(
        getattr(args, "namespace", None),
        kubeconfig=args.kubeconfig,
        context=args.context,
        field_manager=FIELD_MANAGER,
    )


def describe_cluster_error(error: BaseException, kubeconfig: str | None) -> str | None:
    """The user-facing line for ERROR, or None when it is not a cluster-access problem."""
    from urllib3.exceptions import HTTPError, MaxRetryError

    from colocgrpo_operator.kube.client import KubeApiError
    from colocgrpo_operator.kube.credentials import CredentialsError

    source = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    if isinstance(error, CredentialsError):
        text = str(error)
        # Messages about a file already name it; the others get the hint which file it was.
        if text.startswith("kubeconfig ") or text.startswith("no kubeconfig"):
            return text if "--kubeconfig" in text else f"{text} (pass --kubeconfig or set KUBECONFIG)"
        return f"{text} (kubeconfig {source})"
    if isinstance(error, MaxRetryError):
        pool = getattr(error, "pool", None)
        where = f"{pool.scheme}://{pool.host}:{pool.port}" if pool is not None else "the API server"
        reason = getattr(error, "reason", None)
        detail = str(getattr(reason, "args", [""])[-1] if reason is not None and reason.args else reason or error)
        # urllib3 wraps the OS error as "<connection object>: Failed to ...": keep the readable tail.
        detail = detail.split(": ", 1)[-1] if detail.startswith("<") else detail
        return f"cannot reach the Kubernetes API server at {where} ({detail}); is the cluster up? (kubeconfig {source})"
    if isinstance(error, HTTPError):
        return f"cannot reach the Kubernetes API server: {error} (kubeconfig {source})"
    if isinstance(error, KubeApiError):
        return f"the API server refused the request: {error.status} {error.reason}: {error.message}"
    return None


def reports_cluster_errors(handler: Callable[[Any], int]) -> Callable[[Any], int]:
    """Wrap a subcommand handler whose args carry `kubeconfig`: a cluster problem or an error of the client's
    own is one `error:` line and exit 1."""

    @functools.wraps(handler)
    def wrapped(args: Any) -> int:
        from colocgrpo_operator.client import ClientError

        try:
            return handler(args)
        except ClientError as error:
            print(f"error: {error}", file=sys.stderr)
            return EXIT_NOT_FOUND
        except Exception as error:
            line = describe_cluster_error(error, getattr(args, "kubeconfig", None))
            if line is None:
                raise
            print(f"error: {line}", file=sys.stderr)
            return EXIT_CLUSTER_ERROR

    return wrapped
