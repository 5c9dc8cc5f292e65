"""Leader election: of several operator replicas, one reconciles; the others wait to take over.

A coordination.k8s.io/v1 Lease, the way client-go's leaderelection does it (kopf's peering is
not leader election: with equal priorities every peer pauses):

- a candidate takes the Lease when it is free or its holder has not renewed it for
  `lease_duration` seconds *as this candidate observed it* (the time of the last change it saw,
  on its own clock: no clock skew between replicas matters), by an update carrying the Lease's
  resourceVersion, so two candidates can never both win (the loser gets a 409);
- the holder renews it every `retry_period`; a holder that has not renewed for `renew_deadline`
  (< lease_duration) stops at once, before anyone else can take over, so two replicas never
  reconcile at the same time;
- a holder that stops on purpose releases the Lease, so a standby takes over within one retry
  period instead of a lease duration.

Runs in a thread of its own with its own one-connection client: the renewal must not queue
behind the operator's busy API threads or a blocked event loop.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from colocgrpo_operator.kube.client import KubeApi, KubeApiError
from colocgrpo_operator.metrics import LEADER

LEASE_PATH = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
log = logging.getLogger("colocgrpo.operator.leadership")


def default_identity() -> str:
    """The pod's name (HOSTNAME in a pod) plus a random suffix: a restarted container is a new
    candidate, never mistaken for the holder it replaced."""
    return f"{os.environ.get('HOSTNAME') or socket.gethostname()}-{uuid.uuid4().hex[:6]}"


def _micro_time(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Timing:
    lease_duration: float = 15.0  # how long a standby waits for a silent holder
    renew_deadline: float = 10.0  # how long a holder keeps trying to renew before it stops
    retry_period: float = 2.0  # how often candidates look and holders renew

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("leader election needs 0 < retry period < renew deadline < lease duration")


class LeaderElector:
    """Acquire, keep and release one Lease. `state` is "standby", "leading" or "stopped"; `holder`
    the identity last seen holding the Lease.

    Args:
        kube: a client of its own (a one-connection pool is enough).
        namespace, name: the Lease.
        identity: this candidate's holderIdentity.
        timing: lease duration, renew deadline, retry period.
        on_lost: called (from the elector's thread) when leadership is lost; it must stop all
            reconciling at once (the CLI exits the process).
    """

    def __init__(
        self,
        kube: KubeApi,
        namespace: str,
        name: str,
        identity: str,
        timing: Timing,
        on_lost: Callable[[str], None],
    ):
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timing = timing
        self.on_lost = on_lost
        self.state = "standby"
        self.holder: str | None = None
        self.reachable = False  # the Lease could be read (or created) at least once
        self.leading = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # (the Lease's record as last seen, when it was seen to change, on our monotonic clock)
        self._observed: tuple[tuple[Any, ...], float] | None = None
        self._renewed = 0.0  # monotonic time of our last successful renewal

    @property
    def path(self) -> str:
        return f"{LEASE_PATH.format(namespace=self.namespace)}/{self.name}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="colocgrpo-leader-election", daemon=True)
        self._thread.start()

    def wait_until_leading(self, timeout: float | None = None) -> bool:
        return self.leading.wait(timeout)

    def stop(self, release: bool = True) -> None:
        """Stop electing; a holder gives the Lease up (a standby can take it at once)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timing.retry_period + 5)
        if release and self.state == "leading":
            self._release()
        self.state = "stopped"
        LEADER.set(0)

    # -- the loop (elector thread) --------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._round()
            except Exception as error:  # never let the elector die silently
                log.warning("leader election round failed: %s", error)
            if self.state == "leading" and time.monotonic() - self._renewed > self.timing.renew_deadline:
                self._lose(f"could not renew the Lease for {self.timing.renew_deadline:g} s")
                return
            if self.state == "lost":
                return
            self._stop.wait(self.timing.retry_period)

    def _round(self) -> None:
        lease = self._get()
        now = time.monotonic()
        if lease is None:
            self._create()
            return
        self.reachable = True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or None
        record = (holder, spec.get("renewTime"), spec.get("acquireTime"), spec.get("leaseDurationSeconds"))
        if self._observed is None or self._observed[0] != record:
            self._observed = (record, now)
        self.holder = holder
        if self.state == "leading":
            if holder != self.identity:
                self._lose(f"the Lease is held by {holder!r} now")
                return
            self._update(lease, renew_only=True)
            return
        duration = float(spec.get("leaseDurationSeconds") or self.timing.lease_duration)
        if holder and now - self._observed[1] < duration:
            return  # held and alive: stay standby (no write)
        self._update(lease, renew_only=False)

    def _get(self) -> dict[str, Any] | None:
        try:
            return self.kube.request("GET", self.path)
        except KubeApiError as error:
            if error.status == 404:
                return None
            raise

    def _spec(self, transitions: int, acquired: datetime | None) -> dict[str, Any]:
        now = datetime.now(UTC)
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": round(self.timing.lease_duration),
            "acquireTime": _micro_time(acquired or now),
            "renewTime": _micro_time(now),
            "leaseTransitions": transitions,
        }

    def _create(self) -> None:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": self._spec(0, None),
        }
        try:
            self.kube.request("POST", LEASE_PATH.format(namespace=self.namespace), body=body)
        except KubeApiError as error:
            if error.status == 409:
                return  # another candidate was faster: look again next round
            raise
        self.reachable = True
        self._became_leader()

    def _update(self, lease: dict[str, Any], renew_only: bool) -> None:
        spec = lease.get("spec") or {}
        if renew_only:
            acquired = _parse_micro_time(spec.get("acquireTime"))
            transitions = int(spec.get("leaseTransitions") or 0)
        else:
            acquired = None
            transitions = int(spec.get("leaseTransitions") or 0) + (1 if spec.get("holderIdentity") else 0)
        body = {**lease, "spec": self._spec(transitions, acquired)}  # metadata keeps its resourceVersion
        try:
            self.kube.request("PUT", self.path, body=body)
        except KubeApiError as error:
            if error.status == 409:
                return  # changed since we read it (renewed or taken): look again next round
            raise
        if renew_only:
            self._renewed = time.monotonic()
        else:
            self._became_leader()

    def _became_leader(self) -> None:
        self._renewed = time.monotonic()
        self.state = "leading"
        self.holder = self.identity
        log.info(
            "acquired the Lease %s/%s as %s: this replica reconciles now", self.namespace, self.name, self.identity
        )
        self.leading.set()

    def _lose(self, why: str) -> None:
        self.state = "lost"
        self.leading.clear()
        LEADER.set(0)
        log.error("lost the Lease %s/%s (%s): stopping", self.namespace, self.name, why)
        self.on_lost(why)

    def _release(self) -> None:
        """Give the Lease up (holderIdentity empty), if it is still ours."""
        try:
            lease = self._get()
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            spec = dict(lease.get("spec") or {}, holderIdentity="", leaseDurationSeconds=1)
            self.kube.request("PUT", self.path, body={**lease, "spec": spec})
            log.info("released the Lease %s/%s", self.namespace, self.name)
        except Exception as error:  # the standby then takes over after the lease duration
            log.warning("could not release the Lease %s/%s: %s", self.namespace, self.name, error)


def _parse_micro_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
