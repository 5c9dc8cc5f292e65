"""Benchmark drivers (`python -m bench.<name>`); docs/benchmarks/ says what each measures."""
