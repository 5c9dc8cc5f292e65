"""colocgrpo's developer tools: never installed with the product (`pip install colocgrpo`).

`colocgrpo-dev` (this package's command, `python -m colocgrpo_dev`) runs them:
- `colocgrpo-dev cluster up|down|status`: the local control plane with fake GPU nodes (`cluster/`);
- `colocgrpo-dev demo`: what `make demo` runs (`demo.py`).

The test suites and the benchmarks import the rest: the operator as a subprocess
(`operator_process.py`), the model builders (`models/`) and `ports.free_port`.
"""
