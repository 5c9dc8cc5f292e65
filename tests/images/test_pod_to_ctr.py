"""The translation of a rendered pod into `ctr run` arguments (tests/support/pod_to_ctr.py), on its own: what the
container tests rely on it for."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from colocgrpo_operator.api import parse_job
from colocgrpo_operator.api.naming import COMPLETION_INDEX_KEY
from colocgrpo_operator.render import render_children
from support.pod_to_ctr import (
    DEFAULT_CAPABILITIES,
    PodIdentity,
    container_env,
    cpu_cores,
    ctr_run_args,
    expand,
    memory_bytes,
    prepare_volumes,
    process_args,
)

REPO = Path(__file__).resolve().parents[2]
IMAGE = {"config": {"User": "1000:1000", "Entrypoint": ["colocgrpo-launch"], "Cmd": ["--config_file", "a.yaml"]}}
POD = PodIdentity("tiny-cpu-0", "team-a", {COMPLETION_INDEX_KEY: "0"})


def rendered(example: str = "tiny-cpu.yaml", **spec: object) -> tuple[dict, dict, dict]:
    obj = yaml.safe_load((REPO / "examples" / example).read_text())
    obj["spec"].update(spec)
    children = render_children(parse_job(obj))
    pod_spec = children[-1]["spec"]["template"]["spec"]
    config_maps = {c["metadata"]["name"]: c["data"] for c in children if c["kind"] == "ConfigMap"}
    return pod_spec, pod_spec["containers"][0], config_maps


@pytest.mark.parametrize(
    ("quantity", "size"), [("2Gi", 2 * 2**30), ("512Mi", 512 * 2**20), ("1G", 10**9), ("1048576", 2**20), (64, 64)]
)
def test_memory_quantities(quantity, size):
    assert memory_bytes(quantity) == size


@pytest.mark.parametrize(("quantity", "cores"), [("1", 1.0), ("500m", 0.5), (2, 2.0), ("1.5", 1.5)])
def test_cpu_quantities(quantity, cores):
    assert cpu_cores(quantity) == cores


def test_dollar_paren_expansion_is_the_kubelets():
    env = {"MACHINE_RANK": "3"}
    assert expand("--machine_rank=$(MACHINE_RANK)", env) == "--machine_rank=3"
    assert expand("$(UNSET) $$(MACHINE_RANK) $$", env) == "$(UNSET) $(MACHINE_RANK) $"


def test_command_replaces_the_entrypoint_and_args_the_cmd():
    env = {"X": "1"}
    assert process_args({}, IMAGE, env) == ["colocgrpo-launch", "--config_file", "a.yaml"]
    assert process_args({"args": ["--help"]}, IMAGE, env) == ["colocgrpo-launch", "--help"]
    assert process_args({"command": ["python", "-c", "$(X)"]}, IMAGE, env) == ["python", "-c", "1"]
    assert process_args({"command": ["a"], "args": ["b"]}, IMAGE, env) == ["a", "b"]


def test_env_resolves_field_refs_and_refuses_secrets():
    _pod, container, _ = rendered()
    env = container_env(container, POD)
    assert env["POD_NAME"] == "tiny-cpu-0" and env["POD_NAMESPACE"] == "team-a" and env["MACHINE_RANK"] == "0"
    assert env["HF_HUB_OFFLINE"] == "1"
    with pytest.raises(ValueError, match="only value and fieldRef"):
        container_env({"env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}, POD)


def test_the_rendered_trainer_pod_becomes_ctr_options(tmp_path):
    pod_spec, container, config_maps = rendered()
    volumes = prepare_volumes(pod_spec, tmp_path, config_maps)
    assert set(volumes) == {"config", "checkpoints", "cache", "tmp"}  # dshm is a tmpfs
    assert (volumes["config"] / "grpo.yaml").read_text() == next(iter(config_maps.values()))["grpo.yaml"]
    assert volumes["tmp"].stat().st_mode & 0o777 == 0o777
    options = ctr_run_args(
        pod_spec,
        container,
        image="img",
        image_config=IMAGE,
        pod=POD,
        volumes=volumes,
        termination_log=tmp_path / "log",
        read_only_root=True,
    )
    assert options[-1] == "img"
    mounts = [options[i + 1] for i, option in enumerate(options) if option == "--mount"]
    assert f"type=bind,src={volumes['config']},dst=/etc/colocgrpo,options=rbind:ro" in mounts
    assert f"type=bind,src={volumes['tmp']},dst=/tmp,options=rbind:rw" in mounts
    assert any(m.startswith("type=tmpfs,src=tmpfs,dst=/dev/shm,") for m in mounts)
    assert f"type=bind,src={tmp_path / 'log'},dst=/dev/termination-log,options=rbind:rw" in mounts
    assert "--read-only" in options and "--seccomp" in options
    assert {f"--cap-drop={cap}" for cap in DEFAULT_CAPABILITIES} <= set(options)
    assert "--env=POD_NAME=tiny-cpu-0" in options
    assert f"--memory-limit={2 * 2**30}" in options and "--cpus=1.0" in options


def test_a_pod_user_ctr_cannot_run_as_is_refused(tmp_path):
    pod_spec, container, config_maps = rendered(podTemplate={"podSecurity": {"runAsUser": 2000, "runAsGroup": 2000}})
    volumes = prepare_volumes(pod_spec, tmp_path, config_maps)
    arguments = {"image": "img", "pod": POD, "volumes": volumes, "termination_log": tmp_path / "log"}
    with pytest.raises(ValueError, match="runs as uid 2000, the image as 1000:1000"):
        ctr_run_args(pod_spec, container, image_config=IMAGE, **arguments)
    root_image = {"config": {"User": "0:0"}}
    pod_spec, container, _ = rendered()
    with pytest.raises(ValueError):
        ctr_run_args(pod_spec, container, image_config=root_image, **arguments)
