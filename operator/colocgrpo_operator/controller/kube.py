"""The operator's few Kubernetes API calls, as plain dicts over one pooled HTTP client.

The official client's typed models would deserialize every response into hundreds of
pydantic objects; the operator only reads a few fields back, so responses stay JSON dicts.
Every request is counted by verb (`colocgrpo_operator_api_requests_total`).
"""

from __future__ import annotations

import json
import os
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from colocgrpo_operator.api import GROUP, PLURAL, VERSION
from colocgrpo_operator.controller.metrics import API_REQUESTS

# kind -> (API path prefix, plural) for every child the renderer produces.
_KIND_PATHS = {
    "ConfigMap": ("/api/v1", "configmaps"),
    "Service": ("/api/v1", "services"),
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "Secret": ("/api/v1", "secrets"),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "Job": ("/apis/batch/v1", "jobs"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
}


def load_api_client(pool_size: int = 16, kubeconfig: str | None = None) -> client.ApiClient:
    """In-cluster credentials when running in a pod, else KUBECONFIG / ~/.kube/config."""
    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not (kubeconfig or os.environ.get("KUBECONFIG")):
        config.load_incluster_config(client_configuration=configuration)
    else:
        config.load_kube_config(config_file=kubeconfig or os.environ.get("KUBECONFIG"),
                                client_configuration=configuration)
    # One connection per worker thread, so threads never queue for a socket.
    configuration.connection_pool_maxsize = max(pool_size, 4)
    return client.ApiClient(configuration)


def object_path(kind: str, namespace: str, name: str | None = None) -> str:
    prefix, plural = _KIND_PATHS[kind]
    path = f"{prefix}/namespaces/{namespace}/{plural}"
    return f"{path}/{name}" if name else path


def job_resource_path(namespace: str, name: str, subresource: str | None = None) -> str:
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"
    return f"{path}/{subresource}" if subresource else path


class KubeApi:
    """Blocking calls (run them in kopf's executor threads, never on the event loop)."""

    def __init__(self, api_client: client.ApiClient, field_manager: str, timeout: float = 30):
        self.api_client = api_client
        self.field_manager = field_manager
        self.timeout = timeout

    def close(self) -> None:
        self.api_client.close()

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any] | None:
        """One API call; raises ApiException (with .status) on any non-2xx answer."""
        API_REQUESTS.labels(verb=method).inc()
        method_, url, headers, body_, post = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api_client.call_api(method_, url, header_params=headers, body=body_, post_params=post,
                                            _request_timeout=self.timeout)
        data = response.read()
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=data.decode("utf-8", "replace"), data=None)
        return json.loads(data) if data else None

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
            return self.request("POST", object_path(obj["kind"], meta["namespace"]), body=obj,
                                query={"fieldManager": self.field_manager}) or {}
        except ApiException as error:
            if error.status == 409:
                return None
            raise

    def delete(self, kind: str, namespace: str, name: str, propagation: str = "Background",
               uid: str | None = None) -> bool:
        """Delete (optionally only that exact object, by uid); False when already gone."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self.request("DELETE", object_path(kind, namespace, name), body=body)
        except ApiException as error:
            if error.status in (404, 409):
                return False
            raise
        return True

    def patch_job_suspend(self, namespace: str, name: str, suspend: bool) -> None:
        self.request("PATCH", object_path("Job", namespace, name), body={"spec": {"suspend": suspend}},
                     content_type="application/merge-patch+json")

    # -- the ColocGRPOJob itself ---------------------------------------------------------------

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
        """Merge-patch the status subresource. `status` must not contain `progress` (the
        trainer's); a merge patch leaves keys it does not mention untouched."""
        assert "progress" not in status, "the operator never writes status.progress"
        return self.request("PATCH", job_resource_path(namespace, name, "status"), body={"status": status},
                            content_type="application/merge-patch+json")

    def delete_job_resource(self, namespace: str, name: str, uid: str | None = None) -> bool:
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self.request("DELETE", job_resource_path(namespace, name), body=body)
        except ApiException as error:
            if error.status in (404, 409):
                return False
            raise
        return True
