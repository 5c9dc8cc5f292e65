"""`colocgrpo dev demo` runs the example jobs' trainer on this host: the paths of the trainer image's own examples
that the jobs name map to the checkout (datasets) and the cache (models)."""

from __future__ import annotations

from pathlib import Path

import yaml

from colocgrpo_dev.demo import IMAGE_EXAMPLES, LEARN_MODEL_DIR, host_path

REPO = Path(__file__).resolve().parents[2]


def test_image_example_paths_map_to_the_checkout_and_the_cache(tmp_path):
    cache = tmp_path / "cache"
    assert host_path(f"{IMAGE_EXAMPLES}/data/arith.jsonl", REPO, cache) == str(REPO / "examples/data/arith.jsonl")
    assert host_path(f"{IMAGE_EXAMPLES}/models/tiny", REPO, cache) == str(cache / "models/tiny")
    assert host_path("/data/my-model", REPO, cache) == "/data/my-model"
    assert host_path("Qwen/Qwen2.5-14B-Instruct", REPO, cache) == "Qwen/Qwen2.5-14B-Instruct"


def test_the_demo_examples_find_their_data_and_the_learn_model_on_this_host(tmp_path):
    for example in ("tiny-cpu.yaml", "learn-cpu.yaml"):
        spec = yaml.safe_load((REPO / "examples" / example).read_text())["spec"]
        assert Path(host_path(spec["dataset"]["name"], REPO, tmp_path)).is_file(), example
    learn = yaml.safe_load((REPO / "examples/learn-cpu.yaml").read_text())["spec"]["model"]["name"]
    assert host_path(learn, REPO, tmp_path) == str(tmp_path / LEARN_MODEL_DIR)
