"""Run a job's trainer pod on this host: the operator's rendered files and pod command, changed
only where a host that is not the cluster needs it.

`render_pod` writes the job's ConfigMap (grpo.yaml, accelerate.yaml, deepspeed.json, as
`render_config_map` renders them) into a folder and returns the pod's command
(`trainer_command`) with the mount paths replaced by that folder and `$(MACHINE_RANK)` by 0.
What changes: accelerate.yaml's rank-0 address (127.0.0.1: there is no headless Service), its
port (a free one: tests run side by side) and the DeepSpeed file's path; grpo.yaml's reward
module folder (the pod mounts the reward ConfigMap at a fixed path) and progress patching (no
cluster). Everything else — DEEPSPEED, `use_cpu: false`, the process count, ZeRO-3 — is the
operator's.

`launch_pod` runs such a command to its end under a hard time limit (a hang fails the test, it never stalls CI) and
returns what it printed and what every rank's probe (`support.rank_probe`) recorded.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from colocgrpo_dev.ports import free_port

# A reward that differs between completions of one prompt, so GRPO's advantages and updates are not zero.
VARIED_REWARD = """
def varied(completions, **kwargs):
    return [float(sum(map(ord, str(c))) % 7) for c in completions]
"""


# A short GRPO run for the CPU launches: 2 rows per micro-batch, 4 generations of 6 tokens, 2 micro-batches per
# optimizer step, a learning rate that moves the tiny model visibly.
SHORT_RUN: dict[str, Any] = {
    "per_device_train_batch_size": 2,
    "num_generations": 4,
    "max_completion_length": 6,
    "gradient_accumulation_steps": 2,
    "learning_rate": 0.05,
    "seed": 5,
}


def cpu_pod_job(
    work: Path,
    model: Path,
    *,
    name: str,
    gpus: int,
    tp: int,
    sleep_policy: str,
    checkpoint: dict[str, Any],
    trainer_args: dict[str, Any],
    prompts: int = 16,
    nodes: int = 1,
) -> dict[str, Any]:
    """A ColocGRPOJob of `nodes` pods of `gpus` processes each for pod commands launched here: `model` in float32,
    `prompts` arithmetic prompts (written to `work/train.jsonl`), the reward `cpu_rewards:varied` (written to
    `work/rewards`: pass that folder to `render_pod`), `trainer_args` over what every CPU launch needs (gloo, no
    dataloader workers)."""
    rows = [{"problem": f"What is {i} + {i + 1}?", "solution": f"${2 * i + 1}$"} for i in range(prompts)]
    (work / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (work / "rewards").mkdir(parents=True, exist_ok=True)
    (work / "rewards" / "cpu_rewards.py").write_text(VARIED_REWARD)
    return {
        "apiVersion": "colocgrpo.io/v1alpha1",
        "kind": "ColocGRPOJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": str(model), "dtype": "float32"},
            "dataset": {"name": str(work / "train.jsonl"), "maxPromptTokens": 32},
            "resources": {"nodes": nodes, "gpusPerNode": gpus},
            "vllm": {"tensorParallelSize": tp, "sleepPolicy": sleep_policy, "maxModelLen": 128},
            "rewards": [{"function": "cpu_rewards:varied"}],
            "rewardModules": {"configMapName": "rewards"},
            "checkpoint": checkpoint,
            # gloo: accelerate hands DeepSpeed no backend on a machine without CUDA, which then counts one process.
            "trainerArgs": {"ddp_backend": "gloo", "dataloader_num_workers": 0, "disable_tqdm": True, **trainer_args},
        },
    }


def render_pod(job_obj: dict[str, Any], work: Path, *, reward_modules_dir: Path | None = None) -> list[str]:
    """Write the job's launch files under `work` and return the pod command for machine rank 0."""
    return render_gang(job_obj, work, reward_modules_dir=reward_modules_dir)[0]


def render_gang(job_obj: dict[str, Any], work: Path, *, reward_modules_dir: Path | None = None) -> list[list[str]]:
    """Write the job's launch files under `work` (every pod mounts the same ConfigMap) and return each pod's command,
    by completion index: the rendered command with `$(MACHINE_RANK)` expanded as the kubelet does."""
    from colocgrpo_operator.api import parse_job
    from colocgrpo_operator.api.naming import ACCELERATE_CONFIG_KEY, CONFIG_MOUNT_DIR, DEEPSPEED_CONFIG_KEY
    from colocgrpo_operator.render import render_config_map
    from colocgrpo_operator.render.workload import trainer_command

    job = parse_job(job_obj)
    work.mkdir(parents=True, exist_ok=True)
    files = dict(render_config_map(job)["data"])

    accelerate = yaml.safe_load(files[ACCELERATE_CONFIG_KEY])
    accelerate["main_process_ip"] = "127.0.0.1"  # the headless Service's name for pod 0, resolved on this host
    accelerate["main_process_port"] = free_port()
    if "deepspeed_config" in accelerate:
        accelerate["deepspeed_config"]["deepspeed_config_file"] = str(work / DEEPSPEED_CONFIG_KEY)
    files[ACCELERATE_CONFIG_KEY] = yaml.safe_dump(accelerate, sort_keys=False)

    grpo = yaml.safe_load(files["grpo.yaml"])
    grpo["progress"]["patch_status"] = False
    if reward_modules_dir is not None:
        grpo["reward_modules_dir"] = str(reward_modules_dir)
    files["grpo.yaml"] = yaml.safe_dump(grpo, sort_keys=False)

    for name, text in files.items():
        (work / name).write_text(text)
    commands = []
    for machine_rank in range(job.spec.resources.nodes):
        command = [
            arg.replace(CONFIG_MOUNT_DIR, str(work)).replace("$(MACHINE_RANK)", str(machine_rank))
            for arg in trainer_command(job)
        ]
        if command[:1] in (["colocgrpo-launch"], ["colocgrpo-train"]):  # the console script of this environment
            command = [str(Path(sys.executable).parent / command[0]), *command[1:]]
        commands.append(command)
    return commands


class ProcessTree:
    """Every process a launched command started, as seen while it ran: torch's elastic agent starts each rank in a
    process session of its own, so killing the launcher's process group would leave hung ranks running, and a rank
    whose launcher is gone is re-parented where `children()` no longer finds it. `kill` ends all of them (psutil
    checks each one's start time, so a reused pid is never hit)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        import psutil

        self.proc = proc
        self.seen: dict[int, psutil.Process] = {}

    def refresh(self) -> None:
        import psutil

        try:
            launcher = psutil.Process(self.proc.pid)
            for process in [launcher, *launcher.children(recursive=True)]:
                self.seen.setdefault(process.pid, process)
        except psutil.NoSuchProcess:
            pass

    def kill(self) -> None:
        import psutil

        self.refresh()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        others = []
        for process in self.seen.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
                if process.pid != self.proc.pid:
                    others.append(process)
        # The launcher is reaped by subprocess alone: a psutil wait would take its exit status (returncode 0 after).
        self.proc.wait()
        psutil.wait_procs(others, timeout=30)


def read_json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def progress_steps(stdout: str) -> list[int]:
    """Steps of rank 0's progress lines (a line still being written is skipped)."""
    steps = []
    for line in stdout.splitlines():
        if line.startswith('{"progress"'):
            with contextlib.suppress(ValueError):
                steps.append(json.loads(line)["progress"]["step"])
    return steps


@dataclass
class Launch:
    """One launch of a pod command: its exit status, output and every rank's probe records."""

    work: Path
    returncode: int
    stdout: str
    stderr: str
    records: dict[int, list[dict]] = field(default_factory=dict)

    def events(self, rank: int, kind: str) -> list[dict]:
        return [r for r in self.records[rank] if r["event"] == kind]

    def tail(self) -> str:
        return f"--- stderr ---\n{self.stderr[-6000:]}\n--- stdout ---\n{self.stdout[-2000:]}"

    def exit_codes(self) -> dict[int, int]:
        """Every rank's exit code, from the launcher's failure report (torch's elastic agent lists
        each rank once any failed: those that ended by themselves, then those it stopped)."""
        found = re.findall(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)", self.stderr)
        return {int(rank): int(code) for rank, code in found}

    def progress_steps(self) -> list[int]:
        return progress_steps(self.stdout)


def launch_probed(job_obj: dict[str, Any], work: Path, env: dict[str, str], probe: dict[str, str], **limits) -> Launch:
    """Render `job_obj` under `work` (its reward modules in `work/rewards`) and launch its pod command (`launch_pod`
    with `limits`: world, limit_s), every rank's probe (`support.rank_probe`) recording into `work/probe` with the
    settings `probe`, the termination message in `work/termination-log`."""
    from support import rank_probe

    command = render_pod(job_obj, work / "config", reward_modules_dir=work / "rewards")
    env = {
        **env,
        rank_probe.DIR_ENV: str(work / "probe"),
        "COLOCGRPO_TERMINATION_LOG": str(work / "termination-log"),
        "PYTHONUNBUFFERED": "1",
        **probe,
    }
    return launch_pod(command, work, env, probe_dir=work / "probe", **limits)


def launch_pod(
    command: list[str],
    work: Path,
    env: dict[str, str],
    *,
    world: int,
    limit_s: float,
    probe_dir: Path,
    until: Callable[[], bool] | None = None,
) -> Launch:
    """Run `command` in `work` (stdout.log and stderr.log there) in a process group of its own, killed with every
    rank once `limit_s` has passed, which fails the calling test. `until`, while it returns False, is called
    every 0.2 s as the launch runs (to act on it, e.g. signal a rank); the probe records of ranks 0 to
    `world - 1` are read from `probe_dir` at the end."""
    act = None if until is None else (lambda trees: until())
    (launch,) = launch_gang([command], [work], env, world=world, limit_s=limit_s, probe_dir=probe_dir, until=act)
    return launch


def launch_gang(
    commands: list[list[str]],
    works: list[Path],
    env: dict[str, str],
    *,
    world: int,
    limit_s: float,
    probe_dir: Path,
    until: Callable[[list[ProcessTree]], bool] | None = None,
) -> list[Launch]:
    """`launch_pod` for the pods of one job at once: command i runs in `works[i]`. `until` gets every pod's process
    tree (to kill a pod, as a node that fails would); the launch ends when every pod has ended. Each Launch carries
    every rank's probe records."""
    import pytest

    with contextlib.ExitStack() as files:
        procs = []
        for command, work in zip(commands, works, strict=True):
            out = files.enter_context(open(work / "stdout.log", "w"))
            err = files.enter_context(open(work / "stderr.log", "w"))
            procs.append(subprocess.Popen(command, cwd=work, env=env, stdout=out, stderr=err, start_new_session=True))
        trees = [ProcessTree(proc) for proc in procs]
        deadline = time.monotonic() + limit_s
        try:
            while any(proc.poll() is None for proc in procs):
                for tree in trees:
                    tree.refresh()
                if time.monotonic() > deadline:
                    for tree in trees:
                        tree.kill()
                    stderr = "\n".join((work / "stderr.log").read_text(errors="replace")[-4000:] for work in works)
                    pytest.fail(f"{works[0].name}: no exit within {limit_s} s (a hang)\n{stderr}")
                if until is not None and until(trees):
                    until = None  # done: no more calls
                time.sleep(0.2)
        finally:
            for tree in trees:
                tree.kill()  # a rank left behind by its launcher too
    records = {rank: read_json_lines(probe_dir / f"rank{rank}.jsonl") for rank in range(world)}
    return [
        Launch(
            work,
            proc.returncode,
            (work / "stdout.log").read_text(errors="replace"),
            (work / "stderr.log").read_text(errors="replace"),
            records,
        )
        for proc, work in zip(procs, works, strict=True)
    ]
