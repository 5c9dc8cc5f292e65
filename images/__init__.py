"""Building and running the two images without a Docker daemon: `build` (buildah, `make images`) and `containerd`
(a containerd of its own that imports the built archives and runs them with `ctr`)."""
