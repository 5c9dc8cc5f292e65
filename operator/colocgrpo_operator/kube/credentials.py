"""Where the API server is and how to prove who we are: in-cluster or a kubeconfig.

The one credential path of the project: the operator's own client (kube/client.py),
kopf's session (settings.login) and the user CLI (`watch`, `logs`) all start from these
credentials, so they talk to the same server as the same identity. No dependency on the
official `kubernetes` package (the operator process never imports it; docs/decisions.md
says why this is the project's own code and not a client library).

Supported:
- the pod's ServiceAccount: the projected token is re-read as the kubelet rotates it (every
  TOKEN_REREAD_SECONDS, and at once after a 401), with the cluster CA;
- kubeconfig users with a bearer token (`token`, `tokenFile`), a client certificate
  (`client-certificate[-data]`, `client-key[-data]`), or an `exec` credential plugin
  (client.authentication.k8s.io/v1 or v1beta1 ExecCredential, as EKS, GKE and AKS
  kubeconfigs use): the command runs when a token is first needed, its token is kept until
  its `expirationTimestamp`, and it runs again then or after a 401.
- `auth-provider` users are refused by name: kubectl itself dropped the gcp and azure
  providers for exec plugins (gke-gcloud-auth-plugin, kubelogin).

A malformed kubeconfig (an entry without `name`, a section that is not a list, a context
without a cluster) is one CredentialsError naming the file and the entry.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# The kubelet refreshes a projected token well before it expires; re-reading the file this
# often is what the official clients do too.
TOKEN_REREAD_SECONDS = 60.0
# An exec plugin's token is renewed this long before its expirationTimestamp, so a request
# never leaves with a token that expires on the way.
EXEC_EXPIRY_MARGIN_SECONDS = 10.0
# An exec plugin that has not answered by then is treated as failed (it may be waiting for a
# browser login no one will complete).
EXEC_TIMEOUT_SECONDS = 60.0
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")


class CredentialsError(Exception):
    """No usable credentials (no kubeconfig, a broken one, a failing or unsupported plugin)."""


@dataclass(frozen=True)
class ExecPlugin:
    """A kubeconfig user's `exec` section, resolved (the command relative to the kubeconfig)."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = EXEC_API_VERSIONS[0]
    install_hint: str | None = None
    # KUBERNETES_EXEC_INFO's spec.cluster when the user asks for provideClusterInfo, else None.
    cluster_info: Mapping[str, Any] | None = None
    user: str = ""  # for messages

    def run(self, environ: Mapping[str, str] = os.environ) -> tuple[str, datetime | None]:
        """Run the plugin once: (token, expiry or None). Raises CredentialsError naming the user."""
        spec: dict[str, Any] = {"interactive": False}
        if self.cluster_info is not None:
            spec["cluster"] = dict(self.cluster_info)
        info = {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": spec}
        env = {**environ, **dict(self.env), "KUBERNETES_EXEC_INFO": json.dumps(info)}
        where = f"the exec plugin `{self.command}` of user {self.user!r}"
        hint = f" ({self.install_hint.strip()})" if self.install_hint else ""
        try:
            done = subprocess.run(
                [self.command, *self.args],
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=EXEC_TIMEOUT_SECONDS,
                check=False,
            )
        except FileNotFoundError:
            raise CredentialsError(f"{where} is not installed or not on PATH{hint}") from None
        except subprocess.TimeoutExpired:
            raise CredentialsError(f"{where} did not answer within {EXEC_TIMEOUT_SECONDS:g} s") from None
        except OSError as error:
            raise CredentialsError(f"{where} could not be started: {error}") from error
        if done.returncode != 0:
            detail = done.stderr.decode("utf-8", "replace").strip().splitlines()
            raise CredentialsError(
                f"{where} exited with {done.returncode}" + (f": {detail[-1]}" if detail else "") + hint
            )
        try:
            answer = json.loads(done.stdout)
        except ValueError:
            raise CredentialsError(f"{where} printed no ExecCredential JSON") from None
        if not isinstance(answer, dict) or answer.get("kind") != "ExecCredential":
            raise CredentialsError(f"{where} printed something other than an ExecCredential")
        if answer.get("apiVersion") != self.api_version:
            raise CredentialsError(
                f"{where} answered in {answer.get('apiVersion')!r}, but the kubeconfig asks for {self.api_version!r}"
            )
        status = answer.get("status")
        if not isinstance(status, dict):
            status = {}
        token = status.get("token")
        if not token or not isinstance(token, str):
            if status.get("clientCertificateData"):
                raise CredentialsError(f"{where} returned a client certificate; only token plugins are supported")
            raise CredentialsError(f"{where} returned no status.token")
        return token, _parse_expiry(status.get("expirationTimestamp"), where)


def _parse_expiry(value: Any, where: str) -> datetime | None:
    if value in (None, ""):
        return None
    try:
        expiry = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise CredentialsError(f"{where} returned an unreadable expirationTimestamp {value!r}") from None
    return expiry if expiry.tzinfo else expiry.replace(tzinfo=UTC)


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
    exec_plugin: ExecPlugin | None = None
    namespace: str | None = None
    proxy_url: str | None = None
    source: str = ""  # for messages: "in-cluster" or the kubeconfig path
    _file_token: tuple[float, str] | None = field(default=None, repr=False, compare=False)
    _exec_token: tuple[str, datetime | None] | None = field(default=None, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def bearer_token(self) -> str | None:
        """The token to send now: a static one, the token file's (re-read at most once a
        minute), or the exec plugin's (run again once its token is about to expire)."""
        if self.token:
            return self.token
        if self.exec_plugin is not None:
            with self._lock:
                if self._exec_token is None or _expired(self._exec_token[1]):
                    self._exec_token = self.exec_plugin.run()
                return self._exec_token[0]
        if not self.token_file:
            return None
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

    def cached_token(self) -> tuple[bool, str | None]:
        """(True, the token) when bearer_token() would answer without reading a file or running
        a plugin, else (False, None): for callers on an event loop, which must not block."""
        with self._lock:
            if self.token or (self.exec_plugin is None and not self.token_file):
                return True, self.token
            if self.exec_plugin is not None:
                fresh = self._exec_token is not None and not _expired(self._exec_token[1])
                return (True, self._exec_token[0]) if fresh and self._exec_token is not None else (False, None)
            if self._file_token is not None and time.monotonic() - self._file_token[0] < TOKEN_REREAD_SECONDS:
                return True, self._file_token[1]
            return False, None

    def refused(self, token: str | None) -> bool:
        """The server answered 401 to `token`: forget it, so the next bearer_token() re-reads
        the file or re-runs the plugin. True when a retry may get another token."""
        with self._lock:
            if self.exec_plugin is not None and self._exec_token is not None and self._exec_token[0] == token:
                self._exec_token = None
                return True
            if self.token_file and not self.token and self._file_token is not None and self._file_token[1] == token:
                self._file_token = None
                return True
        return False

    def token_expiry(self) -> datetime | None:
        """When the current token expires, if it is known to (an exec plugin said so)."""
        with self._lock:
            return self._exec_token[1] if self._exec_token is not None else None

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


def _expired(expiry: datetime | None) -> bool:
    return expiry is not None and (expiry - datetime.now(UTC)).total_seconds() <= EXEC_EXPIRY_MARGIN_SECONDS


def _temporary_pem(stack: contextlib.ExitStack, pem: str) -> str:
    handle = stack.enter_context(tempfile.NamedTemporaryFile("w", suffix=".pem"))  # noqa: SIM115 - the stack closes it
    handle.write(pem)
    handle.flush()
    return handle.name


def load_credentials(
    kubeconfig: str | None = None,
    environ: Mapping[str, str] = os.environ,
    service_account_dir: Path | None = None,
    context: str | None = None,
) -> Credentials:
    """In-cluster credentials when running in a pod (and neither a kubeconfig nor a context is
    named), else the kubeconfig: `kubeconfig`, $KUBECONFIG (several files joined by ':'),
    ~/.kube/config; its `context`, or its current context when None (kubectl's --context)."""
    service_account_dir = service_account_dir or SERVICE_ACCOUNT_DIR
    kubeconfig = kubeconfig or environ.get("KUBECONFIG") or None
    in_a_pod = environ.get("KUBERNETES_SERVICE_HOST") and (service_account_dir / "token").is_file()
    if not kubeconfig and not context and in_a_pod:
        return in_cluster_credentials(environ, service_account_dir)
    if not kubeconfig:
        default = Path(environ.get("HOME") or "~").expanduser() / ".kube" / "config"
        if not default.is_file():
            raise CredentialsError("no kubeconfig (pass --kubeconfig or set KUBECONFIG) and not running in a pod")
        kubeconfig = str(default)
    return kubeconfig_credentials(kubeconfig, context)


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


_SECTIONS = {"contexts": "context", "clusters": "cluster", "users": "user"}


def _named_entries(
    config: Mapping[str, Any], path: Path, named: dict[str, dict[str, tuple[dict[str, Any], Path]]]
) -> None:
    """Add the file's contexts, clusters and users to `named` (first definition wins), each
    checked to be a mapping with a `name` and a mapping under its section's key."""
    for section, entry_key in _SECTIONS.items():
        entries = config.get(section)
        if entries is None:
            continue
        if not isinstance(entries, list):
            raise CredentialsError(f"kubeconfig {path}: `{section}` is not a list")
        for index, item in enumerate(entries):
            where = f"kubeconfig {path}: {section}[{index}]"
            if not isinstance(item, dict):
                raise CredentialsError(f"{where} is not a mapping")
            name = item.get("name")
            if not isinstance(name, str) or not name:
                raise CredentialsError(f"{where} has no `name`")
            value = item.get(entry_key)
            if value is None:
                value = {}
            if not isinstance(value, dict):
                raise CredentialsError(f"{where} ({name!r}): `{entry_key}` is not a mapping")
            named[section].setdefault(name, (value, path.parent))


def _string(value: Any, where: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise CredentialsError(f"{where} is not a string")
    return value


def kubeconfig_credentials(kubeconfig: str, context: str | None = None) -> Credentials:
    """A context of a kubeconfig (or of several merged, first definition wins): `context`, else the
    current one. Relative file paths are relative to the file that names them, as kubectl reads them."""
    paths = [Path(p).expanduser() for p in kubeconfig.split(os.pathsep) if p.strip()]
    current: str | None = None
    named: dict[str, dict[str, tuple[dict[str, Any], Path]]] = {section: {} for section in _SECTIONS}
    for path in paths:
        try:
            config = yaml.safe_load(path.read_text()) or {}
        except FileNotFoundError:
            if len(paths) == 1:
                raise CredentialsError(f"kubeconfig {path} does not exist") from None
            continue  # a missing file in a KUBECONFIG list is skipped, as kubectl does
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise CredentialsError(f"kubeconfig {path}: {reason}") from error
        if not isinstance(config, dict):
            raise CredentialsError(f"kubeconfig {path} is not a kubeconfig (a YAML mapping)")
        current = current or _string(config.get("current-context"), f"kubeconfig {path}: current-context")
        _named_entries(config, path, named)
    if context:
        if context not in named["contexts"]:
            raise CredentialsError(f"kubeconfig {kubeconfig}: no context {context!r} (--context)")
        current = context
    if not current or current not in named["contexts"]:
        raise CredentialsError(f"kubeconfig {kubeconfig}: no current context" + (f" {current!r}" if current else ""))
    context_entry, _ = named["contexts"][current]
    cluster_name = _string(context_entry.get("cluster"), f"kubeconfig {kubeconfig}: context {current!r}: cluster")
    if cluster_name is None:
        raise CredentialsError(f"kubeconfig {kubeconfig}: context {current!r} names no cluster")
    if cluster_name not in named["clusters"]:
        raise CredentialsError(
            f"kubeconfig {kubeconfig}: context {current!r} names cluster {cluster_name!r}, not defined"
        )
    user_name = _string(context_entry.get("user"), f"kubeconfig {kubeconfig}: context {current!r}: user")
    cluster, cluster_dir = named["clusters"][cluster_name]
    if user_name is not None and user_name not in named["users"]:
        raise CredentialsError(f"kubeconfig {kubeconfig}: context {current!r} names user {user_name!r}, not defined")
    user, user_dir = named["users"].get(user_name or "", ({}, cluster_dir))
    in_cluster = f"kubeconfig {kubeconfig}: cluster {cluster_name!r}"
    in_user = f"kubeconfig {kubeconfig}: user {user_name!r}"
    if user.get("auth-provider"):
        raise CredentialsError(
            f"{in_user} authenticates through an `auth-provider`, which kubectl no longer supports either; "
            "use the provider's exec plugin (e.g. gke-gcloud-auth-plugin, kubelogin), a token or a client certificate"
        )
    server = _string(cluster.get("server"), f"{in_cluster}: server")
    if not server:
        raise CredentialsError(f"{in_cluster} has no server")

    def file(key: str, entry: Mapping[str, Any], base: Path, where: str) -> str | None:
        value = _string(entry.get(key), f"{where}: {key}")
        return str((base / Path(value).expanduser()).resolve()) if value else None

    return Credentials(
        server=server,
        ca_file=file("certificate-authority", cluster, cluster_dir, in_cluster),
        ca_data=_pem(
            _string(cluster.get("certificate-authority-data"), f"{in_cluster}: certificate-authority-data"),
            f"{in_cluster}: certificate-authority-data",
        ),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        cert_file=file("client-certificate", user, user_dir, in_user),
        key_file=file("client-key", user, user_dir, in_user),
        cert_data=_pem(
            _string(user.get("client-certificate-data"), f"{in_user}: client-certificate-data"),
            f"{in_user}: client-certificate-data",
        ),
        key_data=_pem(
            _string(user.get("client-key-data"), f"{in_user}: client-key-data"), f"{in_user}: client-key-data"
        ),
        token=_string(user.get("token"), f"{in_user}: token"),
        token_file=file("tokenFile", user, user_dir, in_user),
        exec_plugin=_exec_plugin(user.get("exec"), user_name or "", user_dir, cluster, in_user),
        namespace=_string(context_entry.get("namespace"), f"kubeconfig {kubeconfig}: context {current!r}: namespace"),
        proxy_url=_string(cluster.get("proxy-url"), f"{in_cluster}: proxy-url"),
        source=kubeconfig,
    )


def _exec_plugin(section: Any, user: str, base: Path, cluster: Mapping[str, Any], where: str) -> ExecPlugin | None:
    """A user's `exec` section as an ExecPlugin (None without one); every field checked."""
    if not section:
        return None
    if not isinstance(section, dict):
        raise CredentialsError(f"{where}: `exec` is not a mapping")
    api_version = _string(section.get("apiVersion"), f"{where}: exec.apiVersion")
    if api_version not in EXEC_API_VERSIONS:
        raise CredentialsError(
            f"{where}: exec.apiVersion {api_version!r} is not supported (use {' or '.join(EXEC_API_VERSIONS)})"
        )
    command = _string(section.get("command"), f"{where}: exec.command")
    if not command:
        raise CredentialsError(f"{where}: exec has no command")
    if os.sep in command and not Path(command).is_absolute():
        command = str((base / command).resolve())  # relative to the kubeconfig, as kubectl resolves it
    elif os.sep not in command:
        command = shutil.which(command) or command
    args = section.get("args") or []
    if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
        raise CredentialsError(f"{where}: exec.args is not a list of strings")
    env_entries = section.get("env") or []
    if not isinstance(env_entries, list):
        raise CredentialsError(f"{where}: exec.env is not a list")
    env: list[tuple[str, str]] = []
    for index, entry in enumerate(env_entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise CredentialsError(f"{where}: exec.env[{index}] has no `name`")
        env.append((entry["name"], str(entry.get("value") or "")))
    if section.get("interactiveMode") == "Always":
        raise CredentialsError(f"{where}: the exec plugin needs a terminal (interactiveMode: Always)")
    cluster_info = None
    if section.get("provideClusterInfo"):
        cluster_info = {
            key: value
            for key, value in {
                "server": cluster.get("server"),
                "certificate-authority-data": cluster.get("certificate-authority-data"),
                "insecure-skip-tls-verify": cluster.get("insecure-skip-tls-verify"),
                "proxy-url": cluster.get("proxy-url"),
                "config": _exec_extension(cluster),
            }.items()
            if value not in (None, "")
        }
    return ExecPlugin(
        command=command,
        args=tuple(args),
        env=tuple(env),
        api_version=api_version,
        install_hint=_string(section.get("installHint"), f"{where}: exec.installHint"),
        cluster_info=cluster_info,
        user=user,
    )


def _exec_extension(cluster: Mapping[str, Any]) -> Any:
    """The cluster's `client.authentication.k8s.io/exec` extension (handed to the plugin as
    spec.cluster.config, as client-go does), or None."""
    for entry in cluster.get("extensions") or []:
        if isinstance(entry, dict) and entry.get("name") == "client.authentication.k8s.io/exec":
            return entry.get("extension")
    return None


def _pem(data: str | None, where: str = "kubeconfig") -> str | None:
    """kubeconfig `*-data` fields are base64 of PEM."""
    if not data:
        return None
    if data.lstrip().startswith("-----BEGIN"):
        return data
    try:
        return base64.b64decode(data, validate=True).decode("ascii")
    except (ValueError, UnicodeDecodeError):
        raise CredentialsError(f"{where} is not base64 of a PEM block") from None
