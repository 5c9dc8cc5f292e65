"""`ColocGRPOClient`: ColocGRPOJobs from Python, submitted, waited for, followed and managed.

Blocking calls over the operator's own Kubernetes client (`colocgrpo_operator.kube`), with the
credentials the `colocgrpo` command uses: in a pod its ServiceAccount, else a kubeconfig (the one
named, $KUBECONFIG, ~/.kube/config) at a context (the one named, else its current one).

Waiting and following use watches, not polling: `watch` reads the job once, then one watch stream
on that one object (field-selected by name), started again from the last resourceVersion every
minute, after a 410 Gone or a cut connection (an API server that is restarting is asked again for up
to five minutes). `wait`, `progress` and `delete(wait=True)` are built on it.
"""

from __future__ import annotations

import builtins
import http.client
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import urllib3

from colocgrpo_operator.api import API_VERSION, JOB_NAME_LABEL, KIND, ColocGRPOJob, ConditionType, parse_job
from colocgrpo_operator.client.errors import (
    JobDeleted,
    JobFailed,
    JobFinished,
    JobNotFound,
    NoPodForRank,
    WaitTimeout,
)
from colocgrpo_operator.client.logs import GangLogs, log_query, pick_pod, pods_by_rank, rank_of, read_all, stream_log
from colocgrpo_operator.client.views import JobState, LogLine, Progress
from colocgrpo_operator.kube.client import KubeApi, KubeApiError, all_namespaces_path, object_path
from colocgrpo_operator.kube.transient import is_transient

if TYPE_CHECKING:
    from colocgrpo_training.planner.plan import MemoryPlan

FIELD_MANAGER = "colocgrpo-client"
# One watch request lasts at most this long; the next starts from the last version seen.
WATCH_REQUEST_SECONDS = 60
# Connections of a client: one for requests, one for a watch or a log stream at a time.
POOL_SIZE = 4
# How long a watch that was cut keeps asking an API server that does not answer (restarting, shedding load).
OUTAGE_SECONDS = 300.0


def _conditions() -> set[str]:
    return {str(item) for item in ConditionType}


class ColocGRPOClient:
    """ColocGRPOJobs on one cluster: submit, get, list, wait, follow, suspend, resume, delete.

    Args:
        namespace: where the calls look when they are not told otherwise; default: the kubeconfig
            context's namespace (in a pod: its own), else `default`.
        kubeconfig: the kubeconfig file (several joined by ':'); default: in a pod its ServiceAccount,
            else $KUBECONFIG, else ~/.kube/config.
        context: the kubeconfig context; default: its current one.
        api: an existing `KubeApi` to use instead (then `kubeconfig` and `context` are ignored).
        field_manager: the name its writes are recorded under (metadata.managedFields).

    Raises `CredentialsError` (`colocgrpo_operator.kube.credentials`) when there are no usable
    credentials. Use it as a context manager, or call `close()`, to close its connections.

    Example:
        >>> with ColocGRPOClient(namespace="team-a") as client:
        ...     client.submit(job)
        ...     final = client.wait(job.name, "Succeeded", timeout=3600)
    """

    def __init__(
        self,
        namespace: str | None = None,
        *,
        kubeconfig: str | Path | None = None,
        context: str | None = None,
        api: KubeApi | None = None,
        field_manager: str = FIELD_MANAGER,
    ):
        self.api = api or KubeApi.from_kubeconfig(
            str(kubeconfig) if kubeconfig else None, field_manager=field_manager, context=context, pool_size=POOL_SIZE
        )
        self.namespace = namespace or self.api.credentials.namespace or "default"

    def close(self) -> None:
        """Close the client's idle connections (a later call opens new ones)."""
        self.api.close()

    def __enter__(self) -> ColocGRPOClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ns(self, namespace: str | None) -> str:
        return namespace or self.namespace

    def _path(self, namespace: str | None, name: str | None = None) -> str:
        return object_path(KIND, self._ns(namespace), name)

    # -- one job ---------------------------------------------------------------------------------

    def submit(
        self, job: ColocGRPOJob | Mapping[str, Any], namespace: str | None = None, *, dry_run: bool = False
    ) -> JobState:
        """Create the job on the cluster and return it as stored (defaults filled in, uid set).

        Args:
            job: a `ColocGRPOJob` (the typed model of `colocgrpo_operator.api`) or the same as a dict
                (a parsed YAML file).
            namespace: where to create it; default: the job's metadata.namespace, else the client's.
            dry_run: let the API server check and default it without storing it (`kubectl create
                --dry-run=server`).

        Raises:
            JobSpecError: the job is invalid; `.lines()` names each field, as `colocgrpo validate` does.
                Checked before anything is sent.
            KubeApiError: the API server refused it (409: a job of that name exists).
        """
        body = job.to_dict() if isinstance(job, ColocGRPOJob) else dict(job)
        body.setdefault("apiVersion", API_VERSION)
        body.setdefault("kind", KIND)
        parse_job(body)  # raises JobSpecError naming the fields
        metadata = dict(body.get("metadata") or {})
        target = namespace or metadata.get("namespace") or self.namespace
        metadata["namespace"] = target
        body["metadata"] = {key: value for key, value in metadata.items() if value not in ({}, None)}
        body.pop("status", None)
        query = {"fieldManager": self.api.field_manager, **({"dryRun": "All"} if dry_run else {})}
        return JobState(self.api.request("POST", self._path(target), body=body, query=query) or {})

    def get(self, name: str, namespace: str | None = None) -> JobState:
        """The job as it stands now. Raises JobNotFound."""
        try:
            return JobState(self.api.request("GET", self._path(namespace, name)) or {})
        except KubeApiError as error:
            if error.status == 404:
                raise JobNotFound(self._ns(namespace), name) from None
            raise

    def list(
        self, namespace: str | None = None, *, all_namespaces: bool = False, selector: str | None = None
    ) -> list[JobState]:
        """The jobs of a namespace (the client's by default), or of every namespace, sorted by namespace and
        name; `selector` is a label selector (`team=a,tier!=test`)."""
        path = all_namespaces_path(KIND) if all_namespaces else self._path(namespace)
        listing = self.api.request("GET", path, query={"labelSelector": selector} if selector else None) or {}
        items = [JobState(item) for item in listing.get("items") or [] if isinstance(item, dict)]
        return sorted(items, key=lambda state: (state.namespace, state.name))

    def delete(
        self,
        name: str,
        namespace: str | None = None,
        *,
        wait: bool = False,
        timeout: float | None = None,
        propagation: str = "Background",
    ) -> JobState:
        """Delete the job; its children (ConfigMap, pods, ...) go with it, as their owner is gone.

        Args:
            wait: return only once the job is gone from the API server (`kubectl delete --wait`).
            timeout: give up waiting after this many seconds (WaitTimeout); None waits as long as it takes.
            propagation: Background (the default: the garbage collector deletes the children after the
                job), Foreground (the job goes last, after its children) or Orphan (the children stay).

        Returns the job as it was when deleted. Raises JobNotFound when there is none.
        """
        ns = self._ns(namespace)
        current = self.get(name, ns)
        body = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "propagationPolicy": propagation,
            "preconditions": {"uid": current.uid},
        }
        try:
            self.api.request("DELETE", self._path(ns, name), body=body)
        except KubeApiError as error:
            if error.status in (404, 409):  # gone, or another job of that name by now
                raise JobNotFound(ns, name) from None
            raise
        if wait:
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                for state in self.watch(name, ns, timeout=timeout):
                    if state.uid != current.uid:
                        break  # replaced by another job of the same name: this one is gone
            except (JobDeleted, JobNotFound):
                pass
            else:
                if deadline is not None and time.monotonic() >= deadline:
                    message = f"ColocGRPOJob {ns}/{name} is still being deleted after {timeout or 0:g} s"
                    raise WaitTimeout(current, "deleted", timeout or 0, message)
        return current

    def suspend(self, name: str, namespace: str | None = None) -> bool:
        """Suspend the job (spec.runPolicy.suspend: true): the operator deletes its pods, and `resume`
        continues from the last checkpoint. True when this call suspended it, False when it was already.
        Raises JobNotFound, or JobFinished for a job that has Succeeded or Failed."""
        return self._set_suspend(name, namespace, True)

    def resume(self, name: str, namespace: str | None = None) -> bool:
        """Resume a suspended job (spec.runPolicy.suspend: false): the operator starts its gang again.
        True when this call resumed it, False when it was not suspended. Raises JobNotFound, or
        JobFinished for a job that has Succeeded or Failed (a finished job never runs again: create it
        anew, and it resumes from its checkpoints when checkpoint.resume is auto)."""
        return self._set_suspend(name, namespace, False)

    def _set_suspend(self, name: str, namespace: str | None, suspend: bool) -> bool:
        state = self.get(name, namespace)
        where = f"ColocGRPOJob {state.namespace}/{state.name}"
        if state.finished:
            if suspend:
                raise JobFinished(state, f"{where} has already {state.phase}: there is nothing to suspend")
            raise JobFinished(
                state,
                f"{where} has already {state.phase}: a finished job does not resume (create it again to train "
                "on; with checkpoint.resume auto it starts from its last checkpoint)",
            )
        if state.suspended == suspend:
            return False
        # The uid makes the patch refuse (422) a job replaced since it was read.
        patch = {"metadata": {"uid": state.uid}, "spec": {"runPolicy": {"suspend": suspend}}}
        try:
            self.api.request(
                "PATCH",
                self._path(state.namespace, name),
                body=patch,
                query={"fieldManager": self.api.field_manager},
                content_type="application/merge-patch+json",
            )
        except KubeApiError as error:
            if error.status == 404:
                raise JobNotFound(state.namespace, name) from None
            raise
        return True

    # -- following a job -------------------------------------------------------------------------

    def watch(self, name: str, namespace: str | None = None, *, timeout: float | None = None) -> Iterator[JobState]:
        """The job now, then again each time it changes, until `timeout` seconds have passed (None: until
        the caller stops iterating). Raises JobNotFound when there is no such job, JobDeleted when it is
        deleted meanwhile. See the module for how it watches."""
        ns = self._ns(namespace)
        state = self.get(name, ns)
        yield state
        deadline = None if timeout is None else time.monotonic() + timeout
        version = state.resource_version
        query = {"fieldSelector": f"metadata.name={name}"}
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            seconds = (
                WATCH_REQUEST_SECONDS if remaining is None else max(1, min(WATCH_REQUEST_SECONDS, int(remaining) + 1))
            )
            try:
                for event in self.api.watch(self._path(ns), query, resource_version=version, timeout=seconds):
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "DELETED":
                        raise JobDeleted(ns, name)
                    if kind == "ERROR":  # 410 Gone: read the job again below
                        version = ""
                        break
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if kind in ("ADDED", "MODIFIED"):
                        state = JobState(obj)
                        yield state
                    if deadline is not None and time.monotonic() >= deadline:
                        return
            except KubeApiError as error:
                if error.status != 410:
                    raise
                version = ""
            except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError):
                version = ""  # the stream was cut (the API server restarted): read the job again below
            if not version:
                fresh = self._get_through_outage(name, ns)
                if fresh.resource_version != state.resource_version:
                    state = fresh
                    yield state
                version = fresh.resource_version

    def _get_through_outage(self, name: str, namespace: str) -> JobState:
        """The job, read again after a watch was cut: an API server that is restarting or shedding load is
        asked again, with a growing pause, for up to OUTAGE_SECONDS before its error is raised."""
        started = time.monotonic()
        attempt = 0
        while True:
            try:
                return self.get(name, namespace)
            except Exception as error:
                if not is_transient(error) or time.monotonic() - started > OUTAGE_SECONDS:
                    raise
            attempt += 1
            time.sleep(min(0.25 * 2**attempt, 5.0))

    def wait(
        self, name: str, condition: str = "Succeeded", timeout: float | None = None, namespace: str | None = None
    ) -> JobState:
        """Wait until the job's `condition` is True, as `kubectl wait --for=condition=...` does, and return the
        job then.

        Args:
            condition: a condition type: SpecValid, Queued, Suspended, Running, Stalled, Progressing,
                Succeeded, Failed or PlanWarning.
            timeout: seconds; None waits as long as it takes.

        Raises:
            WaitTimeout: the condition was not True in time (`.state` is the job as last seen).
            JobFailed: the job failed first (unless `condition` is Failed); `.state.last_failure` says why.
            JobFinished: the job succeeded without the condition becoming True.
            JobNotFound, JobDeleted: there is no such job, or it was deleted meanwhile.
            ValueError: `condition` is not a condition type.
        """
        wanted = str(condition)
        if wanted not in _conditions():
            raise ValueError(f"condition must be one of {', '.join(sorted(_conditions()))}, not {condition!r}")
        state: JobState | None = None
        for state in self.watch(name, namespace, timeout=timeout):
            if state.condition_true(wanted):
                return state
            if state.finished:
                where = f"ColocGRPOJob {state.namespace}/{state.name}"
                if state.phase == "Failed":
                    failure = state.last_failure or {}
                    detail = ": ".join(str(part) for part in (failure.get("reason"), failure.get("message")) if part)
                    raise JobFailed(state, f"{where} failed{f' ({detail})' if detail else ''} before {wanted} was True")
                raise JobFinished(state, f"{where} has {state.phase} without {wanted} becoming True")
        assert state is not None  # watch() yields the job first or raises
        raise WaitTimeout(state, wanted, timeout or 0)

    def progress(self, name: str, namespace: str | None = None, *, timeout: float | None = None) -> Iterator[Progress]:
        """The job's training progress now, then each time its phase, step, metrics or report time change,
        until the job ends (the last one has `finished` set) or `timeout` seconds pass. A watch, as
        `watch`. Raises JobNotFound, JobDeleted."""
        last: Progress | None = None
        for state in self.watch(name, namespace, timeout=timeout):
            current = state.progress()
            if current != last:
                last = current
                yield current
            if current.finished:
                return

    # -- what describe shows ------------------------------------------------------------------

    def events(self, name: str, namespace: str | None = None) -> builtins.list[dict[str, Any]]:
        """The Events (core/v1) about the job, oldest first. Raises JobNotFound."""
        state = self.get(name, namespace)
        listing = (
            self.api.request(
                "GET",
                object_path("Event", state.namespace),
                query={"fieldSelector": f"involvedObject.uid={state.uid}"},
            )
            or {}
        )
        items = [item for item in listing.get("items") or [] if isinstance(item, dict)]
        return sorted(items, key=_event_time)

    def pods(self, name: str, namespace: str | None = None) -> builtins.list[dict[str, Any]]:
        """The job's pods (every gang's that still exists), by rank and then age."""
        listing = self.api.list_objects("Pod", self._ns(namespace), f"{JOB_NAME_LABEL}={name}")
        items = [item for item in listing.get("items") or [] if isinstance(item, dict)]
        return sorted(
            items,
            key=lambda pod: (rank_of(pod) is None, rank_of(pod) or 0, pod["metadata"].get("creationTimestamp") or ""),
        )

    def plan(self, name: str, namespace: str | None = None, *, gpu_memory_gib: float | None = None) -> MemoryPlan:
        """The memory planner's verdict on the job's stored spec, what `colocgrpo plan` prints for a file:
        per-GPU memory of both phases and the recommended vllm.gpuMemoryUtilization. Raises JobNotFound,
        or the planner's PlanInputError naming the field it cannot plan from."""
        from colocgrpo_operator.render.plan_request import plan_job

        return plan_job(dict(self.get(name, namespace).object), gpu_memory_gib=gpu_memory_gib)

    # -- logs --------------------------------------------------------------------------------------

    def logs(
        self,
        name: str,
        namespace: str | None = None,
        *,
        rank: int = 0,
        follow: bool = False,
        tail: int | None = None,
        previous: bool = False,
    ) -> Iterator[str]:
        """One rank's trainer log, line by line (without newlines): the newest pod of that rank.

        Args:
            rank: the node rank (the pod's completion index).
            follow: keep yielding lines as the log grows, until the container ends.
            tail: only the last this many lines.
            previous: the previous instance of the container, after it restarted in place.

        Raises JobNotFound, NoPodForRank (the job has no pod of that rank yet), KubeApiError (the log
        cannot be read yet: the container has not started).
        """
        ns = self._ns(namespace)
        pods = self.pods(name, ns)
        pod = pick_pod(pods, rank)
        if pod is None:
            if not pods:
                self.get(name, ns)  # JobNotFound when there is no such job
            raise NoPodForRank(ns, name, rank, sorted(pods_by_rank(pods)))
        query = log_query(follow=follow, tail=tail, previous=previous)
        api = self._stream_api(1)
        try:
            yield from stream_log(api, ns, pod["metadata"]["name"], query)
        finally:
            api.close()

    def all_logs(
        self, name: str, namespace: str | None = None, *, follow: bool = False, tail: int | None = None
    ) -> Iterator[LogLine]:
        """Every rank's trainer log, interleaved, as `LogLine`s (rank, pod, text).

        Without `follow`, each rank's newest pod's log, merged in the kubelet's time order. With `follow`,
        the lines as they arrive, until the job has ended and its streams have closed (or it is deleted):
        the pods of a restarted gang are followed as they start, and a pod that ends or goes away is
        announced by a `notice` line. Stop early by leaving the loop.

        Args:
            tail: start from the last this many lines of each pod's log.

        Raises JobNotFound; without `follow`, NoPodForRank when the job has no pods yet.
        """
        ns = self._ns(namespace)
        state = self.get(name, ns)
        nodes = ((state.object.get("spec") or {}).get("resources") or {}).get("nodes")
        api = self._stream_api(2 * (nodes if isinstance(nodes, int) else 1) + 2)
        try:
            if follow:
                yield from GangLogs(api, ns, name, tail)
                return
            chosen = pods_by_rank(self.pods(name, ns))
            if not chosen:
                raise NoPodForRank(ns, name, 0, [])
            yield from read_all(api, ns, chosen, tail)
        finally:
            api.close()

    def _stream_api(self, streams: int) -> KubeApi:
        """A client of the same credentials with a connection for each of `streams` open streams (the
        client's own pool is kept for requests)."""
        return KubeApi(self.api.credentials, self.api.field_manager, pool_size=max(streams, 1) + 1, timeout=30)


def _event_time(event: Mapping[str, Any]) -> tuple[str, int]:
    """When the Event last happened, then the order the API server stored it in (times have whole seconds)."""
    series = event.get("series") or {}
    meta = event.get("metadata") or {}
    when = str(
        event.get("lastTimestamp")
        or series.get("lastObservedTime")
        or event.get("eventTime")
        or event.get("firstTimestamp")
        or meta.get("creationTimestamp")
        or ""
    )
    version = str(meta.get("resourceVersion") or "")
    return when, int(version) if version.isdigit() else 0


def _rank_then_age(pod: Mapping[str, Any]) -> tuple[bool, int, str]:
    rank = rank_of(pod)
    return rank is None, rank or 0, str((pod.get("metadata") or {}).get("creationTimestamp") or "")
