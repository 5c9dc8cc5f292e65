"""The `colocgrpo` subcommands crd/validate/render/from-recipe, run as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from support.cli_runner import run_colocgrpo as colocgrpo

REPO = Path(__file__).resolve().parents[2]
SEED_RECIPE = REPO / "tests/data/seed-config.yaml"


def write(tmp_path: Path, name: str, obj) -> Path:
    path = tmp_path / name
    path.write_text(obj if isinstance(obj, str) else yaml.safe_dump_all(obj if isinstance(obj, list) else [obj]))
    return path


def seed_job() -> dict:
    return yaml.safe_load((REPO / "examples/seed-qwen14b-tp4.yaml").read_text())


def test_crd_prints_the_committed_crd():
    result = colocgrpo("crd")
    assert result.returncode == 0, result.stderr
    assert result.stdout == (REPO / "charts/colocgrpo-operator/crds/colocgrpojobs.colocgrpo.io.yaml").read_text()


def test_validate_accepts_the_examples():
    result = colocgrpo("validate", "-f", "examples/seed-qwen14b-tp4.yaml", "-f", "examples/tiny-cpu.yaml")
    assert result.returncode == 0, result.stderr
    assert "seed-qwen14b-tp4 is valid" in result.stdout and "tiny-cpu is valid" in result.stdout


def test_validate_rejects_tp3_on_8_gpus_naming_the_field(tmp_path):
    job = seed_job()
    job["spec"]["vllm"]["tensorParallelSize"] = 3
    result = colocgrpo("validate", "-f", str(write(tmp_path, "tp3.yaml", job)))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "spec.vllm.tensorParallelSize: must divide spec.resources.gpusPerNode (8)" in lines[0]
    assert "Traceback" not in result.stderr


def test_validate_prints_one_line_per_problem(tmp_path):
    job = seed_job()
    job["metadata"]["name"] = "Bad_Name"
    job["spec"]["vllm"]["gpuMemoryUtilization"] = 1.2
    job["spec"]["trainerArgs"]["use_peft"] = True
    result = colocgrpo("validate", "-f", str(write(tmp_path, "bad.yaml", job)))
    assert result.returncode == 1
    paths = {line.split(": ")[1] for line in result.stderr.strip().splitlines()}
    assert paths == {"metadata.name", "spec.vllm.gpuMemoryUtilization", "spec.trainerArgs.use_peft"}


def test_validate_multi_document_names_the_bad_document(tmp_path):
    good, bad = seed_job(), seed_job()
    bad["spec"]["resources"]["nodes"] = 0
    result = colocgrpo("validate", "-f", str(write(tmp_path, "two.yaml", [good, bad])))
    assert result.returncode == 1
    assert "two.yaml[0]: ColocGRPOJob seed-qwen14b-tp4 is valid" in result.stdout
    assert "two.yaml[1]: spec.resources.nodes:" in result.stderr


@pytest.mark.parametrize(
    "content, expected",
    [
        ("spec: [unclosed\n", "invalid YAML (line"),
        ("", "no YAML documents"),
        ("\x00\x01binary", "invalid YAML"),
    ],
)
def test_validate_unreadable_or_invalid_yaml_is_one_clean_line(tmp_path, content, expected):
    result = colocgrpo("validate", "-f", str(write(tmp_path, "x.yaml", content)))
    assert result.returncode == 1
    assert expected in result.stderr and "Traceback" not in result.stderr


def test_validate_missing_file_and_stdin():
    missing = colocgrpo("validate", "-f", "/nonexistent/job.yaml")
    assert missing.returncode == 1 and "cannot read" in missing.stderr and "Traceback" not in missing.stderr
    piped = colocgrpo("validate", "-f", "-", stdin=(REPO / "examples/tiny-cpu.yaml").read_text())
    assert piped.returncode == 0, piped.stderr


def test_validate_non_job_yaml(tmp_path):
    result = colocgrpo("validate", "-f", str(write(tmp_path, "list.yaml", "- 1\n- 2\n")))
    assert result.returncode == 1 and "must be a mapping" in result.stderr


def test_render_seed_shows_8_gpus_and_the_seed_values():
    result = colocgrpo("render", "-f", "examples/seed-qwen14b-tp4.yaml")
    assert result.returncode == 0, result.stderr
    objects = list(yaml.safe_load_all(result.stdout))
    kinds = [o["kind"] for o in objects]
    assert kinds == ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Job"]  # one node: no Service
    job = objects[-1]
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
    grpo = yaml.safe_load(objects[3]["data"]["grpo.yaml"])
    assert grpo["grpo"]["learning_rate"] == 2e-5 and grpo["vllm"]["tensor_parallel_size"] == 4
    assert "grpo.yaml: |" in result.stdout  # embedded files stay readable


def test_render_namespace_and_trainer_image_flags():
    result = colocgrpo("render", "-f", "examples/tiny-cpu.yaml", "-n", "team-a", "--trainer-image", "reg/trainer:9")
    assert result.returncode == 0, result.stderr
    objects = list(yaml.safe_load_all(result.stdout))
    assert {o["metadata"]["namespace"] for o in objects} == {"team-a"}
    assert objects[-1]["spec"]["template"]["spec"]["containers"][0]["image"] == "reg/trainer:9"


def test_render_invalid_job_exits_1_with_field_lines(tmp_path):
    job = seed_job()
    job["spec"]["vllm"]["tensorParallelSize"] = 3
    result = colocgrpo("render", "-f", str(write(tmp_path, "tp3.yaml", job)))
    assert result.returncode == 1 and result.stdout == ""
    assert "spec.vllm.tensorParallelSize" in result.stderr


def test_from_recipe_regenerates_the_committed_seed_example():
    result = colocgrpo(
        "from-recipe",
        str(SEED_RECIPE),
        "--nodes",
        "1",
        "--gpus-per-node",
        "8",
        "--tp",
        "4",
        "--name",
        "seed-qwen14b-tp4",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == (REPO / "examples/seed-qwen14b-tp4.yaml").read_text(), "regenerate the example"
    assert "note: warmup_ratio: 0.1 -> trainerArgs.warmup_steps 0.1" in result.stderr
    assert "overwrite_output_dir" in result.stderr


def test_from_recipe_reports_untranslatable_and_exits_1(tmp_path):
    recipe = write(
        tmp_path,
        "recipe.yaml",
        "model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct\ndataset_name: d\nreward_funcs: [accuracy]\n"
        "use_peft: true\nwandb_project: x\nvllm_mode: server\nlearning_rate: 1.0e-6\nlearning_rate: 2.0e-6\n",
    )
    out = tmp_path / "job.yaml"
    result = colocgrpo("from-recipe", str(recipe), "--gpus-per-node", "4", "--output-file", str(out))
    assert result.returncode == 1
    for key in ("use_peft", "wandb_project", "vllm_mode", "learning_rate"):
        assert f"not translated: {key}:" in result.stderr
    written = out.read_text()
    assert "# NOT TRANSLATED" in written and "wandb_project" in written
    job = yaml.safe_load(written)
    assert job["spec"]["trainerArgs"]["learning_rate"] == 2e-6  # YAML's last value, reported above


def test_from_recipe_bad_topology_is_an_invalid_job():
    result = colocgrpo("from-recipe", str(SEED_RECIPE), "--gpus-per-node", "8", "--tp", "3")
    assert result.returncode == 1
    assert "invalid job: spec.vllm.tensorParallelSize" in result.stderr


def test_from_recipe_unreadable_inputs(tmp_path):
    assert colocgrpo("from-recipe", "/nonexistent.yaml").returncode == 1
    result = colocgrpo("from-recipe", str(write(tmp_path, "list.yaml", "- a\n")))
    assert result.returncode == 1 and "not a recipe" in result.stderr and "Traceback" not in result.stderr


# --- -o json|yaml: what the commands print for programs ---------------------------------------------


def test_render_json_is_one_list_of_the_same_objects():
    as_yaml = colocgrpo("render", "-f", "examples/seed-qwen14b-tp4.yaml")
    as_json = colocgrpo("render", "-f", "examples/seed-qwen14b-tp4.yaml", "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    listed = json.loads(as_json.stdout)
    assert (listed["apiVersion"], listed["kind"]) == ("v1", "List")
    assert listed["items"] == list(yaml.safe_load_all(as_yaml.stdout))


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_validate_output_is_the_job_with_its_defaults(output):
    result = colocgrpo("validate", "-f", "examples/tiny-cpu.yaml", "-o", output)
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout) if output == "json" else yaml.safe_load(result.stdout)
    assert (job["kind"], job["metadata"]["name"]) == ("ColocGRPOJob", "tiny-cpu")
    written = yaml.safe_load((REPO / "examples/tiny-cpu.yaml").read_text())
    assert "sleepPolicy" not in written["spec"].get("vllm", {})  # filled in by the API model
    assert job["spec"]["vllm"]["sleepPolicy"] == "auto"


def test_validate_output_of_several_jobs_is_a_list_and_problems_still_exit_1(tmp_path):
    bad = seed_job()
    bad["spec"]["vllm"]["tensorParallelSize"] = 3
    both = colocgrpo("validate", "-f", "examples/tiny-cpu.yaml", "-f", "examples/seed-qwen14b-tp4.yaml", "-o", "json")
    assert [j["metadata"]["name"] for j in json.loads(both.stdout)["items"]] == ["tiny-cpu", "seed-qwen14b-tp4"]
    mixed = colocgrpo(
        "validate", "-f", "examples/tiny-cpu.yaml", "-f", str(write(tmp_path, "tp3.yaml", bad)), "-o", "yaml"
    )
    assert mixed.returncode == 1 and "spec.vllm.tensorParallelSize" in mixed.stderr
    assert yaml.safe_load(mixed.stdout)["metadata"]["name"] == "tiny-cpu"


def test_from_recipe_json_is_the_same_job_as_its_yaml():
    args = ("from-recipe", str(SEED_RECIPE), "--gpus-per-node", "8", "--tp", "4")
    as_yaml, as_json = colocgrpo(*args), colocgrpo(*args, "-o", "json")
    assert as_json.returncode == as_yaml.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == yaml.safe_load(as_yaml.stdout)
