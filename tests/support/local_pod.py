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
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

import yaml


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def render_pod(job_obj: dict[str, Any], work: Path, *, reward_modules_dir: Path | None = None) -> list[str]:
    """Write the job's launch files under `work` and return the pod command for machine rank 0."""
    from colocgrpo_operator.api import parse_job
    from colocgrpo_operator.api.naming import ACCELERATE_CONFIG_KEY, CONFIG_MOUNT_DIR, DEEPSPEED_CONFIG_KEY
    from colocgrpo_operator.render import render_config_map
    from colocgrpo_operator.render.workload import trainer_command

    job = parse_job(job_obj)
    work.mkdir(parents=True, exist_ok=True)
    files = dict(render_config_map(job)["data"])

    accelerate = yaml.safe_load(files[ACCELERATE_CONFIG_KEY])
    accelerate["main_process_ip"] = "127.0.0.1"
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
    command = [arg.replace(CONFIG_MOUNT_DIR, str(work)).replace("$(MACHINE_RANK)", "0") for arg in trainer_command(job)]
    if command[:2] == ["accelerate", "launch"]:  # the launcher of this interpreter's environment
        command = [sys.executable, "-m", "accelerate.commands.launch", *command[2:]]
    elif command[:1] == ["python"]:
        command = [sys.executable, *command[1:]]
    return command


def read_json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
