"""The trainer image's user and the pods the operator renders agree: same uid/gid, and every path the trainer
writes is on a volume the pod mounts writable for that user, HOME (the JIT caches) included, so the image runs on a
read-only root filesystem.

Read from the Dockerfile's text and the pods rendered offline; test_containers.py runs the built image in such a pod.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

import pytest
import yaml

from colocgrpo_operator.api import parse_job
from colocgrpo_operator.api.naming import TRAINER_GID, TRAINER_UID
from colocgrpo_operator.render import render_children
from colocgrpo_training.config import TrainerConfig

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "images" / "trainer" / "Dockerfile"
# Volumes a pod can write to (fsGroup makes a claim's root group-writable; an emptyDir is world-writable).
WRITABLE_SOURCES = ("emptyDir", "persistentVolumeClaim")


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the final stage, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    pairs = [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]
    last_from = max(i for i, (op, _) in enumerate(pairs) if op == "FROM")
    return pairs[last_from:]


def _image_user() -> tuple[int, int, str, list[str]]:
    """(uid, gid, HOME, the RUN lines before USER) of the trainer image."""
    instructions = _instructions()
    users = [(i, args) for i, (op, args) in enumerate(instructions) if op == "USER"]
    assert len(users) == 1, f"one USER instruction expected, got {users}"
    index, user = users[0]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and gid.isdigit(), f"USER must be numeric uid:gid (runAsNonRoot checks it), got {user}"
    homes = [m.group(1) for op, args in instructions if op == "ENV" for m in [re.search(r"\bHOME=(\S+)", args)] if m]
    assert homes, "the image sets no HOME"
    runs = [args for op, args in instructions[:index] if op == "RUN"]
    return int(uid), int(gid), homes[-1], runs


def _rendered_pod(example: str, **spec: object) -> tuple[dict, dict, TrainerConfig]:
    obj = yaml.safe_load((REPO / "examples" / example).read_text())
    obj["spec"].update(spec)
    children = {child["kind"]: child for child in render_children(parse_job(obj))}
    pod = children["Job"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    config = TrainerConfig.from_yaml(children["ConfigMap"]["data"]["grpo.yaml"])
    return pod, container, config


def test_image_user_is_the_uid_and_gid_the_pods_run_as():
    uid, gid, _home, _runs = _image_user()
    assert (uid, gid) == (TRAINER_UID, TRAINER_GID)
    assert uid != 0
    for example in ("tiny-cpu.yaml", "seed-qwen14b-tp4.yaml"):
        pod, container, _ = _rendered_pod(example)
        security = pod["securityContext"]
        assert (security["runAsUser"], security["runAsGroup"], security["fsGroup"]) == (uid, gid, gid), example
        assert security["runAsNonRoot"] is True and container["securityContext"]["runAsNonRoot"] is True


def _mount_for(path: str, pod: dict, container: dict) -> tuple[dict, dict] | None:
    """The container's mount that holds `path` (the deepest one), with its volume."""
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    holding = [
        mount
        for mount in container["volumeMounts"]
        if PurePosixPath(path) == PurePosixPath(mount["mountPath"])
        or PurePosixPath(mount["mountPath"]) in PurePosixPath(path).parents
    ]
    if not holding:
        return None
    mount = max(holding, key=lambda m: len(PurePosixPath(m["mountPath"]).parts))
    return mount, volumes[mount["name"]]


@pytest.mark.parametrize(
    ("example", "spec"),
    [
        ("tiny-cpu.yaml", {}),
        ("seed-qwen14b-tp4.yaml", {}),
        (
            "seed-qwen14b-tp4.yaml",
            {"checkpoint": {"claimName": "ckpt", "path": "/data/ckpt"}, "cache": {"claimName": "hf", "path": "/hf"}},
        ),
    ],
    ids=["cpu", "gpu", "gpu-claims"],
)
def test_every_path_the_trainer_writes_is_writable_for_its_user(example, spec):
    _uid, gid, home, _runs = _image_user()
    pod, container, config = _rendered_pod(example, **spec)
    env = {item["name"]: item.get("value") for item in container["env"]}
    # What the trainer (TRL, DeepSpeed, vLLM, Hugging Face) writes, as the rendered pod configures it.
    written = {
        "checkpoints (output_dir)": config.checkpoint.dir,
        "Hugging Face cache (HF_HOME)": env["HF_HOME"],
        "temporary files": "/tmp",
        "shared memory (NCCL, dataloaders)": "/dev/shm",
    }
    for what, path in written.items():
        found = _mount_for(path, pod, container)
        assert found is not None, f"{what} at {path} is on the image's filesystem, not on a volume"
        mount, volume = found
        assert not mount.get("readOnly"), f"{what} at {path} is under the read-only mount {mount['mountPath']}"
        assert any(source in volume for source in WRITABLE_SOURCES), f"{what}: volume {volume} is not writable"
        if "persistentVolumeClaim" in volume:
            assert pod["securityContext"]["fsGroup"] == gid, f"{what}: the claim is not group-writable for {gid}"

    # The termination message: the kubelet creates the file mode 0666 for any user, outside every volume.
    assert container["terminationMessagePath"] == env["COLOCGRPO_TERMINATION_LOG"]
    assert _mount_for(container["terminationMessagePath"], pod, container) is None

    # HOME (the JIT caches of DeepSpeed, Triton and vLLM) is on the pod's writable /tmp volume, and the pod keeps it.
    assert "HOME" not in env, "the pod must not move HOME away from the image's"
    found = _mount_for(home, pod, container)
    assert found is not None and "emptyDir" in found[1], f"HOME {home} is not on a writable volume"
    assert [args for op, args in _instructions() if op == "WORKDIR"][-1] == home
