"""`make images` (`python -m images.build`): the operator and trainer images, built from their own Dockerfiles with
buildah, without a Docker daemon, each exported as an OCI archive under the cache folder.

    python -m images.build                          # both images
    python -m images.build trainer                  # one of them
    python -m images.build --print-archive trainer  # the archive path of the current inputs (builds nothing)

Per image:

1. Each base its Dockerfile names is made here from Debian's packages with mmdebstrap, once, and stored in buildah's
   storage under the name the Dockerfile uses (`BASES`), so the Dockerfile builds unchanged on a machine that reaches
   only Debian's archive and PyPI. docs/install.md says how such a base differs from the one a registry serves.
2. `buildah bud --layers`: a layer is rebuilt only when its instruction, an earlier layer or the files it copies
   change; the Dockerfiles put the code last, so a change to operator/ or training/ rebuilds only their last layers.
   The Dockerfiles' pip cache mount is the host's pip cache, so a wheel is downloaded once for the image and the
   trainer test venv alike, and a CA bundle for pip is passed as a build secret (`pip_ca_bundle`).
3. `buildah push` to `oci-archive:$CACHE/images/<name>-<key>.tar` (`archive_path`), named by the image's reference
   (`docker.io/colocgrpo/<name>:<version>`, what a kubelet resolves `colocgrpo/<name>:<version>` to). The key hashes
   everything the image is built from (`input_key`): when that archive exists, nothing is built. An image's older
   archive is removed first (exporting the trainer needs room for its layers uncompressed and for the archive).

What it keeps, under $COLOCGRPO_CACHE (default ~/.cache/colocgrpo):

    buildah/storage        buildah's images and layers (overlay driver)
    buildah/tmp            buildah's temporary files; buildah-cache/pip is a link to the host's pip cache (pip/)
    images/<name>-<key>.tar  the current archive of each image

buildah's run state lives in the system's temporary folder (it must not outlive a boot). Needs root, buildah,
mmdebstrap and the network to Debian's archive and PyPI (`make images` installs the tools with apt-get).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import fnmatch
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

REPO = Path(__file__).resolve().parents[1]
# Bump when the way an image is built changes without any input file changing (buildah flags, export format).
BUILD_FORMAT = "1"
# The label a reproduced base carries: the key of the recipe it was made from.
BASE_RECIPE_LABEL = "io.colocgrpo.base-recipe"
REGISTRY = "docker.io"
# pip's CA bundle inside the build, as the Dockerfiles read it (ARG PIP_CERT, secret pip-ca).
PIP_CA_SECRET = "pip-ca"
SYSTEM_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
TOOLS_HINT = "apt-get install buildah mmdebstrap containerd runc (`make images` does it)"


@dataclass(frozen=True)
class ImageSpec:
    """One image of the project: its short name, repository and Dockerfile (the context is the repository root)."""

    name: str
    repository: str
    dockerfile: Path


IMAGES: dict[str, ImageSpec] = {
    "operator": ImageSpec("operator", "colocgrpo/operator", REPO / "Dockerfile"),
    "trainer": ImageSpec("trainer", "colocgrpo/trainer", REPO / "images" / "trainer" / "Dockerfile"),
}


@dataclass(frozen=True)
class DebianSlimBase:
    """A Debian `<suite>-slim` root filesystem made with mmdebstrap, standing in for Docker Hub's `debian:<suite>-slim`.

    Docker Hub's image is made by debuerreotype: debootstrap's minbase variant, then its "slim" dpkg excludes and apt
    settings. This recipe makes the same package set (mmdebstrap's minbase: Essential and Priority required, and apt,
    with /usr merged the way debootstrap does it) from the current archive, and writes the same dpkg excludes, apt
    settings and deb822 sources.
    """

    suite: str
    mirror: str = "http://deb.debian.org/debian"
    security_mirror: str = "http://deb.debian.org/debian-security"

    # debuerreotype-slimify's excludes: no documentation (but the copyright files), manuals or translations.
    DPKG_EXCLUDES: ClassVar[tuple[str, ...]] = (
        "path-exclude=/usr/share/doc/*",
        "path-include=/usr/share/doc/*/copyright",
        "path-exclude=/usr/share/groff/*",
        "path-exclude=/usr/share/info/*",
        "path-exclude=/usr/share/linda/*",
        "path-exclude=/usr/share/lintian/overrides/*",
        "path-exclude=/usr/share/locale/*",
        "path-exclude=/usr/share/man/*",
    )
    # debuerreotype's apt settings for containers (/etc/apt/apt.conf.d/docker-*).
    APT_SETTINGS: ClassVar[dict[str, str]] = {
        "docker-autoremove-suggests": 'Apt::AutoRemove::SuggestsImportant "false";\n',
        "docker-clean": (
            'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb '
            '/var/cache/apt/*.bin || true"; };\n'
            'APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb '
            '/var/cache/apt/*.bin || true"; };\n'
            'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n'
        ),
        "docker-gzip-indexes": 'Acquire::GzipIndexes "true";\n',
        "docker-no-languages": 'Acquire::Languages "none";\n',
    }

    def sources(self) -> str:
        """/etc/apt/sources.list.d/debian.sources, as in Docker Hub's image."""
        keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
        return (
            f"Types: deb\nURIs: {self.mirror}\nSuites: {self.suite} {self.suite}-updates\nComponents: main\n"
            f"Signed-By: {keyring}\n\n"
            f"Types: deb\nURIs: {self.security_mirror}\nSuites: {self.suite}-security\nComponents: main\n"
            f"Signed-By: {keyring}\n"
        )

    def customize_hooks(self) -> list[str]:
        """mmdebstrap --customize-hook commands ("$1" is the new root): sources, apt settings, no package lists."""
        hooks = [
            'rm -f "$1/etc/apt/sources.list"',
            f'printf %s {shlex.quote(self.sources())} > "$1/etc/apt/sources.list.d/debian.sources"',
        ]
        hooks += [
            f'printf %s {shlex.quote(text)} > "$1/etc/apt/apt.conf.d/{name}"'
            for name, text in self.APT_SETTINGS.items()
        ]
        hooks.append('rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/apt/*')
        return hooks

    def mmdebstrap_args(self, tarball: Path) -> list[str]:
        """The mmdebstrap command line that writes the root filesystem to `tarball`."""
        args = ["mmdebstrap", "--variant=minbase", "--format=tar", "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr"]
        args += [f"--dpkgopt={option}" for option in self.DPKG_EXCLUDES]
        args += [f"--customize-hook={hook}" for hook in self.customize_hooks()]
        return [*args, self.suite, str(tarball), f"deb {self.mirror} {self.suite} main"]

    def key(self) -> str:
        """What the base is made from: the recipe, not the day it was made (so it is made once and kept)."""
        return hashlib.sha256("\0".join(self.mmdebstrap_args(Path("OUT"))).encode()).hexdigest()[:16]


# The public bases the Dockerfiles may name, and how this machine makes each without a registry.
BASES: dict[str, DebianSlimBase] = {"debian:bookworm-slim": DebianSlimBase("bookworm")}


def cache_dir() -> Path:
    return Path(os.environ.get("COLOCGRPO_CACHE") or Path.home() / ".cache" / "colocgrpo")


def version() -> str:
    """The project's version (pyproject.toml), the images' tag."""
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def reference(name: str) -> str:
    """The image's full reference, e.g. `docker.io/colocgrpo/trainer:0.1.0`."""
    return f"{REGISTRY}/{IMAGES[name].repository}:{version()}"


def _instructions(dockerfile: Path) -> list[tuple[str, list[str]]]:
    """(INSTRUCTION, words) of every instruction; continuation lines joined, comments dropped."""
    lines = [line for line in dockerfile.read_text().splitlines() if not line.lstrip().startswith("#")]
    text = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in text.splitlines():
        words = line.split()
        if words:
            out.append((words[0].upper(), words[1:]))
    return out


def dockerfile_bases(dockerfile: Path) -> list[str]:
    """The images the Dockerfile's stages start FROM (not its own stages)."""
    stages: set[str] = set()
    bases = []
    for op, words in _instructions(dockerfile):
        if op != "FROM":
            continue
        words = [w for w in words if not w.startswith("--")]
        if words[0] not in stages and words[0] != "scratch":
            bases.append(words[0])
        if len(words) == 3 and words[1].upper() == "AS":
            stages.add(words[2])
    return bases


def unreproducible_bases(dockerfile: Path) -> list[str]:
    """The Dockerfile's bases that this machine cannot make (no registry is reached here): each must be in BASES."""
    return [base for base in dockerfile_bases(dockerfile) if base not in BASES]


def copied_sources(dockerfile: Path) -> list[str]:
    """The context paths the Dockerfile's COPY and ADD instructions name (not COPY --from a stage)."""
    sources = []
    for op, words in _instructions(dockerfile):
        if op not in ("COPY", "ADD") or any(w.startswith("--from") for w in words):
            continue
        paths = [w for w in words if not w.startswith("--")]
        sources += paths[:-1]
    return sources


def _ignored_names() -> list[str]:
    """.dockerignore's `**/PATTERN` lines: names left out of the context wherever they are."""
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip()[3:] for line in lines if line.strip().startswith("**/")]


def context_files(sources: list[str]) -> list[Path]:
    """Every file the sources take from the context, sorted; names .dockerignore leaves out anywhere are skipped."""
    ignored = _ignored_names()
    files: set[Path] = set()
    for source in sources:
        path = REPO / source
        if not path.exists():
            raise FileNotFoundError(f"the Dockerfile copies {source}, which is not in {REPO}")
        candidates = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        for candidate in candidates:
            parts = candidate.relative_to(REPO).parts
            if not any(fnmatch.fnmatch(part, pattern) for part in parts for pattern in ignored):
                files.add(candidate)
    return sorted(files)


def input_key(name: str) -> str:
    """A hash of what the image is built from: the Dockerfile, every file it copies, its bases' recipes, the build's
    format. Equal keys give equal images (up to what the network serves, which the lock files pin)."""
    spec = IMAGES[name]
    digest = hashlib.sha256(f"{BUILD_FORMAT}\0{name}\0{version()}\0".encode())
    digest.update(spec.dockerfile.read_bytes())
    for base in dockerfile_bases(spec.dockerfile):
        digest.update(f"\0base {base} {BASES[base].key() if base in BASES else '?'}".encode())
    for path in context_files(copied_sources(spec.dockerfile)):
        mode = "x" if os.access(path, os.X_OK) else "-"
        digest.update(f"\0{path.relative_to(REPO)} {mode}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def archive_path(name: str, cache: Path | None = None) -> Path:
    """Where the image built from the current inputs is, or will be, as an OCI archive."""
    return (cache or cache_dir()) / "images" / f"{name}-{input_key(name)}.tar"


def pip_ca_bundle() -> Path | None:
    """The CA bundle pip inside the build trusts: $PIP_CERT, else the system's bundle; None if neither exists."""
    for candidate in (os.environ.get("PIP_CERT"), SYSTEM_CA_BUNDLE):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def _say(text: str) -> None:
    print(f"==> {text}", flush=True)


class Buildah:
    """buildah with its storage under the cache folder."""

    def __init__(self, cache: Path):
        self.cache = cache
        self.storage = cache / "buildah" / "storage"
        self.tmp = cache / "buildah" / "tmp"
        self.runroot = self.runroot_for(cache)
        for tool in ("buildah", "mmdebstrap"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"{tool} is not installed: {TOOLS_HINT}")
        if os.geteuid() != 0:
            raise RuntimeError("building the images needs root (buildah's chroot isolation, mmdebstrap)")
        self._share_pip_cache()

    @staticmethod
    def runroot_for(cache: Path) -> Path:
        """buildah's run state (mounts, locks): it must not outlive a boot, nor travel with a restored cache folder."""
        key = hashlib.sha256(str(cache / "buildah" / "storage").encode()).hexdigest()[:8]
        return Path("/run") / f"colocgrpo-buildah-{key}"

    def _share_pip_cache(self) -> None:
        """buildah keeps a `RUN --mount=type=cache,target=/root/.cache/pip` mount at $TMPDIR/buildah-cache/<target
        path>; make that the host's pip cache."""
        pip_cache = Path(os.environ.get("PIP_CACHE_DIR") or self.cache / "pip")
        pip_cache.mkdir(parents=True, exist_ok=True)
        mount = self.tmp / "buildah-cache" / "root" / ".cache" / "pip"
        mount.parent.mkdir(parents=True, exist_ok=True)
        if mount.is_symlink() and mount.resolve() == pip_cache.resolve():
            return
        if mount.is_symlink() or mount.is_file():
            mount.unlink()
        elif mount.is_dir():
            shutil.rmtree(mount)
        mount.symlink_to(pip_cache.resolve())

    def command(self) -> list[str]:
        return ["buildah", "--root", str(self.storage), "--runroot", str(self.runroot), "--storage-driver", "overlay"]

    def run(self, *args: str, capture: bool = False) -> str:
        env = {**os.environ, "TMPDIR": str(self.tmp)}
        self.tmp.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(
            [*self.command(), *args], env=env, text=True, stdout=subprocess.PIPE if capture else None
        )
        if result.returncode != 0:
            raise RuntimeError(f"buildah {args[0]} failed ({result.returncode}): {shlex.join(args)}")
        return result.stdout or ""

    def image_label(self, ref: str, label: str) -> str | None:
        """The label of a stored image, or None when there is no such image (or label)."""
        env = {**os.environ, "TMPDIR": str(self.tmp)}
        template = f'{{{{index .OCIv1.Config.Labels "{label}"}}}}'
        result = subprocess.run(
            [*self.command(), "inspect", "--type", "image", "--format", template, ref],
            env=env,
            text=True,
            capture_output=True,
        )
        value = result.stdout.strip()
        return value if result.returncode == 0 and value not in ("", "<no value>") else None


def ensure_base(buildah: Buildah, name: str) -> None:
    """Make the base `name` (a key of BASES) unless its current recipe is stored already."""
    recipe = BASES[name]
    ref = f"{REGISTRY}/library/{name}"
    key = recipe.key()
    if buildah.image_label(ref, BASE_RECIPE_LABEL) == key:
        return
    _say(f"making {name} from Debian's packages with mmdebstrap (once)")
    started = time.monotonic()
    buildah.tmp.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=buildah.tmp) as tmp:
        tarball = Path(tmp) / "rootfs.tar"
        subprocess.run(recipe.mmdebstrap_args(tarball), check=True, env={**os.environ, "TMPDIR": tmp})
        container = buildah.run("from", "--pull=never", "scratch", capture=True).strip()
        try:
            buildah.run("add", "--quiet", container, str(tarball), "/")
            buildah.run(
                "config",
                "--cmd",
                '["bash"]',
                "--env",
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--label",
                f"{BASE_RECIPE_LABEL}={key}",
                container,
            )
            buildah.run("commit", "--quiet", "--rm", container, ref)
        except BaseException:
            subprocess.run([*buildah.command(), "rm", container], capture_output=True)
            raise
    _say(f"{name} made in {time.monotonic() - started:.0f} s")


def build_args() -> list[str]:
    """Build options beyond the Dockerfile: pip's CA bundle as a secret, when there is one."""
    bundle = pip_ca_bundle()
    if bundle is None:
        return []
    return ["--secret", f"id={PIP_CA_SECRET},src={bundle}", "--build-arg", f"PIP_CERT=/run/secrets/{PIP_CA_SECRET}"]


def build(name: str, cache: Path | None = None) -> Path:
    """The image's archive for the current inputs: kept if it exists, else built (layers reused) and exported."""
    cache = cache or cache_dir()
    spec = IMAGES[name]
    archive = archive_path(name, cache)
    if archive.is_file():
        _say(f"{name}: {archive} is current")
        return archive
    missing = unreproducible_bases(spec.dockerfile)
    if missing:
        raise RuntimeError(
            f"{spec.dockerfile.relative_to(REPO)} starts FROM {', '.join(missing)}, which this machine cannot pull "
            f"(no registry is reached) nor make: the bases it can make are {', '.join(BASES)} (images/build.py BASES)"
        )
    buildah = Buildah(cache)
    for base in dockerfile_bases(spec.dockerfile):
        ensure_base(buildah, base)
    ref = reference(name)
    _say(f"building {ref} from {spec.dockerfile.relative_to(REPO)}")
    started = time.monotonic()
    buildah.run(
        "bud",
        "--layers",
        "--force-rm",  # a failed step leaves no working container behind
        "--format",
        "docker",  # OCI's image config has no SHELL: buildah would run RUN lines with /bin/sh
        "--pull=never",
        "--isolation",
        "chroot",
        "--network",
        "host",
        *build_args(),
        "--file",
        str(spec.dockerfile),
        "--tag",
        ref,
        str(REPO),
    )
    built = time.monotonic()
    _say(f"{name}: built in {built - started:.0f} s; exporting to {archive}")
    archive.parent.mkdir(parents=True, exist_ok=True)
    for stale in archive.parent.glob(f"{name}-*.tar"):
        stale.unlink()  # an older tree's image: its room is needed for the export (the trainer's is GBs)
    partial = archive.with_name(f".{archive.name}.partial")
    partial.unlink(missing_ok=True)
    buildah.run("push", "--quiet", ref, f"oci-archive:{partial}:{ref}")
    partial.replace(archive)  # atomic: a half-written archive is never current
    try:
        buildah.run("rmi", "--prune")  # images no tag or later layer uses any more
    except RuntimeError as error:
        print(f"warning: {error}; `buildah containers` lists what holds them", file=sys.stderr)
    _say(f"{name}: exported in {time.monotonic() - built:.0f} s ({archive.stat().st_size / 2**30:.2f} GiB)")
    return archive


@contextlib.contextmanager
def build_lock(cache: Path) -> Iterator[None]:
    """One build at a time per cache folder (two test sessions may both need the images)."""
    path = cache / "images" / ".lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def build_all(names: list[str], cache: Path | None = None) -> dict[str, Path]:
    """Build (or keep) each named image under one lock; name -> archive."""
    cache = cache or cache_dir()
    with build_lock(cache):
        archives = {name: build(name, cache) for name in names}
        shutil.rmtree(Buildah.runroot_for(cache), ignore_errors=True)  # nothing runs between builds
        return archives


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m images.build", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"images to build: {', '.join(IMAGES)} (default: all)")
    parser.add_argument("--print-archive", action="store_true", help="print the archive paths; build nothing")
    args = parser.parse_args(argv)
    names = args.names or list(IMAGES)
    unknown = sorted(set(names) - set(IMAGES))
    if unknown:
        parser.error(f"no image named {', '.join(unknown)}; the images are {', '.join(IMAGES)}")
    if args.print_archive:
        for name in names:
            print(archive_path(name))
        return 0
    try:
        archives = build_all(names)
    except (RuntimeError, FileNotFoundError, subprocess.CalledProcessError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for name, archive in archives.items():
        print(f"{reference(name)}\t{archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
