"""Prompt datasets: a hub name or local files turned into conversational GRPO prompts.

Each row becomes `{"prompt": [{"role": "system", ...}, {"role": "user", ...}], ...}` as
open-r1's `make_conversation` does; every other column stays, so reward functions receive
them as keyword arguments (the accuracy reward reads `solution`).

Before training the ranks agree that they loaded the same rows (`agree_on_dataset`) and that
there are enough of them for one generation batch (`require_enough_prompts`).

This module is import-light (no torch, no datasets at import time) because the failure
classifier imports `DataError` from it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from colocgrpo_training.agreement import gather
from colocgrpo_training.config import DatasetSettings
from colocgrpo_training.failures import InvalidConfigError
from colocgrpo_training.verdict import AgreedError

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase
    from trl import GRPOConfig

# datasets' builder for each local file type we accept.
_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
# The column reward functions receive the gold answer under (open-r1's name).
SOLUTION_KWARG = "solution"


class DataError(Exception):
    """The dataset cannot produce prompts; the message names the dataset, split and column."""


class DatasetMismatchError(DataError, AgreedError):
    """The ranks loaded different rows; raised on every rank alike, naming what each rank loaded."""


class TooFewPromptsError(InvalidConfigError, AgreedError):
    """The dataset has fewer prompts than one generation batch takes; raised on every rank alike."""


def local_path(name_or_path: str) -> Path | None:
    """The local path a model or dataset name means (absolute, `./`, `../`, `~`, or a data file's name), or None for
    a Hub id. A Hub id never looks like one of these, so a missing local path is the config's error, not the Hub's."""
    if name_or_path.startswith(("/", "./", "../", "~")) or Path(name_or_path).suffix.lower() in _BUILDERS:
        return Path(name_or_path).expanduser()
    return None


def require_local_path(name_or_path: str, field: str) -> None:
    """`InvalidConfigError` naming `field` when `name_or_path` is a local path that does not exist here: the same
    config fails the same way on a retry (every pod must mount it)."""
    path = local_path(name_or_path)
    if path is not None and not path.exists():
        raise InvalidConfigError(
            f"{field} {name_or_path!r} does not exist on this node (a local path; every pod must mount it)"
        )


def load_prompt_dataset(settings: DatasetSettings, *, require_solution: bool = False) -> Dataset:
    """Load the configured split and turn it into conversational prompts (no tokenizer needed)."""
    raw = load_split(settings)
    columns = list(raw.column_names)
    if settings.prompt_column not in columns:
        raise DataError(
            f"dataset {settings.name_or_path!r} split {settings.split!r} has no prompt column "
            f"{settings.prompt_column!r} (dataset.promptColumn); available columns: {columns}"
        )
    if require_solution and settings.solution_column not in columns:
        raise DataError(
            f"dataset {settings.name_or_path!r} split {settings.split!r} has no solution column "
            f"{settings.solution_column!r} (dataset.solutionColumn), which the accuracy reward needs; "
            f"available columns: {columns}"
        )

    system_prompt = settings.system_prompt
    prompt_column = settings.prompt_column

    def make_conversation(example: dict[str, Any]) -> dict[str, Any]:
        return {"prompt": to_conversation(example[prompt_column], system_prompt)}

    drop = [c for c in ("messages",) if c in columns and c != prompt_column]
    dataset = raw.map(make_conversation, remove_columns=drop, desc="prompts")
    if prompt_column != "prompt" and prompt_column in dataset.column_names:
        dataset = dataset.remove_columns(prompt_column)
    if settings.solution_column in dataset.column_names and settings.solution_column != SOLUTION_KWARG:
        if SOLUTION_KWARG in dataset.column_names:
            dataset = dataset.remove_columns(SOLUTION_KWARG)
        dataset = dataset.rename_column(settings.solution_column, SOLUTION_KWARG)
    return dataset


def to_conversation(value: Any, system_prompt: str | None) -> list[dict[str, str]]:
    """One prompt cell → chat messages. Already-conversational cells keep their messages."""
    if isinstance(value, list) and all(isinstance(m, dict) and "role" in m for m in value):
        messages = [dict(m) for m in value]
        if system_prompt is not None and not (messages and messages[0]["role"] == "system"):
            messages.insert(0, {"role": "system", "content": system_prompt})
        return messages
    if not isinstance(value, str):
        raise DataError(f"prompt cell must be a string or a list of chat messages, got {type(value).__name__}")
    messages = []
    if system_prompt is not None:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": value})
    return messages


def load_split(settings: DatasetSettings) -> Dataset:
    """The raw split, from local files/directories or the hub; errors name the split."""
    import datasets

    source = settings.name_or_path
    require_local_path(source, "dataset.name")
    local = Path(source).expanduser()
    try:
        if local.is_file():
            builder = _BUILDERS.get(local.suffix.lower())
            if builder is None:
                raise DataError(
                    f"dataset file {source!r} has an unsupported type {local.suffix!r}; "
                    f"use one of {sorted(_BUILDERS)} or a directory"
                )
            if local.stat().st_size == 0:
                raise DataError(f"dataset {source!r} split {settings.split!r} is empty (the file has no rows)")
            # A single file is the whole dataset: whatever split is asked for is that file.
            loaded = datasets.load_dataset(builder, data_files={settings.split: str(local)}, split=settings.split)
        elif local.is_dir():
            loaded = datasets.load_dataset(str(local), settings.config_name, split=settings.split)
        else:
            loaded = datasets.load_dataset(source, settings.config_name, split=settings.split)
    except DataError:
        raise
    except ValueError as err:
        if "corresponds to no data" in str(err):  # datasets' wording for a split with zero rows
            raise DataError(f"dataset {source!r} split {settings.split!r} is empty (it has no rows)") from err
        # datasets raises ValueError('Unknown split "x". Should be one of [...]') among others.
        raise DataError(f"dataset {source!r} split {settings.split!r} could not be loaded: {err}") from err
    except FileNotFoundError as err:
        raise DataError(f"dataset {source!r} not found (local path or hub name): {err}") from err
    except Exception as err:  # datasets wraps many causes (network, parsing) in its own types
        raise DataError(f"dataset {source!r} split {settings.split!r} could not be loaded: {err}") from err
    if isinstance(loaded, datasets.DatasetDict | datasets.IterableDataset | datasets.IterableDatasetDict):
        raise DataError(f"dataset {source!r} split {settings.split!r} did not load as a single in-memory split")
    if loaded.num_rows == 0:
        raise DataError(f"dataset {source!r} split {settings.split!r} is empty; columns: {list(loaded.column_names)}")
    return loaded


def apply_chat_template(tokenizer: PreTrainedTokenizerBase, settings: DatasetSettings) -> None:
    """Install the configured chat template (inline Jinja or a file path) and check one exists."""
    template = settings.chat_template
    if template is not None:
        candidate = Path(template)
        if "\n" not in template and "{" not in template and candidate.is_file():
            template = candidate.read_text()
        tokenizer.chat_template = template
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            "the tokenizer has no chat template and dataset.chatTemplate is not set; conversational prompts need one"
        )


def truncate_prompts(dataset: Dataset, tokenizer: PreTrainedTokenizerBase, max_prompt_tokens: int) -> Dataset:
    """Cut each templated prompt to at most `max_prompt_tokens` tokens.

    TRL 1.16 no longer truncates prompts. We cut the *start* of the last user message (the
    question usually ends the message, as TRL's old left truncation assumed) and keep the
    system prompt and template intact. A prompt whose template alone exceeds the budget
    is a DataError: truncating it would train on a malformed prompt.
    """

    def prompt_length(messages: list[dict[str, str]]) -> int:
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        if isinstance(ids, Mapping):  # a BatchEncoding (a UserDict) where the tokenizer returns a dict
            ids = ids["input_ids"]
        return len(ids)

    def truncate(example: dict[str, Any]) -> dict[str, Any]:
        messages = [dict(m) for m in example["prompt"]]
        for _ in range(4):  # re-tokenising a cut string can shift a token; a few rounds settle it
            excess = prompt_length(messages) - max_prompt_tokens
            if excess <= 0:
                return {"prompt": messages}
            user = next((m for m in reversed(messages) if m["role"] == "user"), None)
            content_ids = tokenizer.encode(user["content"], add_special_tokens=False) if user else []
            if user is None or not content_ids or excess >= len(content_ids):
                raise DataError(
                    f"a prompt's chat template and system prompt alone take more than "
                    f"dataset.maxPromptTokens={max_prompt_tokens} tokens"
                )
            user["content"] = tokenizer.decode(content_ids[excess:], skip_special_tokens=False)
        return {"prompt": messages}

    return dataset.map(truncate, desc="truncate prompts")


def fingerprint(dataset: Dataset) -> str:
    """A digest of every row's content, in order: equal for the same rows however they were loaded (unlike
    datasets' own fingerprint, which hashes the files' modification times and cache paths)."""
    digest = hashlib.sha256()
    for batch in dataset.iter(batch_size=1024):
        digest.update(json.dumps(batch, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def agree_on_dataset(dataset: Dataset, settings: DatasetSettings) -> None:
    """Every rank loaded the same prompts: the rows and `fingerprint` of every rank, all-gathered (a collective every
    rank calls once, after loading). Otherwise every rank raises the same `DatasetMismatchError` naming what each
    loaded: ranks that read different files of one path, or different revisions of a Hub dataset, would run
    different numbers of steps (and wait for each other at an epoch's end) or mix prompts within one reward group."""
    views: list[tuple[int, str]] = gather((dataset.num_rows, fingerprint(dataset)))
    if len(set(views)) == 1:
        return
    ranks: dict[tuple[int, str], list[int]] = {}
    for rank, view in enumerate(views):
        ranks.setdefault(view, []).append(rank)
    loaded = "; ".join(
        f"rank{'s' if len(who) > 1 else ''} {', '.join(map(str, who))}: {rows} rows, fingerprint {digest}"
        for (rows, digest), who in ranks.items()
    )
    raise DatasetMismatchError(
        f"the ranks loaded different data from dataset {settings.name_or_path!r} split {settings.split!r} ({loaded}); "
        "every pod must read the same rows: the same files for a local path (one volume), the same revision of a "
        "Hub dataset"
    )


def require_enough_prompts(rows: int, args: GRPOConfig, settings: DatasetSettings) -> None:
    """`TooFewPromptsError` when `rows` prompts are fewer than one generation batch takes (`generation_batch_size /
    num_generations` distinct prompts): TRL's sampler drops an incomplete batch, so the run would train no step and
    save the base model as its result. `rows` is agreed (`agree_on_dataset`), so every rank decides alike."""
    generation_batch = int(args.generation_batch_size or 0)
    needed = generation_batch // int(args.num_generations or 1)
    if rows >= needed:
        return
    raise TooFewPromptsError(
        f"dataset {settings.name_or_path!r} split {settings.split!r} has {rows} prompts, fewer than the {needed} one "
        f"generation batch takes (generation_batch_size {generation_batch} rows = per_device_train_batch_size "
        f"{args.per_device_train_batch_size} x steps_per_generation {args.steps_per_generation} x {args.world_size} "
        f"processes, / num_generations {args.num_generations}): training would run no step. Add prompts, or lower "
        "per_device_train_batch_size, steps_per_generation or the number of GPUs"
    )
