"""Where the operator's API server is and how it proves who it is: in-cluster or a kubeconfig.

The operator's own client (controller/kube.py) and kopf's session (settings.login) both start
from these credentials, so they always talk to the same server as the same identity. No
dependency on the official `kubernetes` package (the operator process never imports it).

Supported, as the operator needs: the pod's ServiceAccount (token re-read as the kubelet
rotates it, cluster CA), and kubeconfig users with a bearer token (`token`, `tokenFile`) or
a client certificate (`client-certificate[-data]`, `client-key[-data]`, as the local dev
cluster writes). `exec` and `auth-provider` plugins are refused by name: run the operator
with a ServiceAccount (the chart does) or a token kubeconfig.
"""

from __future__ import annotations

import base64
import contextlib
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# The kubelet refreshes a projected token well before it expires; re-reading the file this
# often is what the official clients do too.
TOKEN_REREAD_SECONDS = 60.0


class CredentialsError(Exception):
    """No usable credentials (no kubeconfig, a broken one, or an unsupported kind of user)."""


@dataclass
class Credentials:
    server: str  # e.g. https://127.0.0.1:6443 (may carry a path prefix behind a proxy)
    ca_file: str | None = None
    ca_data: str | None = None  # PEM
    insecure: bool = False
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: str | None = None  # PEM
    key_data: str | None = None  # PEM
    token: str | None = None  # a static token (kubeconfig `token`)
    token_file: str | None = None  # re-read every TOKEN_REREAD_SECONDS (ServiceAccount, `tokenFile`)
    namespace: str | None = None
    proxy_url: str | None = None
    source: str = ""  # for messages: "in-cluster" or the kubeconfig path
    _file_token: tuple[float, str] | None = field(default=None, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def bearer_token(self) -> str | None:
        """The token to send now; a token file is re-read at most once a minute."""
        if self.token or not self.token_file:
            return self.token
        with self._lock:
            now = time.monotonic()
            if self._file_token is None or now - self._file_token[0] >= TOKEN_REREAD_SECONDS:
                try:
                    token = Path(self.token_file).read_text().strip()
                except OSError as error:
                    if self._file_token is None:
                        raise CredentialsError(f"cannot read the token file {self.token_file}: {error}") from error
                    token = self._file_token[1]  # mid-rotation: keep the last one
                self._file_token = (now, token)
            return self._file_token[1]

    def auth_headers(self) -> dict[str, str]:
        token = self.bearer_token()
        return {"Authorization": f"Bearer {token}"} if token else {}

    def ssl_context(self) -> ssl.SSLContext:
        """Server verification (the cluster's CA) and the client certificate, if any."""
        context = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_data)
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.cert_file or self.cert_data:
            with contextlib.ExitStack() as stack:
                # Python's ssl loads a certificate chain only from files: inline data goes through
                # private temporary files that exist only while it is loaded.
                cert = self.cert_file or _temporary_pem(stack, self.cert_data or "")
                key = self.key_file or (_temporary_pem(stack, self.key_data) if self.key_data else None)
                context.load_cert_chain(certfile=cert, keyfile=key)
        return context


def _temporary_pem(stack: contextlib.ExitStack, pem: str) -> str:
    handle = stack.enter_context(tempfile.NamedTemporaryFile("w", suffix=".pem"))  # noqa: SIM115 - the stack closes it
    handle.write(pem)
    handle.flush()
    return handle.name


def load_credentials(
    kubeconfig: str | None = None, environ: Mapping[str, str] = os.environ, service_account_dir: Path | None = None
) -> Credentials:
    """In-cluster credentials when running in a pod (and no kubeconfig is named), else the
    kubeconfig: `kubeconfig`, $KUBECONFIG (several files joined by ':'), ~/.kube/config."""
    service_account_dir = service_account_dir or SERVICE_ACCOUNT_DIR
    kubeconfig = kubeconfig or environ.get("KUBECONFIG") or None
    if not kubeconfig and environ.get("KUBERNETES_SERVICE_HOST") and (service_account_dir / "token").is_file():
        return in_cluster_credentials(environ, service_account_dir)
    if not kubeconfig:
        default = Path("~/.kube/config").expanduser()
        if not default.is_file():
            raise CredentialsError("no kubeconfig (pass --kubeconfig or set KUBECONFIG) and not running in a pod")
        kubeconfig = str(default)
    return kubeconfig_credentials(kubeconfig)


def in_cluster_credentials(
    environ: Mapping[str, str] = os.environ, service_account_dir: Path | None = None
) -> Credentials:
    """The pod's ServiceAccount: the API server from the service env vars, its token and CA."""
    service_account_dir = service_account_dir or SERVICE_ACCOUNT_DIR
    host, port = environ["KUBERNETES_SERVICE_HOST"], environ.get("KUBERNETES_SERVICE_PORT", "443")
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    ca_file = service_account_dir / "ca.crt"
    namespace_file = service_account_dir / "namespace"
    credentials = Credentials(
        server=f"https://{host}:{port}",
        ca_file=str(ca_file) if ca_file.is_file() else None,
        token_file=str(service_account_dir / "token"),
        namespace=namespace_file.read_text().strip() if namespace_file.is_file() else None,
        source="in-cluster",
    )
    credentials.bearer_token()  # fail now, not on the first request, if it is unreadable
    return credentials


def kubeconfig_credentials(kubeconfig: str) -> Credentials:
    """The current context of a kubeconfig (or of several merged, first definition wins;
    relative file paths are relative to the file that names them, as kubectl reads them)."""
    paths = [Path(p).expanduser() for p in kubeconfig.split(os.pathsep) if p.strip()]
    current: str | None = None
    named: dict[str, dict[str, tuple[dict[str, Any], Path]]] = {"contexts": {}, "clusters": {}, "users": {}}
    for path in paths:
        try:
            config = yaml.safe_load(path.read_text()) or {}
        except FileNotFoundError:
            if len(paths) == 1:
                raise CredentialsError(f"kubeconfig {path} does not exist") from None
            continue  # a missing file in a KUBECONFIG list is skipped, as kubectl does
        except (OSError, yaml.YAMLError) as error:
            raise CredentialsError(f"kubeconfig {path}: {error}") from error
        if not isinstance(config, dict):
            raise CredentialsError(f"kubeconfig {path} is not a kubeconfig (a YAML mapping)")
        current = current or config.get("current-context")
        for section, entries in named.items():
            entry_key = section[:-1]  # contexts -> context, ...
            for item in config.get(section) or []:
                if isinstance(item, dict) and item.get("name") not in entries:
                    entries[item["name"]] = (item.get(entry_key) or {}, path.parent)
    if not current or current not in named["contexts"]:
        raise CredentialsError(f"kubeconfig {kubeconfig}: no current context" + (f" {current!r}" if current else ""))
    context, _ = named["contexts"][current]
    if context.get("cluster") not in named["clusters"]:
        raise CredentialsError(f"kubeconfig {kubeconfig}: context {current!r} names no known cluster")
    cluster, cluster_dir = named["clusters"][context["cluster"]]
    user, user_dir = named["users"].get(context.get("user"), ({}, cluster_dir))
    for plugin in ("exec", "auth-provider"):
        if user.get(plugin):
            raise CredentialsError(
                f"kubeconfig {kubeconfig}: user {context.get('user')!r} authenticates through an `{plugin}` "
                "plugin, which the operator does not run; use a ServiceAccount token or a client certificate"
            )
    if not cluster.get("server"):
        raise CredentialsError(f"kubeconfig {kubeconfig}: cluster {context['cluster']!r} has no server")

    def file(value: str | None, base: Path) -> str | None:
        return str((base / Path(value).expanduser()).resolve()) if value else None

    return Credentials(
        server=cluster["server"],
        ca_file=file(cluster.get("certificate-authority"), cluster_dir),
        ca_data=_pem(cluster.get("certificate-authority-data")),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        cert_file=file(user.get("client-certificate"), user_dir),
        key_file=file(user.get("client-key"), user_dir),
        cert_data=_pem(user.get("client-certificate-data")),
        key_data=_pem(user.get("client-key-data")),
        token=user.get("token") or None,
        token_file=file(user.get("tokenFile"), user_dir),
        namespace=context.get("namespace") or None,
        proxy_url=cluster.get("proxy-url") or None,
        source=kubeconfig,
    )


def _pem(data: str | None) -> str | None:
    """kubeconfig `*-data` fields are base64 of PEM."""
    if not data:
        return None
    return data if data.lstrip().startswith("-----BEGIN") else base64.b64decode(data).decode("ascii")
