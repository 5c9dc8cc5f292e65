"""Resolve the trainer image's pins for Linux x86_64 / CPython 3.11 and write the full lock.

    python images/trainer/lock.py            # check: print the resolved set, change nothing
    python images/trainer/lock.py --write    # rewrite images/trainer/constraints.txt
    python images/trainer/lock.py --sdist-wheels DIR   # build gpu-wheels.lock's sdists into wheels under DIR

requirements.txt names the top-level versions; constraints.txt pins every package the image
installs, so a build next year installs what was resolved today. The lock is seeded with the
versions proven on a GPU (gpu-wheels.lock, the offline wheel set), so wherever a dependency was
part of that proof the image keeps the proven version. Resolution uses pip's own resolver with explicit
platform options (`pip install --dry-run --report`), so it runs on any machine that reaches PyPI,
without CUDA; only wheels are accepted, the way the image installs them. DeepSpeed is
source-only on PyPI: its sdist, pinned in gpu-wheels.lock, is built here into a wheel with its CUDA
ops off (no torch needed) and offered via --find-links.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
REQUIREMENTS = HERE / "requirements.txt"
CONSTRAINTS = HERE / "constraints.txt"
# The offline wheel set proven on a GPU host (tests/gpu/drivers/offline_wheels/ prepares and installs it).
GPU_LOCK = HERE / "gpu-wheels.lock"
# How an sdist of that lock becomes a wheel (DeepSpeed's setup.py): no prebuilt CUDA ops, which JIT-compile on first
# use, and the CUDA accelerator recorded in the wheel (with no torch on the building machine it would record "cpu").
SDIST_BUILD_ENV = {"DS_BUILD_OPS": "0", "DS_ACCELERATOR": "cuda"}

PYTHON_VERSION = "3.11"  # Debian 12's python3, the trainer image's interpreter
# Debian 12 (the image's debian:bookworm-slim base) has glibc 2.36: every manylinux tag up to 2_36 installs there.
GLIBC_MINOR = 36


class GpuLockEntry(NamedTuple):
    """One line of gpu-wheels.lock: a wheel or sdist from PyPI, pinned by sha256 and size."""

    filename: str
    sha256: str
    size: int
    role: str  # site | model | build

    @property
    def is_sdist(self) -> bool:
        return self.filename.endswith(".tar.gz")

    @property
    def name(self) -> str:
        return normalize(self.filename.split("-")[0])

    @property
    def version(self) -> str:
        return self.filename.removesuffix(".tar.gz").split("-")[1]


def read_gpu_lock(path: Path = GPU_LOCK) -> list[GpuLockEntry]:
    """Every entry of gpu-wheels.lock (FILENAME SHA256 BYTES ROLE; '#' lines are comments); raises on a bad line."""
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = line.split()
        where = f"{path.name}:{number}"
        if len(fields) != 4:
            raise ValueError(f"{where}: expected FILENAME SHA256 BYTES ROLE, got {line!r}")
        filename, sha256, size, role = fields
        if not (filename.endswith(".whl") or filename.endswith(".tar.gz")) or filename.count("-") < 1:
            raise ValueError(f"{where}: {filename!r} is neither a wheel nor an sdist filename")
        if not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise ValueError(f"{where}: {sha256!r} is not a sha256")
        if not size.isdigit():
            raise ValueError(f"{where}: {size!r} is not a size in bytes")
        if role not in ("site", "model", "build"):
            raise ValueError(f"{where}: ROLE must be site, model or build, got {role!r}")
        if filename.endswith(".tar.gz") and role != "site":
            raise ValueError(f"{where}: an sdist is built into a site wheel, so its ROLE is site, got {role!r}")
        entries.append(GpuLockEntry(filename, sha256, int(size), role))
    return entries


def platform_args() -> list[str]:
    tags = [f"manylinux_2_{minor}_x86_64" for minor in range(GLIBC_MINOR, 4, -1)]
    tags += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
    args = ["--python-version", PYTHON_VERSION, "--implementation", "cp"]
    for abi in (f"cp{PYTHON_VERSION.replace('.', '')}", "abi3", "none"):
        args += ["--abi", abi]
    for tag in tags:
        args += ["--platform", tag]
    return args


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, str]:
    """name -> version of every `name==version` line (comments and blanks skipped)."""
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        if not match:
            raise ValueError(f"{path.name}: {line!r} is not an exact pin (name==version)")
        pins[normalize(match.group(1))] = match.group(2)
    return pins


def proven_versions(path: Path = GPU_LOCK) -> dict[str, str]:
    """name -> version of what the GPU host installs (ROLE `site` in gpu-wheels.lock, sdists included)."""
    return {entry.name: entry.version for entry in read_gpu_lock(path) if entry.role == "site"}


def cache_dir() -> Path:
    return Path(os.environ.get("COLOCGRPO_CACHE") or Path.home() / ".cache" / "colocgrpo")


def _pip(pip_python: str, *args: str, env: dict[str, str] | None = None) -> None:
    result = subprocess.run([pip_python, "-m", "pip", *args], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"pip {args[0]} failed:\n{result.stdout[-2000:]}{result.stderr[-4000:]}")


def _hash_pins(path: Path, entries: list[GpuLockEntry]) -> Path:
    path.write_text("".join(f"{e.name}=={e.version} --hash=sha256:{e.sha256}\n" for e in entries))
    return path


def _fetch(pip_python: str, entries: list[GpuLockEntry], dest: Path, *options: str, **env: str) -> list[Path]:
    """Download `entries` into dest, each pinned to its sha256 (pip checks it); then check their sizes too."""
    pins = _hash_pins(dest.parent / f"{dest.name}.txt", entries)
    environ = {**os.environ, **env} if env else None
    _pip(
        pip_python,
        "download",
        "-q",
        "--no-deps",
        "--require-hashes",
        *options,
        "-d",
        str(dest),
        "-r",
        str(pins),
        env=environ,
    )
    for entry in entries:
        path = dest / entry.filename
        if not path.is_file() or path.stat().st_size != entry.size:
            raise RuntimeError(f"pip did not deliver {entry.filename} of {entry.size} bytes into {dest}")
    return [dest / entry.filename for entry in entries]


def sdist_wheels(pip_python: str = sys.executable, cache: Path | None = None, lock_path: Path = GPU_LOCK) -> Path:
    """A folder with a py3-none-any wheel built from each sdist of gpu-wheels.lock, for pip's --find-links and for
    the offline wheel set (prepare.sh calls this through `--sdist-wheels`).

    PyPI has only DeepSpeed's sdist. It is fetched pinned by its sha256 and built with SDIST_BUILD_ENV (CUDA ops
    off, as the trainer image builds it) by `pip wheel --no-deps --no-build-isolation`, with the lock's `build`
    wheels as the only build backend; no torch is needed. The folder is cached under `cache` (default
    ~/.cache/colocgrpo), keyed by the sha256 of the sdists and the build wheels, so the build runs once per lock.
    """
    entries = read_gpu_lock(lock_path)
    sdists = [e for e in entries if e.is_sdist]
    backend = [e for e in entries if e.role == "build"]
    if sdists and not backend:
        raise ValueError(f"{lock_path.name} has sdists but no ROLE build wheels (setuptools) to build them with")
    key = hashlib.sha256(" ".join(e.sha256 for e in sdists + backend).encode()).hexdigest()[:16]
    folder = (cache or cache_dir()) / "sdist-wheels" / key
    wanted = [f"{e.filename.split('-')[0]}-{e.version}-py3-none-any.whl" for e in sdists]
    if all((folder / name).is_file() for name in wanted):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        work = Path(tmp)
        # The build backend goes first on PYTHONPATH, ahead of anything the interpreter has; without build isolation
        # pip fetches nothing unpinned for it (also not to prepare the sdists' metadata while downloading them).
        wheels = _fetch(pip_python, backend, work / "backend-wheels", "--only-binary=:all:")
        _pip(
            pip_python,
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--target",
            str(work / "backend"),
            *map(str, wheels),
        )
        env = {**SDIST_BUILD_ENV, "PYTHONPATH": str(work / "backend")}
        sources = _fetch(pip_python, sdists, work / "sdists", "--no-binary=:all:", "--no-build-isolation", **env)
        for source in sources:
            _pip(
                pip_python,
                "wheel",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "--no-cache-dir",
                "-w",
                str(work / "built"),
                str(source),
                env={**os.environ, **env},
            )
        missing = [name for name in wanted if not (work / "built" / name).is_file()]
        if missing:
            got = sorted(p.name for p in (work / "built").glob("*"))
            raise RuntimeError(f"building {[e.filename for e in sdists]} gave {got}, not {missing}")
        if not folder.exists():  # another process may have finished first
            (work / "built").rename(folder)  # atomic: a half-built folder is never seen
    return folder


def resolve(requirements: Path, constraints: Path | None, pip_python: str = sys.executable) -> dict[str, str]:
    """What pip would install for the image: name -> version (raises with pip's output on conflict)."""
    wheels = sdist_wheels(pip_python)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        command = [
            pip_python,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            "--only-binary=:all:",
            *platform_args(),
            "--find-links",
            str(wheels),
            "-r",
            str(requirements),
        ]
        if constraints is not None:
            command += ["-c", str(constraints)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"the trainer pins do not resolve:\n{result.stderr[-4000:]}")
        data = json.loads(report.read_text())
    return {normalize(item["metadata"]["name"]): item["metadata"]["version"] for item in data["install"]}


def write_lock(resolved: dict[str, str]) -> None:
    lines = [
        "# GENERATED by `python images/trainer/lock.py --write` from requirements.txt, seeded with the",
        "# GPU-proven versions of gpu-wheels.lock. Every package the trainer image installs",
        f"# (CPython {PYTHON_VERSION}, Linux x86_64); the Dockerfile installs with `-c constraints.txt`.",
        *(f"{name}=={version}" for name, version in sorted(resolved.items())),
    ]
    CONSTRAINTS.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite constraints.txt")
    parser.add_argument(
        "--sdist-wheels",
        metavar="CACHE",
        type=Path,
        help="only build the wheels of gpu-wheels.lock's sdists under CACHE and print their paths",
    )
    parser.add_argument("--gpu-lock", type=Path, default=GPU_LOCK, help="the lock --sdist-wheels reads")
    args = parser.parse_args(argv)
    if args.sdist_wheels is not None:
        folder = sdist_wheels(cache=args.sdist_wheels, lock_path=args.gpu_lock)
        for entry in read_gpu_lock(args.gpu_lock):
            if entry.is_sdist:
                print(folder / f"{entry.filename.split('-')[0]}-{entry.version}-py3-none-any.whl")
        return 0
    proven = proven_versions()
    top_level = read_pins(REQUIREMENTS)
    with tempfile.TemporaryDirectory() as tmp:
        seed = Path(tmp) / "proven.txt"
        # The top-level pins win over the seed (they are the matrix); the seed fixes the rest.
        seed.write_text("".join(f"{n}=={v}\n" for n, v in proven.items() if n not in top_level))
        resolved = resolve(REQUIREMENTS, seed)
    for name, version in sorted(resolved.items()):
        mark = " (GPU-proven)" if proven.get(name) == version else ""
        print(f"{name}=={version}{mark}")
    if args.write:
        write_lock(resolved)
        print(f"wrote {CONSTRAINTS.relative_to(REPO)} ({len(resolved)} packages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
