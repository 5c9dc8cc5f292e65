"""Bad input reads the same in `validate`, `render` and `plan`: one clean line naming the file (and field).

Only the exit codes differ, as documented: validate/render exit 1, plan exits 2 (1 means "does not fit").
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from colocgrpo_operator.api import JobSpecError, parse_job
from support.cli_runner import run_colocgrpo as colocgrpo

REPO = Path(__file__).resolve().parents[2]
BAD_INPUT_EXIT = {"validate": 1, "render": 1, "plan": 2}


def tiny_job() -> dict:
    return yaml.safe_load((REPO / "examples/tiny-cpu.yaml").read_text())


def _wrong_kind() -> str:
    job = tiny_job()
    job["kind"] = "PyTorchJob"
    return yaml.safe_dump(job)


def _wrong_api_version() -> str:
    job = tiny_job()
    job["apiVersion"] = "colocgrpo.io/v1"
    return yaml.safe_dump(job)


CASES = {
    "missing": (None, "cannot read"),
    "not-yaml": ("not: [yaml\n", "invalid YAML (line 2, column 1)"),
    "wrong-kind": (_wrong_kind(), "kind: must be ColocGRPOJob, got 'PyTorchJob'"),
    "wrong-api-version": (_wrong_api_version(), "apiVersion: must be colocgrpo.io/v1alpha1, got 'colocgrpo.io/v1'"),
    "a-list": ("- a\n- b\n", "a ColocGRPOJob must be a mapping, got list"),
}


@pytest.mark.parametrize("command", sorted(BAD_INPUT_EXIT))
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_naming_the_file(tmp_path, command, case):
    content, expected = CASES[case]
    path = tmp_path / f"{case}.yaml"
    if content is not None:
        path.write_text(content)
    result = colocgrpo(command, "-f", str(path))
    assert result.returncode == BAD_INPUT_EXIT[command], result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"{path}: " in lines[0] and expected in lines[0], lines[0]
    # A whole-document problem has no field path, so no empty one (": :") before the message.
    assert ": :" not in lines[0]


def test_plan_several_documents_without_a_job_says_so(tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n---\napiVersion: v1\nkind: Secret\n")
    result = colocgrpo("plan", "-f", str(path))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {path}: no ColocGRPOJob document among its 2 documents"


def test_whole_document_error_has_no_empty_field_path():
    with pytest.raises(JobSpecError) as caught:
        parse_job(["not", "a", "mapping"])
    assert caught.value.lines() == ["a ColocGRPOJob must be a mapping, got list"]
    assert not str(caught.value).startswith(":")


def test_from_recipe_bad_yaml_is_one_line(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("learning_rate: [1e-6\n")
    result = colocgrpo("from-recipe", str(path))
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"error: {path}: invalid YAML (line 2, column 1): expected ',' or ']', but got '<stream end>'"
    ]


def test_from_recipe_given_a_job_manifest_points_at_the_right_commands():
    job = REPO / "examples/tiny-cpu.yaml"
    result = colocgrpo("from-recipe", str(job))
    assert result.returncode == 1 and result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line == (
        f"error: {job}: not a recipe: it is a Kubernetes ColocGRPOJob manifest, not a GRPO recipe; "
        "use `colocgrpo validate/render/plan -f` on it"
    )
