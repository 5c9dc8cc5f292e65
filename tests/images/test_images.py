"""The two images, statically: the Dockerfiles lint clean and start from bases this machine can make, the build's
inputs are what the Dockerfiles copy, and the trainer's pinned set resolves and agrees with itself.

The built images themselves are run in test_containers.py.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from images import build

REPO = Path(__file__).resolve().parents[2]
OPERATOR_DOCKERFILE = REPO / "Dockerfile"
TRAINER_DIR = REPO / "images" / "trainer"


def _load_lock_module():
    spec = importlib.util.spec_from_file_location("trainer_image_lock", TRAINER_DIR / "lock.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lock = _load_lock_module()


@pytest.mark.parametrize("dockerfile", [OPERATOR_DOCKERFILE, TRAINER_DIR / "Dockerfile"], ids=["operator", "trainer"])
def test_dockerfile_is_hadolint_clean(hadolint, dockerfile):
    result = subprocess.run(
        [str(hadolint), "--no-color", "--failure-threshold", "info", str(dockerfile)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_does_fail_on_a_bad_dockerfile(hadolint, tmp_path):
    # The lint test above is only worth something if hadolint really reports problems.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\nRUN pip install requests\n")
    result = subprocess.run([str(hadolint), "--no-color", str(bad)], capture_output=True, text=True)
    assert result.returncode != 0
    assert "DL3007" in result.stdout and "DL3008" in result.stdout and "DL3013" in result.stdout


# --- the operator image ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(build.IMAGES))
def test_every_base_is_one_this_machine_makes(name):
    """No registry is reached here: the build makes each base from Debian's packages, and refuses a Dockerfile whose
    base it cannot make. The earlier Dockerfiles started FROM python:3.11-slim and
    nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04, which is why they were never built; this test fails on them."""
    dockerfile = build.IMAGES[name].dockerfile
    assert build.dockerfile_bases(dockerfile) == ["debian:bookworm-slim"]
    assert build.unreproducible_bases(dockerfile) == []


def test_a_base_this_machine_cannot_make_is_named(tmp_path):
    old = tmp_path / "Dockerfile"
    old.write_text(
        "FROM nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04 AS build\nRUN true\n"
        "FROM python:3.11-slim\nCOPY --from=build /opt /opt\n"
    )
    assert build.unreproducible_bases(old) == ["nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04", "python:3.11-slim"]


def test_the_build_key_covers_what_each_dockerfile_copies():
    def inputs(name: str) -> set[str]:
        files = build.context_files(build.copied_sources(build.IMAGES[name].dockerfile))
        return {str(path.relative_to(REPO)) for path in files}

    trainer, operator = inputs("trainer"), inputs("operator")
    for must in (
        "training/colocgrpo_training/entrypoint.py",
        "operator/colocgrpo_operator/daemon.py",
        "pyproject.toml",
    ):
        assert must in trainer and must in operator
    assert {"images/trainer/constraints.txt", "examples/data/arith.jsonl", "images/trainer/gpu-wheels.lock"} <= trainer
    assert not any(path.startswith(("images/", "examples/")) for path in operator)
    assert not any("__pycache__" in path or path.endswith(".pyc") for path in trainer | operator)


def test_each_image_has_its_own_archive_under_the_cache(tmp_path):
    for name in build.IMAGES:
        path = build.archive_path(name, tmp_path)
        assert path.parent == tmp_path / "images"
        assert re.fullmatch(rf"{name}-[0-9a-f]{{16}}\.tar", path.name)
    assert build.reference("trainer") == f"docker.io/colocgrpo/trainer:{build.version()}"
    assert build.input_key("trainer") != build.input_key("operator")


def test_every_report_to_that_validate_accepts_is_pinned_in_the_trainer_image():
    from colocgrpo_operator.api.trainer_args import REPORT_TO

    package = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow-skinny"}
    assert set(REPORT_TO) == {"none", *package}
    assert {package[name] for name in package} <= lock.read_pins(lock.REQUIREMENTS).keys()


def test_operator_extra_has_no_ml_stack():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = {
        re.split(r"[<>=!~\[ ;]", dep, maxsplit=1)[0].lower()
        for dep in project["dependencies"] + project["optional-dependencies"]["operator"]
    }
    assert not names & {"torch", "vllm", "trl", "transformers", "deepspeed", "accelerate"}


# --- the trainer image's pins ---------------------------------------------------------------------


def test_trainer_requirements_are_exact_pins_of_the_matrix():
    pins = lock.read_pins(lock.REQUIREMENTS)  # raises on anything but name==version
    assert {"torch", "vllm", "trl", "deepspeed", "accelerate", "transformers", "datasets", "math-verify"} <= pins.keys()
    assert pins["torch"] == "2.11.0" and pins["vllm"] == "0.26.0" and pins["trl"] == "1.16.0"
    assert pins["deepspeed"] == "0.19.8"


def test_trainer_pins_agree_with_the_cpu_test_set():
    cpu = lock.read_pins(REPO / "training" / "requirements-cpu-test.txt")
    image = lock.read_pins(lock.REQUIREMENTS)
    for name, version in cpu.items():
        assert image.get(name) == version, f"{name}: trainer image {image.get(name)}, CPU test set {version}"


def test_trainer_pins_fall_in_the_trainer_and_gpu_extras():
    from packaging.requirements import Requirement

    image = lock.read_pins(lock.CONSTRAINTS)
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for line in extras["trainer"] + extras["gpu"]:
        requirement = Requirement(line)
        name = lock.normalize(requirement.name)
        assert name in image, f"the trainer extra needs {name}, the image lacks it"
        assert requirement.specifier.contains(image[name], prereleases=True), (
            f"{name}=={image[name]} is outside {line!r}"
        )


def test_lock_keeps_every_gpu_proven_version():
    proven = lock.proven_versions()
    locked = lock.read_pins(lock.CONSTRAINTS)
    assert len(proven) >= 30
    drift = {name: (version, locked.get(name)) for name, version in proven.items() if locked.get(name) != version}
    assert not drift, f"proven on the GPU -> locked: {drift}"
    # torch, transformers and accelerate were preinstalled on the GPU host (docs/gpu-proofs.md).
    assert (locked["torch"], locked["transformers"], locked["accelerate"]) == ("2.11.0", "5.17.0", "1.15.0")


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ("vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl  abc  303698761  site", "not a sha256"),
        (f"vllm-0.26.0-py3-none-any.whl  {'0' * 64}  303698761", "expected FILENAME SHA256 BYTES ROLE"),
        (f"vllm-0.26.0-py3-none-any.whl  {'0' * 64}  many  site", "not a size in bytes"),
        (f"vllm-0.26.0-py3-none-any.whl  {'0' * 64}  1  extra", "ROLE must be site, model or build"),
        (f"vllm-0.26.0.zip  {'0' * 64}  1  site", "neither a wheel nor an sdist"),
        (f"deepspeed-0.19.8.tar.gz  {'0' * 64}  1  model", "its ROLE is site"),
    ],
)
def test_a_bad_gpu_lock_line_is_a_clear_error(tmp_path, line, complaint):
    bad = tmp_path / "gpu-wheels.lock"
    bad.write_text(f"# comment\n\n{line}\n")
    with pytest.raises(ValueError, match=f"gpu-wheels.lock:3: .*{re.escape(complaint)}"):
        lock.read_gpu_lock(bad)


def _resolved_with_cache() -> dict[str, str]:
    """Resolve requirements + constraints (about a minute of PyPI metadata), cached by their content."""
    key_source = lock.REQUIREMENTS.read_bytes() + lock.CONSTRAINTS.read_bytes() + lock.GPU_LOCK.read_bytes()
    key = hashlib.sha256(key_source).hexdigest()[:16]
    cache = lock.cache_dir() / "trainer-resolve" / f"{key}.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    resolved = lock.resolve(lock.REQUIREMENTS, lock.CONSTRAINTS)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(resolved, indent=1, sort_keys=True))
    return resolved


@pytest.mark.slow
def test_trainer_pins_resolve_for_linux_x86_64_cpython_311():
    """pip's resolver, for the image's platform, accepts the matrix and the lock, and the lock is complete:
    it installs exactly the locked set (no package unpinned, none left over)."""
    resolved = _resolved_with_cache()
    locked = lock.read_pins(lock.CONSTRAINTS)
    assert resolved == locked, {
        "unlocked": sorted(set(resolved) - set(locked)),
        "stale": sorted(set(locked) - set(resolved)),
        "different": {n: (locked[n], resolved[n]) for n in set(locked) & set(resolved) if locked[n] != resolved[n]},
    }
    # torch's CUDA runtime is 13.0 (the nodes' driver must support it), and the nvcc that builds DeepSpeed's FusedAdam
    # into the image has the same major version (torch's extension builder refuses another).
    assert resolved["nvidia-cuda-runtime"].startswith("13.0.")
    assert resolved["nvidia-cuda-nvcc"].startswith("13.")
    assert "flash-attn" not in resolved  # opt-in only (Dockerfile build arg)
