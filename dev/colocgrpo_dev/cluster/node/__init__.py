"""The dev cluster's real node: a kubelet and kube-proxy built from the control plane's pinned module, on
containerd, runc and the CNI plugins from Debian's packages, with a locally built pause image and CoreDNS,
in a network namespace of its own. See docs/dev-cluster.md.

- node.py: RealNode, the node's lifecycle (start, stop, health, image import);
- network.py: its network namespace, link and address ranges; relay.py: the API server's relay on the link;
- config.py: containerd's, the CNI's, the kubelet's and kube-proxy's configuration;
- dns.py: the cluster DNS objects; oci.py: the single-binary images (pause, CoreDNS); pki.py: certificates;
- host.py: whether this machine can run it, and its Debian packages.
"""
