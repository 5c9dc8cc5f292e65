"""Client certificates of the real node's kubelet and kube-proxy, signed with the cluster's own CA (kwokctl's
`pki/ca.key`), for the identities Kubernetes' built-in authorizers know:

- the kubelet as `system:node:<node>` in group `system:nodes` (the Node authorizer: it may read only what its
  own pods use);
- kube-proxy as `system:kube-proxy` (bound to `system:node-proxier` by default).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from colocgrpo_dev.cluster.commands import run


def client_certificate(folder: Path, name: str, subject: str, ca_cert: Path, ca_key: Path) -> tuple[Path, Path]:
    """Make `<name>.key` and `<name>.crt` (client auth, one year) in `folder`; returns (certificate, key)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise FileNotFoundError("openssl is needed to make the real node's certificates (apt-get install openssl)")
    folder.mkdir(parents=True, exist_ok=True)
    key, cert = folder / f"{name}.key", folder / f"{name}.crt"
    run([openssl, "genrsa", "-out", str(key), "2048"])
    run(
        [
            *(openssl, "req", "-x509", "-days", "365", "-key", str(key), "-out", str(cert), "-subj", subject),
            *("-CA", str(ca_cert), "-CAkey", str(ca_key)),
            *("-addext", "basicConstraints=critical,CA:FALSE", "-addext", "extendedKeyUsage=clientAuth"),
            *("-addext", "keyUsage=critical,digitalSignature,keyEncipherment"),
        ]
    )
    return cert, key
