"""The operator side never imports torch, vllm, trl, transformers or deepspeed.

Runs in a fresh interpreter so nothing imported by other tests can hide a violation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "vllm", "trl", "transformers", "deepspeed", "accelerate", "datasets")

PROBE = """
import importlib, json, pkgutil, sys
import colocgrpo_operator
failed = {}
names = ["colocgrpo_operator"]
for info in pkgutil.walk_packages(colocgrpo_operator.__path__, "colocgrpo_operator."):
    if info.name.endswith("__main__"):
        continue  # running them would execute the CLI
    names.append(info.name)
for name in names:
    try:
        importlib.import_module(name)
    except Exception as error:
        failed[name] = repr(error)
# The operator may also use these light trainer modules.
importlib.import_module("colocgrpo_training.config")
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[1])))
print(json.dumps({"modules": names, "failed": failed, "heavy": heavy}))
"""


def test_operator_modules_import_no_ml_stack():
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'operator'}:{REPO / 'training'}")
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(HEAVY)], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"colocgrpo_operator.api", "colocgrpo_operator.render", "colocgrpo_operator.recipe"} <= set(
        report["modules"]
    )
    assert report["failed"] == {}
    assert report["heavy"] == []
