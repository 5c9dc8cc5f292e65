"""Prompt datasets from local files: conversational prompts, column/split errors, truncation."""

from __future__ import annotations

import json

import pytest

from colocgrpo_training.config import DatasetSettings
from colocgrpo_training.data import (
    DataError,
    TooFewPromptsError,
    apply_chat_template,
    fingerprint,
    load_prompt_dataset,
    require_enough_prompts,
    truncate_prompts,
)
from colocgrpo_training.failures import EXIT_INVALID_CONFIG, InvalidConfigError, classify

pytestmark = pytest.mark.trainer


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


ROWS = [
    {"question": "What is 2 + 3?", "answer": "$5$", "level": 1},
    {"question": "What is 7 + 5?", "answer": "$12$", "level": 2},
]


def test_local_jsonl_becomes_conversational_prompts_with_system_prompt(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", ROWS)
    settings = DatasetSettings(
        name_or_path=str(path), prompt_column="question", solution_column="answer", system_prompt="Be brief."
    )
    dataset = load_prompt_dataset(settings, require_solution=True)
    assert dataset.num_rows == 2
    assert dataset[0]["prompt"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 3?"},
    ]
    # The gold answer reaches reward functions as `solution`; other columns stay as kwargs.
    assert dataset[1]["solution"] == "$12$"
    assert dataset[1]["level"] == 2
    assert "question" not in dataset.column_names


def test_without_system_prompt_only_the_user_turn(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", ROWS)
    dataset = load_prompt_dataset(DatasetSettings(name_or_path=str(path), prompt_column="question"))
    assert dataset[0]["prompt"] == [{"role": "user", "content": "What is 2 + 3?"}]


def test_directory_of_parquet_files_with_named_split(tmp_path):
    import datasets

    datasets.Dataset.from_list(ROWS).to_parquet(str(tmp_path / "test.parquet"))
    dataset = load_prompt_dataset(DatasetSettings(name_or_path=str(tmp_path), split="test", prompt_column="question"))
    assert [row["prompt"][-1]["content"] for row in dataset] == ["What is 2 + 3?", "What is 7 + 5?"]


def test_missing_prompt_column_names_it_and_the_available_columns(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", ROWS)
    with pytest.raises(DataError) as err:
        load_prompt_dataset(DatasetSettings(name_or_path=str(path), prompt_column="problem"))
    message = str(err.value)
    assert "'problem'" in message and "promptColumn" in message
    assert "['question', 'answer', 'level']" in message


def test_missing_solution_column_is_an_error_only_when_accuracy_needs_it(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", ROWS)
    settings = DatasetSettings(name_or_path=str(path), prompt_column="question")  # solution_column "solution"
    assert load_prompt_dataset(settings).num_rows == 2
    with pytest.raises(DataError, match="no solution column 'solution'.*accuracy"):
        load_prompt_dataset(settings, require_solution=True)


def test_empty_file_is_an_empty_split_error(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("")
    with pytest.raises(DataError, match="split 'train' is empty"):
        load_prompt_dataset(DatasetSettings(name_or_path=str(path), prompt_column="question"))


def test_empty_parquet_split_is_an_error_naming_the_split(tmp_path):
    import datasets

    empty = datasets.Dataset.from_dict({"question": [], "answer": []})
    empty.to_parquet(str(tmp_path / "validation.parquet"))
    with pytest.raises(DataError) as err:
        load_prompt_dataset(DatasetSettings(name_or_path=str(tmp_path), split="validation", prompt_column="question"))
    assert "split 'validation' is empty" in str(err.value)


def test_unknown_split_of_a_directory_names_the_split(tmp_path):
    import datasets

    datasets.Dataset.from_list(ROWS).to_parquet(str(tmp_path / "train.parquet"))
    with pytest.raises(DataError, match="split 'validation'"):
        load_prompt_dataset(DatasetSettings(name_or_path=str(tmp_path), split="validation", prompt_column="question"))


@pytest.mark.parametrize("name", ["{tmp}/nope/x.jsonl", "{tmp}/no-folder", "./no-such.parquet", "~/no/such/folder"])
def test_a_missing_local_path_is_an_invalid_config_naming_it(tmp_path, name):
    name = name.format(tmp=tmp_path)
    with pytest.raises(InvalidConfigError) as err:
        load_prompt_dataset(DatasetSettings(name_or_path=name))
    assert str(err.value) == (
        f"dataset.name {name!r} does not exist on this node (a local path; every pod must mount it)"
    )
    assert classify(err.value).exit_code == EXIT_INVALID_CONFIG  # not retried


def test_an_unsupported_file_type(tmp_path):
    odd = tmp_path / "data.txt"
    odd.write_text("hello\n")
    with pytest.raises(DataError, match="unsupported type '.txt'"):
        load_prompt_dataset(DatasetSettings(name_or_path=str(odd)))


def test_conversational_cells_keep_their_messages(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "hi"}], "solution": "$1$"}]
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    dataset = load_prompt_dataset(DatasetSettings(name_or_path=str(path), prompt_column="prompt", system_prompt="S"))
    assert dataset[0]["prompt"] == [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]


def test_chat_template_override_and_missing_template(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    apply_chat_template(tokenizer, DatasetSettings(name_or_path="x", chat_template="{{ messages[0]['content'] }}!"))
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hey"}], tokenize=False) == "hey!"
    tokenizer.chat_template = None
    with pytest.raises(DataError, match="no chat template"):
        apply_chat_template(tokenizer, DatasetSettings(name_or_path="x"))


def test_truncation_keeps_the_end_of_the_question_within_budget(tmp_path, tiny_tokenizer):
    long_question = "Compute the sum of 1, 2, 3 and 4. " * 20 + "What is 2 + 3?"
    path = write_jsonl(tmp_path / "train.jsonl", [{"question": long_question}, {"question": "What is 2 + 3?"}])
    settings = DatasetSettings(name_or_path=str(path), prompt_column="question", system_prompt="Be brief.")
    dataset = truncate_prompts(load_prompt_dataset(settings), tiny_tokenizer, 40)
    for row in dataset:
        ids = tiny_tokenizer.apply_chat_template(row["prompt"], tokenize=True, add_generation_prompt=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        assert len(ids) <= 40
    assert dataset[0]["prompt"][0] == {"role": "system", "content": "Be brief."}
    assert dataset[0]["prompt"][1]["content"].endswith("What is 2 + 3?")
    assert len(dataset[0]["prompt"][1]["content"]) < len(long_question)
    assert dataset[1]["prompt"][1]["content"] == "What is 2 + 3?"  # short prompts untouched


def test_truncation_budget_smaller_than_the_template_is_an_error(tmp_path, tiny_tokenizer):
    path = write_jsonl(tmp_path / "train.jsonl", [{"question": "What is 2 + 3?"}])
    settings = DatasetSettings(name_or_path=str(path), prompt_column="question", system_prompt="Be brief. " * 20)
    with pytest.raises(DataError, match="maxPromptTokens=10"):
        truncate_prompts(load_prompt_dataset(settings), tiny_tokenizer, 10)


def test_the_fingerprint_is_the_rows_content_in_order(tmp_path):
    import os
    import shutil

    first = write_jsonl(tmp_path / "a.jsonl", ROWS)
    copy = tmp_path / "copy" / "a.jsonl"
    copy.parent.mkdir()
    shutil.copy(first, copy)
    os.utime(copy, (0, 0))  # another node's copy: another path and modification time, the same rows
    changed = write_jsonl(tmp_path / "changed.jsonl", [ROWS[0], {**ROWS[1], "question": "What is 7 + 6?"}])
    reordered = write_jsonl(tmp_path / "reordered.jsonl", ROWS[::-1])
    prints = {
        name: fingerprint(load_prompt_dataset(DatasetSettings(name_or_path=str(path), prompt_column="question")))
        for name, path in {"first": first, "copy": copy, "changed": changed, "reordered": reordered}.items()
    }
    assert prints["first"] == prints["copy"]
    assert len({prints["first"], prints["changed"], prints["reordered"]}) == 3


def test_ranks_that_loaded_different_rows_all_stop_naming_what_each_loaded(tmp_path):
    from support import gloo_world

    rows = [{"problem": row["question"]} for row in ROWS]
    same = write_jsonl(tmp_path / "train.jsonl", rows)
    other = write_jsonl(tmp_path / "other.jsonl", [*rows, {"problem": "What is 1 + 1?"}])
    out = tmp_path / "out"
    out.mkdir()
    gloo_world.run_world(gloo_world.dataset_agreement, 3, [str(same), str(same), str(other)], str(out))
    results = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(3)]
    ours, theirs = (fingerprint(load_prompt_dataset(DatasetSettings(name_or_path=str(path)))) for path in (same, other))
    expected = (
        "the ranks loaded different data from dataset '/data/train.jsonl' split 'train' "
        f"(ranks 0, 1: 2 rows, fingerprint {ours}; rank 2: 3 rows, fingerprint {theirs}); every pod must read the "
        "same rows: the same files for a local path (one volume), the same revision of a Hub dataset"
    )
    assert results == [{"error": expected}] * 3


def test_a_dataset_smaller_than_one_generation_batch_is_refused_with_the_numbers():
    from types import SimpleNamespace

    args = SimpleNamespace(
        generation_batch_size=64, num_generations=8, per_device_train_batch_size=4, steps_per_generation=2, world_size=8
    )
    settings = DatasetSettings(name_or_path="/data/train.jsonl")
    require_enough_prompts(8, args, settings)  # 64 rows / 8 generations: 8 prompts, enough
    with pytest.raises(TooFewPromptsError) as err:
        require_enough_prompts(7, args, settings)
    assert str(err.value) == (
        "dataset '/data/train.jsonl' split 'train' has 7 prompts, fewer than the 8 one generation batch takes "
        "(generation_batch_size 64 rows = per_device_train_batch_size 4 x steps_per_generation 2 x 8 processes, / "
        "num_generations 8): training would run no step. Add prompts, or lower per_device_train_batch_size, "
        "steps_per_generation or the number of GPUs"
    )
    failure = classify(err.value)
    assert (failure.reason, failure.exit_code) == ("InvalidConfig", EXIT_INVALID_CONFIG)
