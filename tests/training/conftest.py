"""Fixtures for the trainer tests (they run in the trainer venv, with torch)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random Qwen2 model + byte-level BPE tokenizer with a chat template, built offline."""
    from colocgrpo_dev.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the modules that use the control plane (`kube_cluster`) last, in their order: the session's control plane
    starts at its first use, and idles through every test after it. Its API server, etcd and controllers take about a
    tenth of a core while idle, which the rest of the suite (CPU-bound on two cores) would otherwise share with them."""
    uses = {item.module for item in items if "kube_cluster" in getattr(item, "fixturenames", ())}
    items[:] = [item for item in items if item.module not in uses] + [item for item in items if item.module in uses]


# A single CPU process: distributed variables that other tests left in this process must not
# make a trainer subprocess wait for a rendezvous.
_DISTRIBUTED_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


@pytest.fixture(scope="session")
def trainer_env() -> Callable[[Path], dict[str, str]]:
    """Environment for a trainer subprocess: offline, one thread, no cluster, no rendezvous."""

    def build(workdir: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _DISTRIBUTED_VARS and not k.startswith("ACCELERATE_")}
        env.update(
            COLOCGRPO_TERMINATION_LOG=str(workdir / "termination-log"),
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            HF_DATASETS_CACHE=str(workdir / "hf-datasets"),
            OMP_NUM_THREADS="1",
            TOKENIZERS_PARALLELISM="false",
        )
        env.pop("KUBECONFIG", None)
        return env

    return build


@pytest.fixture(scope="session")
def pod_env(trainer_env) -> Callable[[Path], dict[str, str]]:
    """`trainer_env` for a pod command launched here (`support.local_pod`): the CPU vLLM stand-in (written under the
    folder), tests/, the trainer and the operator on PYTHONPATH, so that every rank imports them by name."""
    from support import cpu_vllm

    repo = Path(__file__).resolve().parents[2]

    def build(workdir: Path) -> dict[str, str]:
        env = trainer_env(workdir)
        standin = cpu_vllm.write_package(workdir / "standin")
        paths = [standin, repo / "tests", repo / "training", repo / "operator", repo]
        env["PYTHONPATH"] = os.pathsep.join(str(path) for path in paths)
        return env

    return build
