"""The operator's few Kubernetes API calls, as plain dicts over one bounded urllib3 pool.

Not the official `kubernetes` client: its import alone is ~11 MiB of the operator's RSS
(docs/benchmarks/operator.md), and its typed models would deserialize every response into
hundreds of objects while the operator reads a few fields back. Responses stay JSON dicts.
Every request is counted by verb (`colocgrpo_api_requests_total`).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlencode

import urllib3

from colocgrpo_operator.api import GROUP, KIND, PLURAL, VERSION
from colocgrpo_operator.api.model import CLUSTER_RUNTIME_KIND, RUNTIME_KIND
from colocgrpo_operator.api.naming import SUSPEND_REQUESTED_ANNOTATION
from colocgrpo_operator.api.runtime import CLUSTER_RUNTIME_PLURAL, RUNTIME_PLURAL
from colocgrpo_operator.kube.credentials import Credentials, load_credentials
from colocgrpo_operator.metrics import API_REQUESTS, API_RETRIES

# kind -> (API path prefix, plural) for every child the renderer produces, and the job itself.
_KIND_PATHS = {
    "ConfigMap": ("/api/v1", "configmaps"),
    "Service": ("/api/v1", "services"),
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "Job": ("/apis/batch/v1", "jobs"),
    "Pod": ("/api/v1", "pods"),
    "Event": ("/api/v1", "events"),
    KIND: (f"/apis/{GROUP}/{VERSION}", PLURAL),
    RUNTIME_KIND: (f"/apis/{GROUP}/{VERSION}", RUNTIME_PLURAL),
    CLUSTER_RUNTIME_KIND: (f"/apis/{GROUP}/{VERSION}", CLUSTER_RUNTIME_PLURAL),
}
# Kinds without a namespace: their paths leave it out.
_CLUSTER_SCOPED = frozenset({CLUSTER_RUNTIME_KIND})


# How long one call keeps retrying 429s, and the backoff between them: the first waits for the
# server's Retry-After (APF sends 1 s), later ones double up to RETRY_MAX_DELAY_SECONDS.
RETRY_BUDGET_SECONDS = 60.0
RETRY_MAX_DELAY_SECONDS = 16.0


def retry_delay(retry_after: str | None, attempt: int) -> float:
    """Seconds to wait before retry number `attempt` (0-based) of a throttled request: at least
    the server's Retry-After (in seconds; an HTTP date or junk counts as 1 s), at least an
    exponential backoff, plus up to 25 % jitter so throttled threads do not return in step."""
    try:
        server = max(float(retry_after), 0.0) if retry_after is not None else 1.0
    except ValueError:
        server = 1.0
    backoff = min(0.5 * 2**attempt, RETRY_MAX_DELAY_SECONDS)
    return max(server, backoff) * (1 + random.random() / 4)


def object_path(kind: str, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
    """The API path of an object of `kind` (its collection when `name` is None); `namespace` is
    ignored for a cluster-scoped kind."""
    prefix, plural = _KIND_PATHS[kind]
    path = f"{prefix}/{plural}" if kind in _CLUSTER_SCOPED else f"{prefix}/namespaces/{namespace}/{plural}"
    if name:
        path = f"{path}/{name}"
    return f"{path}/{subresource}" if subresource else path


def all_namespaces_path(kind: str) -> str:
    """The API path of every object of `kind` in every namespace (`kubectl get -A`)."""
    prefix, plural = _KIND_PATHS[kind]
    return f"{prefix}/{plural}"


def interrupt_stream(response: Any) -> None:
    """End a stream (a watch, a followed log) that another thread is reading: its read returns or
    raises at once. urllib3 2.3 and later shut the socket down; before, the response is closed. A
    stream already released to the pool is left alone."""
    shutdown = getattr(response, "shutdown", None)
    try:
        if callable(shutdown):
            shutdown()
        else:
            response.close()
    except (RuntimeError, ValueError, OSError):
        pass  # released meanwhile, or the socket is gone already


def watch_events(response: Any) -> Iterator[dict[str, Any]]:
    """The decoded events of an open watch stream as they arrive: `{"type": ADDED|MODIFIED|DELETED|
    BOOKMARK|ERROR, "object": ...}`; an ERROR's object is a Status (410 Gone: the resource version is
    too old, list again). A connection cut short raises urllib3's errors, as any request does."""
    buffer = b""
    for chunk in response.stream(65536):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)


class KubeApiError(Exception):
    """The API server answered with a non-2xx status. `status` is the HTTP code, `reason` its
    phrase, `body` the raw answer and `message` the Status object's message when there is one."""

    def __init__(self, status: int, reason: str, body: str = ""):
        self.status = status
        self.reason = reason
        self.body = body
        try:
            answer = json.loads(body) if body else {}
        except ValueError:
            answer = {}
        self.message = str((answer.get("message") if isinstance(answer, dict) else None) or body or reason)
        super().__init__(f"({status}) {reason}: {self.message}")


class ObjectGone(Exception):
    """The object a write was meant for was deleted, or replaced by another of the same name."""

    def __init__(self, kind: str, namespace: str, name: str, uid: str):
        self.kind, self.namespace, self.name, self.uid = kind, namespace, name, uid
        super().__init__(f"{kind} {namespace}/{name} (uid {uid}) is gone or was replaced")


def _pointer(key: str) -> str:
    """`key` as one JSON Pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def terminating_namespace(error: KubeApiError) -> bool:
    """A write refused because its namespace is being deleted (403 from NamespaceLifecycle)."""
    return error.status == 403 and "because it is being terminated" in error.message


def connection_pool(credentials: Credentials, size: int) -> urllib3.PoolManager:
    """Keep-alive connections to the API server, at most `size` open at once (a thread that
    finds them all busy waits for one instead of opening another)."""
    options: dict[str, Any] = {
        "maxsize": size,
        "block": True,
        "ssl_context": credentials.ssl_context(),
        # Connection failures only: answers (429s included) are KubeApi._send's to retry or not.
        "retries": urllib3.Retry(total=3, redirect=0, respect_retry_after_header=False),
    }
    if credentials.insecure:
        options.update(cert_reqs="CERT_NONE", assert_hostname=False)
    if credentials.proxy_url:
        return urllib3.ProxyManager(credentials.proxy_url, num_pools=1, **options)
    return urllib3.PoolManager(num_pools=1, **options)


class KubeApi:
    """Blocking calls (run them in kopf's executor threads, never on the event loop).

    Args:
        credentials: where the API server is and how to authenticate (kube/credentials.py).
        field_manager: server-side apply field manager and create/patch fieldManager.
        pool_size: most connections open at once (at least 4); one per calling thread is best.
        timeout: read timeout of every request, in seconds (connect: at most 10).
    """

    def __init__(
        self,
        credentials: Credentials,
        field_manager: str,
        pool_size: int = 16,
        timeout: float = 30,
        retry_budget: float = RETRY_BUDGET_SECONDS,
    ):
        self.credentials = credentials
        self.retry_budget = retry_budget
        self.field_manager = field_manager
        # One connection per worker thread, so threads never queue for a socket.
        self.pool = connection_pool(credentials, max(pool_size, 4))
        self.timeout = urllib3.Timeout(connect=min(10, timeout), read=timeout)
        self.server = credentials.server.rstrip("/")

    @classmethod
    def from_kubeconfig(
        cls, kubeconfig: str | None, field_manager: str, context: str | None = None, **options: Any
    ) -> KubeApi:
        """For tools and tests: that kubeconfig (or in-cluster / $KUBECONFIG when None), at its
        `context` (its current one when None)."""
        return cls(load_credentials(str(kubeconfig) if kubeconfig else None, context=context), field_manager, **options)

    def close(self) -> None:
        """Close the pooled connections (a later request opens new ones)."""
        self.pool.clear()

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any] | None:
        """One API call; raises KubeApiError (with .status) on any non-2xx answer."""
        response = self._send(method, path, body, query, content_type, preload=True, timeout=self.timeout)
        data = response.data
        if not 200 <= response.status <= 299:
            raise KubeApiError(response.status, response.reason or "", data.decode("utf-8", "replace"))
        return json.loads(data) if data else None

    def stream(self, path: str, query: Mapping[str, str] | None = None, read_timeout: float | None = None) -> Any:
        """GET `path` without reading the answer: the open urllib3 response, for watch streams
        and followed logs (close it with release_conn() when done). Raises KubeApiError on a
        non-2xx answer, as request() does."""
        timeout = urllib3.Timeout(connect=self.timeout.connect_timeout, read=read_timeout)
        response = self._send("GET", path, None, query, "application/json", preload=False, timeout=timeout)
        if not 200 <= response.status <= 299:
            data = response.read()
            response.release_conn()
            raise KubeApiError(response.status, response.reason or "", data.decode("utf-8", "replace"))
        return response

    def open_watch(
        self, path: str, query: Mapping[str, str] | None = None, resource_version: str = "", timeout: int = 60
    ) -> Any:
        """Start watching the collection at `path` (narrowed by `query`'s selectors) after
        `resource_version` (none: the current objects first, as ADDED events), for at most `timeout`
        seconds: the open response, whose events `watch_events` decodes (release_conn() it when done).
        Raises KubeApiError when the watch is refused."""
        params = {**(query or {}), "watch": "true", "timeoutSeconds": str(timeout), "allowWatchBookmarks": "true"}
        if resource_version:
            params["resourceVersion"] = resource_version
        return self.stream(path, query=params, read_timeout=timeout + 10)

    def watch(
        self, path: str, query: Mapping[str, str] | None = None, resource_version: str = "", timeout: int = 60
    ) -> Iterator[dict[str, Any]]:
        """The events of `open_watch`'s stream, one at a time, until the API server ends it (after
        `timeout` seconds); see `watch_events`."""
        response = self.open_watch(path, query, resource_version, timeout)
        try:
            yield from watch_events(response)
        finally:
            response.release_conn()

    def _send(
        self,
        method: str,
        path: str,
        body: Any,
        query: Mapping[str, str] | None,
        content_type: str,
        *,
        preload: bool,
        timeout: urllib3.Timeout,
    ) -> urllib3.BaseHTTPResponse:
        """Send one request, and again where the API server's answer says another try will do:
        after a 401 once the credentials have a new token (a rotated file, a re-run exec plugin),
        and after a 429 (API Priority and Fairness shedding load) once `Retry-After` and a growing
        backoff have passed, for at most `retry_budget` seconds in all. A 429 is refused before
        the request runs, so any verb may be retried."""
        API_REQUESTS.labels(verb=method).inc()
        url = f"{self.server}{path}?{urlencode(query)}" if query else f"{self.server}{path}"
        payload = None
        if body is not None:
            payload = json.dumps(body, separators=(",", ":")).encode()  # JSON is YAML too (apply)
        waited = 0.0
        attempt = 0
        reauthenticated = False
        while True:
            token = self.credentials.bearer_token()
            headers = {"Accept": "application/json"}
            if token:
                headers["Authorization"] = f"Bearer {token}"
            if payload is not None:
                headers["Content-Type"] = content_type
            response = self.pool.request(
                method, url, body=payload, headers=headers, timeout=timeout, preload_content=preload
            )
            if response.status == 401 and not reauthenticated and self.credentials.refused(token):
                reauthenticated = True
                API_RETRIES.labels(reason="unauthorized").inc()
            elif response.status == 429 and waited < self.retry_budget:
                delay = min(retry_delay(response.headers.get("Retry-After"), attempt), self.retry_budget - waited)
                attempt += 1
                waited += delay
                API_RETRIES.labels(reason="throttled").inc()
                time.sleep(delay)
            else:
                return response
            if not preload:
                response.drain_conn()
                response.release_conn()

    # -- children ------------------------------------------------------------------------------

    def apply(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """Server-side apply (idempotent create-or-update; our field manager wins conflicts)."""
        meta = obj["metadata"]
        return self.request(
            "PATCH",
            object_path(obj["kind"], meta["namespace"], meta["name"]),
            body=obj,
            query={"fieldManager": self.field_manager, "force": "true"},
            content_type="application/apply-patch+yaml",
        )

    def create(self, obj: dict[str, Any]) -> bool:
        """Create; False when it already exists (409), which is success for a reconciler."""
        return self.create_returning(obj) is not None

    def create_returning(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """Create and return the stored object; None when it already exists (409)."""
        meta = obj["metadata"]
        try:
            return (
                self.request(
                    "POST",
                    object_path(obj["kind"], meta["namespace"]),
                    body=obj,
                    query={"fieldManager": self.field_manager},
                )
                or {}
            )
        except KubeApiError as error:
            if error.status == 409:
                return None
            raise

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object; None when there is none (404)."""
        try:
            return self.request("GET", object_path(kind, namespace, name))
        except KubeApiError as error:
            if error.status == 404:
                return None
            raise

    def list_objects(self, kind: str, namespace: str, selector: str | None = None) -> dict[str, Any]:
        """The namespace's objects of `kind` (those whose labels match `selector`, a label selector,
        when given): the API's list object, its metadata.resourceVersion and its items."""
        query = {"labelSelector": selector} if selector else None
        return self.request("GET", object_path(kind, namespace), query=query) or {}

    def delete(
        self, kind: str, namespace: str, name: str, *, propagation: str = "Background", uid: str | None = None
    ) -> bool:
        """Delete with that propagation policy (only that exact object when `uid` is given).
        False when it is already gone (404) or is another object by now (409, uid mismatch)."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self.request("DELETE", object_path(kind, namespace, name), body=body)
        except KubeApiError as error:
            if error.status in (404, 409):
                return False
            raise
        return True

    def patch_job_suspend(self, namespace: str, name: str, suspend: bool) -> None:
        """Set the batch Job's spec.suspend, and the annotation that says the operator asked for it
        (one merge patch); raises KubeApiError on refusal."""
        self.request(
            "PATCH",
            object_path("Job", namespace, name),
            body={
                "metadata": {"annotations": {SUSPEND_REQUESTED_ANNOTATION: "true" if suspend else "false"}},
                "spec": {"suspend": suspend},
            },
            content_type="application/merge-patch+json",
        )

    # -- the ColocGRPOJob itself ---------------------------------------------------------------

    def patch_status(
        self, namespace: str, name: str, uid: str, status: Mapping[str, Any], *, whole: bool = False
    ) -> dict[str, Any] | None:
        """Write status keys of the job incarnation `uid` only: a JSON patch whose first op tests
        /metadata/uid (a merge patch's metadata.uid is ignored on the status subresource, so it
        cannot carry the precondition). Each key is set (None removes it: the API server prunes
        nulls); `whole` sets the status object itself, for a job that has none yet. Never
        mentions `status.progress` (the trainer's). Raises ObjectGone when the job was deleted or
        replaced by another of the same name, KubeApiError otherwise."""
        assert "progress" not in status, "the operator never writes status.progress"
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/uid", "value": uid}]
        if whole:
            ops.append({"op": "add", "path": "/status", "value": {k: v for k, v in status.items() if v is not None}})
        else:
            ops += [{"op": "add", "path": f"/status/{_pointer(key)}", "value": value} for key, value in status.items()]
        try:
            return self.request(
                "PATCH",
                object_path(KIND, namespace, name, "status"),
                body=ops,
                content_type="application/json-patch+json",
            )
        except KubeApiError as error:
            if error.status == 404 or (error.status == 422 and self._replaced(namespace, name, uid)):
                raise ObjectGone(KIND, namespace, name, uid) from error
            raise

    def patch_annotations(
        self, namespace: str, name: str, uid: str, annotations: Mapping[str, str]
    ) -> dict[str, Any] | None:
        """Merge-patch metadata.annotations of the job incarnation `uid` (keys not named are left
        alone). On the main resource a merge patch's metadata.uid is checked: uid is immutable, so
        a replaced object answers 422. Raises ObjectGone when the object was deleted or
        replaced by another of the same name, KubeApiError otherwise."""
        try:
            return self.request(
                "PATCH",
                object_path(KIND, namespace, name),
                body={"metadata": {"uid": uid, "annotations": dict(annotations)}},
                content_type="application/merge-patch+json",
            )
        except KubeApiError as error:
            if error.status == 404 or (error.status == 422 and self._replaced(namespace, name, uid)):
                raise ObjectGone(KIND, namespace, name, uid) from error
            raise

    def _replaced(self, namespace: str, name: str, uid: str) -> bool:
        """Whether the job `name` is gone or is another incarnation than `uid` now."""
        try:
            current = self.request("GET", object_path(KIND, namespace, name)) or {}
        except KubeApiError as error:
            if error.status == 404:
                return True
            raise
        return bool((current.get("metadata") or {}).get("uid") != uid)

    def failed_create_events(self, namespace: str, uid: str) -> list[dict[str, Any]]:
        """The Job controller's FailedCreate Events (core/v1) about the object `uid`: one list,
        filtered by the API server (field selector), served from its watch cache
        (resourceVersion=0: an Event a moment old tells as much). Raises KubeApiError."""
        found = (
            self.request(
                "GET",
                f"/api/v1/namespaces/{namespace}/events",
                query={"fieldSelector": f"involvedObject.uid={uid},reason=FailedCreate", "resourceVersion": "0"},
            )
            or {}
        )
        items = found.get("items")
        return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []

    def namespace_terminating(self, namespace: str) -> bool:
        """Whether the namespace is being deleted (or is gone). False when that cannot be read."""
        try:
            found = self.request("GET", f"/api/v1/namespaces/{namespace}") or {}
        except KubeApiError as error:
            return error.status == 404
        return bool((found.get("metadata") or {}).get("deletionTimestamp")) or (
            (found.get("status") or {}).get("phase") == "Terminating"
        )
