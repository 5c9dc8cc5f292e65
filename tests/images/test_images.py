"""The two images: Dockerfiles lint clean, and the trainer's pinned set resolves and agrees with itself.

No Docker engine runs here, so the images are not built; what can be checked without one is.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

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


def test_operator_image_installs_only_the_operator_extra_and_runs_non_root():
    text = OPERATOR_DOCKERFILE.read_text()
    assert re.search(r"^FROM python:3\.11-slim", text, re.M)
    assert 'pip install --no-cache-dir ".[operator]"' in text
    assert 'ENTRYPOINT ["colocgrpo-operator"]' in text
    (user,) = re.findall(r"^USER (\S+)", text, re.M)
    uid = int(user.split(":")[0])
    assert uid != 0
    # The chart's default pod securityContext names the same user.
    values = yaml.safe_load((REPO / "charts" / "colocgrpo-operator" / "values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == uid


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
def test_trainer_pins_resolve_for_linux_x86_64_cpython_312():
    """pip's resolver, for the image's platform, accepts the matrix and the lock, and the lock is complete:
    it installs exactly the locked set (no package unpinned, none left over)."""
    resolved = _resolved_with_cache()
    locked = lock.read_pins(lock.CONSTRAINTS)
    assert resolved == locked, {
        "unlocked": sorted(set(resolved) - set(locked)),
        "stale": sorted(set(locked) - set(resolved)),
        "different": {n: (locked[n], resolved[n]) for n in set(locked) & set(resolved) if locked[n] != resolved[n]},
    }
    # torch's CUDA runtime is 13.0, matching the CUDA base image.
    assert resolved["nvidia-cuda-runtime"].startswith("13.0.")
    assert "flash-attn" not in resolved  # opt-in only (Dockerfile build arg)


@pytest.mark.slow
def test_operator_image_build_steps_install_a_working_operator_without_torch(tmp_path):
    """The operator Dockerfile's build stage, run here: copy exactly what it COPYs, install `.[operator]` into a
    fresh venv, and check the entrypoint and the user's commands start, and the ML stack and the official
    Kubernetes client are absent."""
    import shutil
    import venv

    text = OPERATOR_DOCKERFILE.read_text()
    build_stage = text.split("FROM python:3.11-slim", 2)[1]
    copied = re.findall(r"^COPY (?!--from)(.+) \S+$", build_stage, re.M)
    assert copied == ["pyproject.toml README.md", "operator/", "training/"], copied
    context = tmp_path / "src"
    context.mkdir()
    for source in " ".join(copied).split():
        path = REPO / source
        if path.is_dir():
            shutil.copytree(path, context / source, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(path, context / source)

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    clean_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", ".[operator]"],
        cwd=context,
        check=True,
        env=clean_env,
    )
    help_text = subprocess.run(
        [str(env_dir / "bin" / "colocgrpo-operator"), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=clean_env,
        check=True,
    ).stdout
    assert "--liveness-port" in help_text and "--trainer-image" in help_text
    for command in ("colocgrpo", "kubectl-colocgrpo"):
        user_help = subprocess.run(
            [str(env_dir / "bin" / command), "--help"], capture_output=True, text=True, env=clean_env, check=True
        ).stdout
        assert "watch" in user_help and "validate" in user_help
    probe = (
        "import importlib.util as u; "
        "print([m for m in ('torch','vllm','trl','transformers','deepspeed','kubernetes') if u.find_spec(m)])"
    )
    found = subprocess.run(
        [str(python), "-c", probe], cwd=tmp_path, capture_output=True, text=True, env=clean_env, check=True
    ).stdout.strip()
    assert found == "[]"
