"""The operator side never imports torch, vllm, trl, transformers or deepspeed, every third-party import
of each package is declared in the extra that installs the code importing it (pyproject.toml), and each
room of the operator imports only the rooms below it: kopf only in the kopf glue (docs/architecture.md).

The imports run in a fresh interpreter so nothing imported by other tests can hide a violation.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "vllm", "trl", "transformers", "deepspeed", "accelerate", "datasets")

PROBE = """
import importlib, json, pkgutil, sys
import colocgrpo_operator
failed = {}
names = ["colocgrpo_operator"]
for info in pkgutil.walk_packages(colocgrpo_operator.__path__, "colocgrpo_operator."):
    if info.name.endswith("__main__"):
        continue  # running them would execute the CLI
    names.append(info.name)
for name in names:
    try:
        importlib.import_module(name)
    except Exception as error:
        failed[name] = repr(error)
# The operator may also use these light trainer modules.
importlib.import_module("colocgrpo_training.config")
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[1])))
print(json.dumps({"modules": names, "failed": failed, "heavy": heavy}))
"""


def test_operator_modules_import_no_ml_stack():
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'operator'}:{REPO / 'training'}")
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(HEAVY)], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"colocgrpo_operator.api", "colocgrpo_operator.render", "colocgrpo_operator.recipe"} <= set(
        report["modules"]
    )
    assert report["failed"] == {}
    assert report["heavy"] == []


# --- every third-party import declared where it runs ------------------------------------------------

# An import name that is not its distribution's name (the rest match once normalized).
DISTRIBUTION_OF = {"yaml": "pyyaml"}


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _extras() -> dict[str, set[str]]:
    """Each extra's distributions (base dependencies under ""), self-references (`colocgrpo[operator]`) resolved."""
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    raw = {"": project["dependencies"], **project["optional-dependencies"]}

    def resolve(extra: str) -> set[str]:
        names: set[str] = set()
        for line in raw[extra]:
            requirement = Requirement(line)
            if _normalize(requirement.name) == "colocgrpo":
                for inner in requirement.extras:
                    names |= resolve(inner)
            else:
                names.add(_normalize(requirement.name))
        return names

    return {extra: resolve(extra) | (resolve("") if extra else set()) for extra in raw}


def _third_party_imports(path: Path) -> set[str]:
    """The top-level names of every absolute import in the file, functions' imports included, minus the
    standard library and the project's own packages."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return (
        names
        - set(sys.stdlib_module_names)
        - {"__future__", "colocgrpo_operator", "colocgrpo_training", "colocgrpo_dev"}
    )


def _operator_light_trainer_modules() -> list[Path]:
    """The files of colocgrpo_training that the operator package imports (the config contract, the planner)."""
    probe = (
        "import importlib, pkgutil, sys, colocgrpo_operator\n"
        "for info in pkgutil.walk_packages(colocgrpo_operator.__path__, 'colocgrpo_operator.'):\n"
        "    if not info.name.endswith('__main__'):\n"
        "        importlib.import_module(info.name)\n"
        "print('\\n'.join(m.__file__ for n, m in sys.modules.items() if n.startswith('colocgrpo_training')))\n"
    )
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'operator'}:{REPO / 'training'}")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    return [Path(line) for line in result.stdout.split()]


def _where_it_runs(path: Path) -> str:
    """The extra whose install runs this file: the developer tools (dev/: the local cluster, the demo) run
    with `dev` (their model builders with `trainer`), the operator package with `operator`, the trainer with
    `trainer` plus `gpu`."""
    relative = path.relative_to(REPO).as_posix()
    if relative.startswith("dev/colocgrpo_dev/models/"):
        return "trainer"  # the model builders run where torch is: the trainer venv, a GPU host
    if relative.startswith("dev/"):
        return "dev"
    if relative.startswith("operator/"):
        return "operator"
    return "trainer"


def test_every_third_party_import_is_declared_in_its_extra():
    extras = _extras()
    extras["trainer"] |= extras["gpu"]  # vLLM and DeepSpeed: imported only where a GPU pod has them
    missing = {}
    sources = [REPO / "operator", REPO / "training" / "colocgrpo_training", REPO / "dev" / "colocgrpo_dev"]
    for path in sorted(path for source in sources for path in source.rglob("*.py")):
        declared = extras[_where_it_runs(path)]
        undeclared = {
            name for name in _third_party_imports(path) if _normalize(DISTRIBUTION_OF.get(name, name)) not in declared
        }
        if undeclared:
            missing[str(path.relative_to(REPO))] = sorted(undeclared)
    assert missing == {}, f"imports missing from the extra that runs them: {missing}"


def test_the_trainer_modules_the_operator_imports_need_only_the_operator_extra():
    declared = _extras()["operator"]
    light = _operator_light_trainer_modules()
    assert any(path.name == "config.py" for path in light), light
    missing = {
        str(path): sorted(
            n for n in _third_party_imports(path) if _normalize(DISTRIBUTION_OF.get(n, n)) not in declared
        )
        for path in light
    }
    assert {path: names for path, names in missing.items() if names} == {}


def test_the_official_kubernetes_client_is_declared_only_where_imported():
    extras = _extras()
    assert "kubernetes" not in extras["operator"]  # the operator's own client (kube/client.py)
    assert "kubernetes" in extras["trainer"] and "kubernetes" in extras["dev"]
    assert "urllib3" in extras["operator"]


def test_the_product_distribution_ships_no_developer_tools(tmp_path):
    """`pip install colocgrpo` installs the operator and the trainer, never dev/ (the local cluster, the
    demo, the harnesses): the wheel setuptools builds from pyproject.toml holds only the two packages."""
    import zipfile

    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = tmp_path.glob("colocgrpo-*.whl")
    top = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist() if not name.startswith("colocgrpo-")}
    assert top == {"colocgrpo_operator", "colocgrpo_training"}


# --- the operator's rooms: each imports only the rooms below it -------------------------------------

OPERATOR = REPO / "operator" / "colocgrpo_operator"
# Each room of the operator checked here -> the other rooms of the operator (and the trainer package) it
# may import. Its own room and the package root (the version) always; a room not listed is not checked.
ROOMS: dict[str, set[str]] = {
    "metrics": {"api"},
    "kube": {"api", "metrics"},
    "controller": {"api", "render", "kube", "metrics", "colocgrpo_training"},
    "kopf_glue": {"api", "kube", "controller", "metrics"},
    "daemon": {"api", "kube", "kopf_glue", "metrics"},
    # The user's Python client: the API, the Kubernetes client and the planner; never the job logic or the glue.
    "client": {"api", "render", "kube", "colocgrpo_training"},
    "cli": {"api", "render", "kube", "client", "manifest_files", "recipe", "colocgrpo_training"},
}
# kopf, and aiohttp (kopf's HTTP client): only the kopf glue may import them.
KOPF_ONLY = {"kopf", "aiohttp"}


def _room_of(module: str) -> str:
    """The room of a module of the operator, or of the trainer package ("colocgrpo_operator" for the root)."""
    parts = module.split(".")
    if parts[0] != "colocgrpo_operator":
        return parts[0]
    return parts[1] if len(parts) > 1 else parts[0]


def _imported_modules(path: Path) -> set[str]:
    """Every module the file imports, functions' and TYPE_CHECKING imports included; a `from X import y`
    counts as X.y when y is a module of the operator (`from colocgrpo_operator.kopf_glue import handlers`)."""
    package = ".".join(path.relative_to(REPO / "operator").with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's own package up
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names.add(base)
            for alias in node.names:
                if (OPERATOR.parent / f"{base}.{alias.name}".replace(".", "/")).with_suffix(".py").exists():
                    names.add(f"{base}.{alias.name}")
    return names


def test_each_room_imports_only_the_rooms_below_it():
    """A file's folder says what it may import: the Kubernetes client (kube/) nothing of the job logic
    or of kopf, the job logic (controller/) no kopf, the kopf glue (kopf_glue/) all of them."""
    crossings = {}
    for path in sorted(OPERATOR.rglob("*.py")):
        relative = path.relative_to(OPERATOR)
        room = relative.parts[0] if len(relative.parts) > 1 else relative.stem
        if room not in ROOMS:
            continue
        allowed = ROOMS[room] | {room, "colocgrpo_operator"}
        crossing = sorted(
            name
            for name in _imported_modules(path)
            if (name.startswith(("colocgrpo_operator", "colocgrpo_training")) and _room_of(name) not in allowed)
            or (name.split(".")[0] in KOPF_ONLY and room != "kopf_glue")
        )
        if crossing:
            crossings[str(relative)] = crossing
    assert crossings == {}, f"imports across the operator's rooms (docs/architecture.md): {crossings}"


def test_the_rooms_table_names_every_folder_of_the_operator():
    # A new folder gets its rules here and in docs/architecture.md, or the test above never looks at it.
    folders = {p.name for p in OPERATOR.iterdir() if (p / "__init__.py").exists()}
    assert {"kube", "controller", "kopf_glue", "client", "cli"} <= folders
    assert folders - set(ROOMS) <= {"api", "render"}, folders - set(ROOMS)


LIGHT_PROBE = """
import importlib, json, pkgutil, sys
import colocgrpo_operator.client, colocgrpo_operator.controller, colocgrpo_operator.kube
names = ["colocgrpo_operator.daemon", "colocgrpo_operator.metrics", "colocgrpo_operator.kopf_glue.config"]
for package in (colocgrpo_operator.controller, colocgrpo_operator.kube, colocgrpo_operator.client):
    names += [info.name for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
for name in names:
    importlib.import_module(name)
print(json.dumps({"modules": names, "kopf": sorted({m.split(".")[0] for m in sys.modules} & {"kopf", "aiohttp"})}))
"""


def test_the_job_logic_the_client_and_the_daemons_settings_load_no_kopf():
    """Imported whole, in a fresh interpreter, they leave kopf and aiohttp unimported: the daemon reads its
    flags and credentials before it keeps the official clients out of kopf's way and lets kopf in, and the
    user's Python client (client/) needs neither."""
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'operator'}:{REPO / 'training'}")
    result = subprocess.run([sys.executable, "-c", LIGHT_PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert {
        "colocgrpo_operator.controller.reconciler",
        "colocgrpo_operator.kube.client",
        "colocgrpo_operator.client.jobs",
    } <= set(report["modules"])
    assert report["kopf"] == []


# --- no import loops ---------------------------------------------------------------------------------------------


def _project_imports() -> dict[str, set[str]]:
    """Each module of the two packages and the project modules it imports, imports inside functions included (a
    loop hidden in a function is still a loop: the two modules cannot be read, or split, one without the other)."""
    modules: dict[str, Path] = {}
    for base in ("operator", "training"):
        for path in (REPO / base).rglob("*.py"):
            parts = path.relative_to(REPO / base).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parent, base] if base else parent)
                for alias in node.names:
                    imported.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
        graph[name] = (imported & set(modules)) - {name}
    return graph


def _loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []
    for root, imported in graph.items():
        if root in index:
            continue
        work = [(root, iter(sorted(imported)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    loops.append(sorted(component))
    return loops


def test_the_loop_finder_finds_a_loop():
    assert _loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _loops({"a": {"b"}, "b": set()}) == []


# Loops that exist and are to be undone, each as its sorted modules: the test fails when a new one appears, and when
# one of these is gone (so that the list only shrinks). failures.classify imports data.DataError inside a function,
# while data.py imports failures and verdict, which imports failures.
KNOWN_LOOPS = [["colocgrpo_training.data", "colocgrpo_training.failures", "colocgrpo_training.verdict"]]


def test_no_module_imports_itself_back():
    graph = _project_imports()
    assert "colocgrpo_training.planner.plan" in graph["colocgrpo_training.planner.micro_batches"]
    assert _loops(graph) == KNOWN_LOOPS
