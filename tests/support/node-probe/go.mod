// node-probe: a static program for the real node's tests, run in pods as a one-binary image.
module colocgrpo.dev/tests/nodeprobe

go 1.26.0
