"""The trainer logs of a job's gang: one rank's, or every rank's interleaved.

A rank's pod is the pod of that completion index (label batch.kubernetes.io/job-completion-index),
the newest live one when a gang restart left several. Logs are read from the API server
(`pods/log`), as `kubectl logs` reads them.

Every rank at once (`GangLogs`):
- without follow, each rank's log is read in full (or its last `tail` lines) with the kubelet's
  timestamps, and the lines are merged in time order;
- with follow, one thread streams each pod's log and the lines are yielded as they arrive. A watch on
  the gang's pods finds the pods of a restarted gang, which are followed from their first line; a
  pod that ends or goes away is announced by a notice line. A watch on the job ends the iteration
  once the job has ended and every stream has closed (a stream still open a few seconds after its pod
  ended is closed then), or at once when the job is deleted.
"""

from __future__ import annotations

import heapq
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from colocgrpo_operator.api import COMPLETION_INDEX_KEY, JOB_NAME_LABEL, KIND
from colocgrpo_operator.client.views import TERMINAL_PHASES, LogLine
from colocgrpo_operator.kube.client import KubeApi, KubeApiError, interrupt_stream, object_path, watch_events
from colocgrpo_operator.kube.transient import is_transient

TRAINER_CONTAINER = "trainer"
# How long a followed stream may stay open after its pod ended, or after the job ended, before it is
# closed: a kubelet ends the stream when the container ends, and the last lines arrive within this.
END_GRACE_SECONDS = 3.0
# Each watch asks the API server for a stream of at most this long, then watches again.
WATCH_SECONDS = 50
# How long the watches keep asking an API server that does not answer (restarting, shedding load).
OUTAGE_SECONDS = 300.0
# Pod phases in which the trainer container has started, so it has a log to read.
STARTED_PHASES = frozenset({"Running", "Succeeded", "Failed"})


def rank_of(pod: Mapping[str, Any]) -> int | None:
    """The pod's completion index (its node rank), or None when it has none."""
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(COMPLETION_INDEX_KEY)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _newest_first_key(pod: Mapping[str, Any]) -> tuple[bool, str]:
    meta = pod.get("metadata") or {}
    return (not meta.get("deletionTimestamp"), meta.get("creationTimestamp") or "")


def pick_pod(pods: Iterable[Mapping[str, Any]], rank: int) -> Mapping[str, Any] | None:
    """The pod to read rank `rank`'s log from: the newest of that completion index, a pod being deleted
    only when there is no other."""
    candidates = [pod for pod in pods if rank_of(pod) == rank]
    return max(candidates, key=_newest_first_key) if candidates else None


def pods_by_rank(pods: Iterable[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """Each rank's pod as `pick_pod` picks it, by rank."""
    listed = list(pods)
    ranks = sorted({rank for pod in listed if (rank := rank_of(pod)) is not None})
    return {rank: pod for rank in ranks if (pod := pick_pod(listed, rank)) is not None}


def pod_name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name") or "")


def _pod_uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def _pod_phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def log_query(*, follow: bool, tail: int | None, previous: bool = False, timestamps: bool = False) -> dict[str, str]:
    """The pods/log query of the trainer container."""
    query = {"container": TRAINER_CONTAINER, "follow": str(follow).lower(), "previous": str(previous).lower()}
    if tail is not None:
        query["tailLines"] = str(tail)
    if timestamps:
        query["timestamps"] = "true"
    return query


def log_path(namespace: str, pod: str) -> str:
    return f"{object_path('Pod', namespace, pod)}/log"


def response_lines(response: Any) -> Iterator[str]:
    """The lines of a streamed answer as they arrive, without their newline; a last line without one is
    yielded when the stream ends."""
    buffer = b""
    for chunk in response.stream(4096):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            yield line.decode("utf-8", "replace")
    if buffer:
        yield buffer.decode("utf-8", "replace")


def stream_log(api: KubeApi, namespace: str, pod: str, query: Mapping[str, str]) -> Iterator[str]:
    """One pod's log, line by line. Raises KubeApiError when the API server refuses (the container has not
    started, say)."""
    response = api.stream(log_path(namespace, pod), query=query)
    try:
        yield from response_lines(response)
    finally:
        response.release_conn()


def _time_key(line: str) -> tuple[str, str, str]:
    """(seconds, nanoseconds, text) of a line the kubelet prefixed with its RFC 3339 time (`timestamps=true`),
    so that lines sort in time order whatever the fraction's length."""
    stamp, _, text = line.partition(" ")
    head, dot, rest = stamp.partition(".")
    fraction = rest.rstrip("Z")
    if not dot:
        head, fraction = head.rstrip("Z"), ""
    return head, fraction.ljust(9, "0"), text


def merge_in_time_order(logs: Mapping[tuple[int | None, str], list[str]]) -> Iterator[LogLine]:
    """Lines of several pods' logs read with the kubelet's timestamps, merged in time order (each pod's
    own order kept), the timestamps stripped. `logs` maps (rank, pod) to that pod's lines."""

    def keyed(source: tuple[int | None, str], lines: list[str]) -> Iterator[tuple[tuple[str, str], int, LogLine]]:
        last = ("", "")
        for number, line in enumerate(lines):
            seconds, nanos, text = _time_key(line)
            if seconds[:1].isdigit():
                last = (seconds, nanos)
            else:  # no timestamp (it cannot happen with timestamps=true): keep the line where it was
                text = line
            yield last, number, LogLine(source[0], source[1], text)

    for _, _, line in heapq.merge(*(keyed(source, lines) for source, lines in logs.items()), key=lambda x: x[:2]):
        yield line


def read_all(
    api: KubeApi, namespace: str, pods: Mapping[int, Mapping[str, Any]], tail: int | None
) -> Iterator[LogLine]:
    """Every rank's log read in full (or its last `tail` lines), merged in time order."""
    query = log_query(follow=False, tail=tail, timestamps=True)

    def read(item: tuple[int, Mapping[str, Any]]) -> tuple[tuple[int | None, str], list[str]]:
        rank, pod = item
        return (rank, pod_name(pod)), list(stream_log(api, namespace, pod_name(pod), query))

    with ThreadPoolExecutor(max_workers=max(1, min(8, len(pods)))) as pool:
        logs = dict(pool.map(read, sorted(pods.items())))
    yield from merge_in_time_order(logs)


class _Stream:
    """The open response of one thread's stream, which the iteration may interrupt."""

    def __init__(self) -> None:
        self.response: Any = None
        self.closing = False


class _Follower(_Stream):
    """One pod's followed log stream, read in a thread of its own."""

    def __init__(self, pod: Mapping[str, Any], tail: int | None):
        super().__init__()
        self.name, self.uid, self.rank = pod_name(pod), _pod_uid(pod), rank_of(pod)
        self.tail = tail
        self.ended_at: float | None = None  # when its pod was seen ending (Succeeded, Failed) or going away
        self.gone = False  # its pod was deleted
        self.passed_over = False  # an older pod of its rank when the gang was first listed: not followed


class GangLogs:
    """Every rank's trainer log of one job, followed, as an iterator of `LogLine`s (see the module).
    Iterate it once; closing the iteration early (a `break`) ends every stream and thread it started.

    Args:
        api: a client whose pool allows a connection per followed pod and two more (the watches).
        namespace, job: the ColocGRPOJob.
        tail: the last lines of each pod's log to start with (the pods found later start at their first
            line); None for the whole log.
    """

    def __init__(self, api: KubeApi, namespace: str, job: str, tail: int | None = None):
        self.api, self.namespace, self.job, self.tail = api, namespace, job, tail
        self.messages: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.streams: list[_Stream] = []  # every stream a thread holds or held
        self.followers: dict[str, _Follower] = {}  # by pod uid, while the stream is open
        self.followed: dict[str, _Follower] = {}  # every pod ever followed (or passed over), by uid
        self.synced = False  # the first list of the gang's pods has been handled

    # -- streams, each read by a thread and interrupted by the iteration ---------------------------

    def _hold(self, stream: _Stream, response: Any) -> bool:
        """Record `response` as the stream's open one; False (and released) when it is closing already."""
        with self.lock:
            if not (self.stopping.is_set() or stream.closing):
                stream.response = response
                return True
        response.release_conn()
        return False

    def _release(self, stream: _Stream, response: Any) -> None:
        with self.lock:
            stream.response = None
        response.release_conn()

    def _interrupt(self, stream: _Stream) -> None:
        with self.lock:
            stream.closing = True
            if stream.response is not None:
                interrupt_stream(stream.response)

    def _watch(self, what: str, path: str, query: dict[str, str]) -> None:
        """List, then watch, the objects at `path`: a ("list", what, items) message, then an ("event", what,
        type, object) message per change, until stopped. A 410 or a cut connection lists again, an API server
        that does not answer is asked again for up to OUTAGE_SECONDS; a refusal is an ("error", error) message."""
        stream = _Stream()
        self.streams.append(stream)
        version = ""
        failures, failing_since = 0, None
        while not self.stopping.is_set():
            try:
                if not version:
                    listing = self.api.request("GET", path, query=query) or {}
                    version = str((listing.get("metadata") or {}).get("resourceVersion") or "")
                    self.messages.put(("list", what, listing.get("items") or []))
                response = self.api.open_watch(path, query, resource_version=version, timeout=WATCH_SECONDS)
                if not self._hold(stream, response):
                    return
                try:
                    for event in watch_events(response):
                        kind, obj = event.get("type"), event.get("object") or {}
                        if kind == "ERROR":  # 410 Gone: the version is too old
                            version = ""
                            break
                        version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                        if kind != "BOOKMARK":
                            self.messages.put(("event", what, kind, obj))
                finally:
                    self._release(stream, response)
            except Exception as error:  # refused, a cut connection, the API server restarting, or interrupted
                if self.stopping.is_set():
                    return
                version = ""
                if isinstance(error, KubeApiError) and error.status == 410:
                    continue  # the version is too old: list again
                failing_since = failing_since or time.monotonic()
                if not is_transient(error) or time.monotonic() - failing_since > OUTAGE_SECONDS:
                    self.messages.put(("error", error))
                    return
                failures += 1
                self.stopping.wait(min(0.25 * 2.0**failures, 5.0))
                continue
            failures, failing_since = 0, None

    def _follow(self, follower: _Follower) -> None:
        """Stream one pod's log into the messages, then an ("ended", uid) message."""
        try:
            response = self.api.stream(
                log_path(self.namespace, follower.name), query=log_query(follow=True, tail=follower.tail)
            )
            if self._hold(follower, response):
                try:
                    for text in response_lines(response):
                        self.messages.put(("line", LogLine(follower.rank, follower.name, text)))
                finally:
                    self._release(follower, response)
        except KubeApiError as error:
            text = f"cannot read the log of pod {follower.name}: {error.message}"
            self.messages.put(("line", LogLine(follower.rank, follower.name, text, notice=True)))
        except Exception:  # interrupted, or the connection was cut
            if not (self.stopping.is_set() or follower.closing):
                text = f"the log stream of pod {follower.name} was cut"
                self.messages.put(("line", LogLine(follower.rank, follower.name, text, notice=True)))
        finally:
            self.messages.put(("ended", follower.uid))

    def _start(self, pod: Mapping[str, Any], tail: int | None, announce: bool) -> Iterator[LogLine]:
        follower = _Follower(pod, tail)
        self.followers[follower.uid] = self.followed[follower.uid] = follower
        self.streams.append(follower)
        if announce:
            text = f"following pod {follower.name}, a new pod of rank {follower.rank}"
            yield LogLine(follower.rank, follower.name, text, notice=True)
        threading.Thread(target=self._follow, args=(follower,), name=f"log-{follower.name}", daemon=True).start()

    # -- the gang's pods -------------------------------------------------------------------------

    def _pod_seen(self, pod: Mapping[str, Any], deleted: bool = False) -> Iterator[LogLine]:
        """A pod of the gang, listed or changed: a new pod whose container has started is followed; a
        followed pod that ends, is being deleted or goes away is announced (and its stream closed once it
        is gone)."""
        uid, phase = _pod_uid(pod), _pod_phase(pod)
        deleting = bool((pod.get("metadata") or {}).get("deletionTimestamp"))
        follower = self.followed.get(uid)
        if follower is not None:
            if follower.passed_over or follower.gone:
                return
            if follower.ended_at is None and (deleting or phase in TERMINAL_PHASES):
                follower.ended_at = time.monotonic()
                yield LogLine(follower.rank, follower.name, _ending(pod), notice=True)
            if deleted:
                follower.gone = True
                follower.ended_at = follower.ended_at or time.monotonic()
                yield LogLine(follower.rank, follower.name, f"pod {follower.name} went away (deleted)", notice=True)
                if uid in self.followers:
                    self._interrupt(follower)
            return
        if deleted or deleting or phase not in STARTED_PHASES or rank_of(pod) is None:
            return  # its container has not started (or never will): it is followed once it has
        yield from self._start(pod, None, announce=True)

    def _first_list(self, pods: list[Mapping[str, Any]]) -> Iterator[LogLine]:
        """The gang as first listed: each rank's pod (the newest) is followed from `tail` lines back, or
        once its container starts; the older pods of a rank are passed over."""
        chosen = {_pod_uid(pod) for pod in pods_by_rank(pods).values()}
        for pod in pods:
            if _pod_uid(pod) not in chosen:
                self.followed[_pod_uid(pod)] = passed = _Follower(pod, None)
                passed.passed_over = True
        for pod in pods:
            if _pod_uid(pod) in chosen and _pod_phase(pod) in STARTED_PHASES:
                yield from self._start(pod, self.tail, announce=False)
        self.synced = True

    # -- the iteration ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[LogLine]:
        watches = (
            ("pods", object_path("Pod", self.namespace), {"labelSelector": f"{JOB_NAME_LABEL}={self.job}"}),
            ("job", object_path(KIND, self.namespace), {"fieldSelector": f"metadata.name={self.job}"}),
        )
        for what, path, query in watches:
            threading.Thread(target=self._watch, args=(what, path, query), name=f"watch-{what}", daemon=True).start()
        job_ended_at: float | None = None
        try:
            while True:
                try:
                    message = self.messages.get(timeout=0.25)
                except queue.Empty:
                    message = None
                if message is not None:
                    kind = message[0]
                    if kind == "line":
                        yield message[1]
                    elif kind == "ended":
                        self.followers.pop(message[1], None)
                    elif kind == "error":
                        raise message[1]
                    elif message[1] == "pods":
                        if kind == "list" and not self.synced:
                            yield from self._first_list(message[2])
                        else:
                            changed = message[2] if kind == "list" else [message[3]]
                            deleted = kind == "event" and message[2] == "DELETED"
                            for pod in changed:
                                yield from self._pod_seen(pod, deleted=deleted)
                    else:  # the job
                        jobs = message[2] if kind == "list" else [message[3]]
                        if not jobs or (kind == "event" and message[2] == "DELETED"):
                            text = f"ColocGRPOJob {self.namespace}/{self.job} was deleted"
                            yield LogLine(None, "", text, notice=True)
                            return
                        if (jobs[0].get("status") or {}).get("phase") in TERMINAL_PHASES and job_ended_at is None:
                            job_ended_at = time.monotonic()
                now = time.monotonic()
                for follower in list(self.followers.values()):
                    ended = [moment for moment in (follower.ended_at, job_ended_at) if moment is not None]
                    if ended and now - min(ended) > END_GRACE_SECONDS and not follower.closing:
                        self._interrupt(follower)
                if job_ended_at is not None and self.synced and not self.followers and self.messages.empty():
                    return
        finally:
            self.stopping.set()
            for stream in list(self.streams):
                self._interrupt(stream)


def _ending(pod: Mapping[str, Any]) -> str:
    """A notice's text for a followed pod that ended or is being deleted."""
    name, phase = pod_name(pod), _pod_phase(pod)
    if phase not in TERMINAL_PHASES:
        return f"pod {name} is being deleted"
    terminated = next(
        (
            (status.get("state") or {}).get("terminated") or {}
            for status in (pod.get("status") or {}).get("containerStatuses") or []
            if status.get("name") == TRAINER_CONTAINER
        ),
        {},
    )
    reason = str(terminated.get("reason") or (pod.get("status") or {}).get("reason") or "")
    code = f"exit code {terminated['exitCode']}" if "exitCode" in terminated else ""
    detail = ", ".join(part for part in (reason, code) if part)
    return f"pod {name} ended: {phase}" + (f" ({detail})" if detail else "")
