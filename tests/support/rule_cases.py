"""For each cross-field rule of the table (colocgrpo_training.rules), a change to the seed example that breaks it
and nothing else: the rule's own tests (tests/api/test_rules.py) and the API server's (tests/api/test_crd_cluster.py)
check both readers of the table on it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from colocgrpo_training import rules

REPO = Path(__file__).resolve().parents[2]

Spec = dict[str, Any]


def _set(section: str, **values: Any) -> Callable[[Spec], None]:
    def change(spec: Spec) -> None:
        spec.setdefault(section, {}).update(values)

    return change


def _both(*changes: Callable[[Spec], None]) -> Callable[[Spec], None]:
    def change(spec: Spec) -> None:
        for one in changes:
            one(spec)

    return change


def _tolerations(*items: dict[str, Any]) -> Callable[[Spec], None]:
    return _set("scheduling", tolerations=list(items))


BREAKS: dict[str, Callable[[Spec], None]] = {
    rules.TP_IN_ONE_NODE.name: _set("vllm", tensorParallelSize=3),
    rules.TP_ONE_WITHOUT_GPUS.name: _both(_set("resources", gpusPerNode=0), _set("vllm", tensorParallelSize=2)),
    rules.PARAM_OFFLOAD_NEEDS_ZERO3.name: _set("deepspeed", zeroStage=2, offloadParams="cpu", offloadOptimizer="cpu"),
    rules.OFFLOAD_NEEDS_ZERO3.name: _both(_set("vllm", offloadTrainerState=True), _set("deepspeed", zeroStage=2)),
    rules.OFFLOAD_WITHOUT_PARAM_OFFLOAD.name: _both(
        _set("vllm", offloadTrainerState=True), _set("deepspeed", offloadParams="cpu", offloadOptimizer="cpu")
    ),
    rules.OFFLOAD_NEEDS_SLEEP.name: _set("vllm", offloadTrainerState=True, sleepPolicy="off"),
    rules.OFFLOAD_NEEDS_ADAMW.name: _both(
        _set("vllm", offloadTrainerState=True), _set("trainerArgs", optim="adafactor")
    ),
    rules.MAX_MODEL_LEN_HOLDS_A_SEQUENCE.name: _both(
        _set("vllm", maxModelLen=1024), _set("trainerArgs", max_completion_length=1024)
    ),
    rules.MULTI_NODE_RESUME_NEEDS_A_CLAIM.name: _set("resources", nodes=2),
    rules.TOLERATION_WITHOUT_KEY.name: _tolerations({"operator": "Equal", "value": "x"}),
    rules.TOLERATION_EXISTS_WITHOUT_VALUE.name: _tolerations({"key": "gpu", "operator": "Exists", "value": "x"}),
    rules.TOLERATION_SECONDS_FOR_NO_EXECUTE.name: _tolerations(
        {"key": "gpu", "effect": "NoSchedule", "tolerationSeconds": 5}
    ),
}


def seed_job() -> dict[str, Any]:
    """examples/seed-qwen14b-tp4.yaml: 8 GPUs, TP 4, ZeRO-3, maxPromptTokens 512; every rule holds."""
    return yaml.safe_load((REPO / "examples" / "seed-qwen14b-tp4.yaml").read_text())


def broken(rule: rules.Rule) -> dict[str, Any]:
    """The seed example changed so that `rule`, and no other rule, does not hold."""
    job = seed_job()
    BREAKS[rule.name](job["spec"])
    return job
