"""The operator side never imports torch, vllm, trl, transformers or deepspeed, and every third-party import
of each package is declared in the extra that installs the code importing it (pyproject.toml).

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
