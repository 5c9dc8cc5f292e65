"""Kueue's Workloads are watched where Kueue is installed, and its absence is no warning.

The operator registers its Workload handlers (kopf_glue/handlers.py) whether or not Kueue's
CRDs exist: kopf rescans API discovery on every CRD event and starts serving a registered resource
once its CRD appears, so installing Kueue after the operator needs no restart. Until then kopf
logs "Unresolved resources cannot be served (try creating their CRDs)" at WARNING, at start and
again on every CRD change in the cluster. Without Kueue that is the expected state, not a problem:
`AbsentKueueFilter` says so once at INFO and keeps kopf's repetitions at DEBUG. A warning that
names any other resource (the ColocGRPOJob CRD missing, say) is left as kopf logs it.
"""

from __future__ import annotations

import logging
import re

# No version: kopf serves the preferred one (v1beta2 since Kueue 0.15, v1beta1 before); the fields
# read (owner, conditions) are the same in both.
KUEUE_WORKLOADS = ("kueue.x-k8s.io", "workloads")

# kopf._core.reactor.observation's line about handlers whose resource discovery does not show.
_KOPF_LOGGER = "kopf._core.reactor.observation"
_UNRESOLVED = "Unresolved resources cannot be served (try creating their CRDs): "
_SELECTOR = re.compile(r"Selector\(([^)]*)\)")


def names_only_kueue(message: str) -> bool:
    """Whether `message` is kopf's unresolved-resources warning about Kueue's resources alone."""
    if not message.startswith(_UNRESOLVED):
        return False
    selectors = _SELECTOR.findall(message[len(_UNRESOLVED) :])
    return bool(selectors) and all(f"group='{KUEUE_WORKLOADS[0]}'" in selector for selector in selectors)


class AbsentKueueFilter(logging.Filter):
    """On kopf's observation logger: its warning that Kueue's resources are not served becomes one
    INFO line of ours the first time (on `logger`), and a DEBUG line (kept only where DEBUG is
    logged) every other time. Every other record is passed on unchanged."""

    def __init__(self, logger: logging.Logger):
        super().__init__()
        self.logger = logger
        self.told = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING or not names_only_kueue(record.getMessage()):
            return True
        if not self.told:
            self.told = True
            self.logger.info(
                "Kueue's Workload API is not installed: jobs run without Kueue, and Kueue's Workloads "
                "are watched once its CRDs appear"
            )
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def install_absent_kueue_filter(logger: logging.Logger) -> None:
    """Put one `AbsentKueueFilter` on kopf's observation logger (later calls do nothing)."""
    kopf_logger = logging.getLogger(_KOPF_LOGGER)
    if not any(isinstance(f, AbsentKueueFilter) for f in kopf_logger.filters):
        kopf_logger.addFilter(AbsentKueueFilter(logger))
