"""Two pods of one job: a job of 2 nodes x 2 GPUs with vLLM TP 2, rendered by the operator, both pods' commands run
on this host at once, each with its completion index as the kubelet expands it (`$(MACHINE_RANK)`).

The one host change: the headless Service's name for pod 0, which accelerate.yaml names as the rank-0 address,
resolves to 127.0.0.1 here (`support.local_pod.render_gang`). The pods rendezvous through it (accelerate launch with
two machines, DeepSpeed ZeRO-3 over gloo), train, save a complete checkpoint at step 3 into the volume they share
(spec.checkpoint.claimName), then pod 1 is killed mid-step as a failed node would be, and the gang is stopped as the
operator stops it before a restart. Started again, every rank of both pods resumes from that checkpoint, at step 3.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from colocgrpo_training.checkpoints import COMPLETE_MARKER
from support import rank_probe
from support.local_pod import SHORT_RUN, Launch, ProcessTree, cpu_pod_job, launch_gang, progress_steps, render_gang

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

torch = pytest.importorskip("torch")

NODES, GPUS, TP = 2, 2, 2
WORLD = NODES * GPUS
SAVE_STEPS = 3
LAUNCH_LIMIT_S = 300  # a gang takes about a minute on two loaded cores; past this it hangs


def job(root: Path, work: Path, model: Path, max_steps: int) -> dict:
    return cpu_pod_job(
        work,
        model,
        name="two-pods",
        gpus=GPUS,
        nodes=NODES,
        tp=TP,
        sleep_policy="auto",
        # Every pod mounts the same claim: here, the same folder.
        checkpoint={
            "path": str(root / "checkpoints"),
            "claimName": "checkpoints",
            "saveSteps": SAVE_STEPS,
            "saveFinalModel": False,
        },
        trainer_args={**SHORT_RUN, "max_steps": max_steps},
    )


def start_gang(root: Path, name: str, model: Path, env: dict[str, str], max_steps: int, until=None) -> list[Launch]:
    work = root / name
    pods = [work / f"pod-{index}" for index in range(NODES)]
    for pod in pods:
        pod.mkdir(parents=True)
    commands = render_gang(job(root, work, model, max_steps), work / "config", reward_modules_dir=work / "rewards")
    assert [command[command.index("--machine_rank") + 1] for command in commands] == ["0", "1"]
    env = {**env, rank_probe.DIR_ENV: str(work / "probe"), "PYTHONUNBUFFERED": "1"}
    return launch_gang(commands, pods, env, world=WORLD, limit_s=LAUNCH_LIMIT_S, probe_dir=work / "probe", until=until)


def saved(root: Path) -> Path:
    return root / "checkpoints" / f"checkpoint-{SAVE_STEPS}"


def kill_pod_1_after_the_checkpoint(root: Path, trees: list[ProcessTree]) -> bool:
    """Once checkpoint-3 is complete (training has gone on into step 4): pod 1 dies, then the gang is stopped."""
    if not (saved(root) / COMPLETE_MARKER).exists():
        return False
    trees[1].kill()
    trees[0].kill()
    return True


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("two-pods")


@pytest.fixture(scope="module")
def gangs(root, tiny_model_dir, pod_env) -> dict[str, list[Launch]]:
    env = pod_env(root)
    first = start_gang(
        root,
        "first",
        tiny_model_dir,
        env,
        max_steps=50,
        until=lambda trees: kill_pod_1_after_the_checkpoint(root, trees),
    )
    return {"first": first, "again": start_gang(root, "again", tiny_model_dir, env, max_steps=SAVE_STEPS + 2)}


def test_two_pods_rendezvous_train_and_save_one_complete_checkpoint(gangs, root):
    pod0, pod1 = gangs["first"]
    steps = progress_steps(pod0.stdout)
    assert sorted(set(steps))[: SAVE_STEPS + 1] == [0, 1, 2, 3], pod0.tail()  # step 0: the report before training
    for rank in range(WORLD):
        assert pod0.events(rank, "build"), f"rank {rank} built no engine\n{pod1.tail()}"
    # Both TP groups generated: one in each pod.
    assert {r["tp"] for rank in range(WORLD) for r in pod0.events(rank, "build")} == {TP}
    assert (saved(root) / COMPLETE_MARKER).exists()
    assert pod0.returncode != 0 and pod1.returncode != 0  # killed, not finished


def test_the_gang_started_again_resumes_every_rank_from_the_checkpoint(gangs, root):
    pod0, pod1 = gangs["again"]
    assert pod0.returncode == 0, pod0.tail()
    assert pod1.returncode == 0, pod1.tail()
    checkpoint = saved(root)
    for rank, pod in ((0, pod0), (1, pod0), (2, pod1), (3, pod1)):
        pattern = rf"rank{rank} WARNING \S+: resuming from {re.escape(str(checkpoint))}$"
        assert re.search(pattern, pod.stderr, re.MULTILINE), f"rank {rank} did not resume from {checkpoint}"
    # The first report is the step resumed at, then steps 4 and 5 (a step is reported again when it saves).
    steps = progress_steps(pod0.stdout)
    assert steps[0] == SAVE_STEPS and sorted(set(steps)) == [SAVE_STEPS, SAVE_STEPS + 1, SAVE_STEPS + 2], pod0.tail()
