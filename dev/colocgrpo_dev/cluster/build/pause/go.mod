// Build module of the real node's pause program (build-node.sh); no dependencies.
module colocgrpo.dev/cluster/pause

go 1.26.0
