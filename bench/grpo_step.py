"""`python -m bench.grpo_step`: the former name of `python -m bench.grpo` (bench/grpo/), which the
raw result files in bench/results/ name. Same arguments, same behaviour."""

import runpy

if __name__ == "__main__":
    runpy.run_module("bench.grpo", run_name="__main__", alter_sys=True)
