"""Scripts that run the GPU proofs and benchmarks on a CUDA machine (docs/gpu-proofs.md)."""
