"""TRL/open-r1 GRPO recipe (flat YAML of script, model and GRPOConfig arguments) -> ColocGRPOJob.

Every recipe key ends in exactly one of three places:
- a typed field of the spec (the TRANSLATIONS table below says which, and how),
- `spec.trainerArgs`, when it is a GRPOConfig field of the pinned TRL that no typed field owns,
- the report: a note (dropped on purpose, with the reason) or an untranslatable item
  (its meaning would be lost; the CLI exits non-zero).
Nothing is silently lost: tests/cli check that every key of the seed recipe is accounted for.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from colocgrpo_operator.api.naming import API_VERSION, KIND, MAX_JOB_NAME_LENGTH
from colocgrpo_operator.api.trainer_args import OWNED_KEYS, REFUSED_KEYS, grpo_config_fields

DTYPES = ("bfloat16", "float16", "float32", "auto")


@dataclass
class Translation:
    """The job being built, plus what the user must know about the trip."""

    spec: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    untranslatable: list[str] = field(default_factory=list)
    # The command-line topology wins over the recipe; remembered for notes.
    tp_from_command_line: int | None = None

    def set(self, path: str, value: Any) -> None:
        """Set spec.<a>.<b> = value."""
        node = self.spec
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value

    def get(self, path: str) -> Any:
        node: Any = self.spec
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    def trainer_arg(self, key: str, value: Any) -> None:
        self.spec.setdefault("trainerArgs", {})[key] = value


Handler = Callable[[Translation, str, Any, dict[str, Any]], None]


def _to(path: str, check: Callable[[Any], bool] = lambda v: True, expect: str = "") -> Handler:
    """Copy the value to spec.<path> (after a type check)."""

    def handle(t: Translation, key: str, value: Any, recipe: dict[str, Any]) -> None:
        if not check(value):
            t.untranslatable.append(f"{key}: {value!r} is not {expect} (target spec.{path})")
            return
        t.set(path, value)

    return handle


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_str(v: Any) -> bool:
    return isinstance(v, str) and v != ""


def _drop(reason: str) -> Handler:
    def handle(t: Translation, key: str, value: Any, recipe: dict[str, Any]) -> None:
        t.notes.append(f"{key}: {value!r} dropped: {reason}")

    return handle


def _only(accepted: Any, note: str, refusal: str) -> Handler:
    """A setting jobs always have: the value ACCEPTED is dropped with NOTE, any other is refused."""

    def handle(t: Translation, key: str, value: Any, recipe: dict[str, Any]) -> None:
        if type(value) is type(accepted) and value == accepted:  # True is not 1 here
            t.notes.append(f"{key}: {note}")
        else:
            t.untranslatable.append(f"{key}: {value!r}: {refusal}")

    return handle


def _dtype(t: Translation, key: str, value: Any, recipe: dict[str, Any]) -> None:
    if value not in DTYPES:
        t.untranslatable.append(f"{key}: {value!r} is not one of {', '.join(DTYPES)} (target spec.model.dtype)")
        return
    t.set("model.dtype", value)


ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")  # what the trainer image runs (api/model.py ModelSpec)


def _attention(t: Translation, key: str, value: Any, recipe: dict[str, Any]) -> None:
    if value in ATTENTION_IMPLEMENTATIONS:
        t.set("model.attnImplementation", value)
    elif isinstance(value, str) and value.startswith("flash_attention"):
        t.set("model.attnImplementation", "sdpa")
        t.notes.append(
            f"{key}: {value} -> spec.model.attnImplementation sdpa: the trainer image ships no flash-attn package; "
            "sdpa runs PyTorch's fused attention (FlashAttention kernels on GPUs that have them)"
        )
    else:
        t.untranslatable.append(
            f"{key}: {value!r} is not one of {', '.join(ATTENTION_IMPLEMENTATIONS)} "
            "(target spec.model.attnImplementation)"
        )


def _mixed_precision(dtype: str) -> Handler:
    def handle(t: Translation, key: str, value: Any, recipe: dict[str, Any]) -> None:
        declared = recipe.get("torch_dtype")
        if value is True and declared in (None, dtype):
            t.set("model.dtype", dtype)
            t.notes.append(f"{key}: true is implied by spec.model.dtype {dtype} (mixed precision follows the dtype)")
        elif value is False and declared != dtype:
            t.notes.append(f"{key}: false dropped: mixed precision follows spec.model.dtype")
        else:
            t.untranslatable.append(f"{key}: {value!r} contradicts torch_dtype {declared!r} (spec.model.dtype)")

    return handle


def _tensor_parallel(t: Translation, key: str, value: Any, recipe: dict[str, Any]) -> None:
    if t.tp_from_command_line is not None:
        if _is_int(value) and value != t.tp_from_command_line:
            t.notes.append(f"{key}: {value} replaced by --tp {t.tp_from_command_line} (spec.vllm.tensorParallelSize)")
        elif not _is_int(value):
            t.notes.append(
                f"{key}: {value!r} is an on/off switch of the TRL fork the recipe was written for; "
                f"the tensor-parallel size is --tp {t.tp_from_command_line} (spec.vllm.tensorParallelSize)"
            )
        return
    if _is_int(value) and value >= 1:
        t.set("vllm.tensorParallelSize", value)
    else:
        t.untranslatable.append(
            f"{key}: {value!r} gives no tensor-parallel size; pass --tp N (spec.vllm.tensorParallelSize)"
        )


def _sleep_mode(t: Translation, key: str, value: Any, recipe: dict[str, Any]) -> None:
    if value is True:
        t.set("vllm.sleepPolicy", "auto")
        t.notes.append(f"{key}: true -> spec.vllm.sleepPolicy auto (never generates from discarded weights)")
    elif value is False:
        t.set("vllm.sleepPolicy", "off")
    else:
        t.untranslatable.append(f"{key}: {value!r} is not a boolean (target spec.vllm.sleepPolicy)")


def _warmup_ratio(t: Translation, key: str, value: Any, recipe: dict[str, Any]) -> None:
    if "warmup_steps" in recipe:
        t.untranslatable.append(f"{key}: {value!r} conflicts with warmup_steps {recipe['warmup_steps']!r}; keep one")
    elif _is_number(value) and 0 <= value < 1:
        t.trainer_arg("warmup_steps", float(value))
        t.notes.append(
            f"{key}: {value} -> trainerArgs.warmup_steps {float(value)} "
            "(transformers 5 reads a float in [0, 1) as a ratio of total steps)"
        )
    else:
        t.untranslatable.append(f"{key}: {value!r} is not a ratio in [0, 1)")


def _save_strategy(t: Translation, key: str, value: Any, recipe: dict[str, Any]) -> None:
    if value == "no":
        t.notes.append(f"{key}: 'no' -> spec.checkpoint.saveSteps unset (no intermediate checkpoints)")
    elif value == "steps":
        if "save_steps" not in recipe:
            t.set("checkpoint.saveSteps", 500)
            t.notes.append(
                f"{key}: 'steps' without save_steps -> spec.checkpoint.saveSteps 500 (transformers' default)"
            )
    else:
        t.untranslatable.append(
            f"{key}: {value!r}: only step-based checkpoints (spec.checkpoint.saveSteps) are supported"
        )


def _save_steps(t: Translation, key: str, value: Any, recipe: dict[str, Any]) -> None:
    if recipe.get("save_strategy") == "no":
        t.notes.append(f"{key}: {value!r} dropped: save_strategy is 'no'")
    elif _is_int(value) and value > 0:
        t.set("checkpoint.saveSteps", value)
    else:
        t.untranslatable.append(f"{key}: {value!r}: spec.checkpoint.saveSteps takes a whole number of steps")


def _rewards(t: Translation, key: str, value: Any, recipe: dict[str, Any]) -> None:
    functions = value if isinstance(value, list) else [value]
    weights = recipe.get("reward_weights")
    if weights is None:
        weights = [1.0] * len(functions)
    if not isinstance(weights, list) or len(weights) != len(functions):
        t.untranslatable.append(f"reward_weights: {weights!r} does not match reward_funcs {functions!r} one to one")
        weights = [1.0] * len(functions)
    t.spec["rewards"] = [{"function": str(f), "weight": float(w)} for f, w in zip(functions, weights, strict=False)]


def _reward_weights(t: Translation, key: str, value: Any, recipe: dict[str, Any]) -> None:
    if "reward_funcs" not in recipe:
        t.untranslatable.append(f"{key}: {value!r} without reward_funcs")
    # Otherwise consumed together with reward_funcs.


def _model_init_kwargs(t: Translation, key: str, value: Any, recipe: dict[str, Any]) -> None:
    if not isinstance(value, dict):
        t.untranslatable.append(f"{key}: {value!r} is not a mapping")
        return
    rest = dict(value)
    if "attn_implementation" in rest:
        _attention(t, f"{key}.attn_implementation", rest.pop("attn_implementation"), recipe)
    for inner, target in (
        ("torch_dtype", "model.dtype"),
        ("dtype", "model.dtype"),
        ("revision", "model.revision"),
    ):
        if inner in rest:
            t.set(target, rest.pop(inner))
            t.notes.append(f"{key}.{inner} -> spec.{target}")
    if rest:
        t.trainer_arg(key, rest)


_NO_EVALUATION = "evaluation during training is not supported"

# recipe key -> (where it goes, handler). Keys not listed go to trainerArgs when they are
# GRPOConfig fields of the pinned TRL, else to the untranslatable report.
TRANSLATIONS: dict[str, tuple[str, Handler]] = {
    # open-r1 ModelConfig
    "model_name_or_path": ("spec.model.name", _to("model.name", _is_str, "a string")),
    "model_revision": ("spec.model.revision", _to("model.revision", _is_str, "a string")),
    "torch_dtype": ("spec.model.dtype", _dtype),
    "dtype": ("spec.model.dtype", _dtype),
    "attn_implementation": ("spec.model.attnImplementation", _attention),
    "model_init_kwargs": ("spec.model + trainerArgs.model_init_kwargs", _model_init_kwargs),
    "bf16": ("spec.model.dtype", _mixed_precision("bfloat16")),
    "fp16": ("spec.model.dtype", _mixed_precision("float16")),
    # open-r1 ScriptArguments
    "dataset_name": ("spec.dataset.name", _to("dataset.name", _is_str, "a string")),
    "dataset_config": ("spec.dataset.config", _to("dataset.config", _is_str, "a string")),
    "dataset_train_split": ("spec.dataset.split", _to("dataset.split", _is_str, "a string")),
    "dataset_prompt_column": ("spec.dataset.promptColumn", _to("dataset.promptColumn", _is_str, "a string")),
    "system_prompt": (
        "spec.dataset.systemPrompt",
        _to("dataset.systemPrompt", lambda v: isinstance(v, str), "a string"),
    ),
    "chat_template": (
        "spec.dataset.chatTemplate",
        _to("dataset.chatTemplate", lambda v: isinstance(v, str), "a string"),
    ),
    "max_prompt_length": (
        "spec.dataset.maxPromptTokens",
        _to("dataset.maxPromptTokens", lambda v: _is_int(v) and v > 0, "a positive integer"),
    ),
    "reward_funcs": ("spec.rewards[].function", _rewards),
    "reward_weights": ("spec.rewards[].weight", _reward_weights),
    # vLLM
    "use_vllm": (
        "(always on for GPU jobs)",
        _only(
            True,
            "true dropped: vLLM is always used by GPU jobs, colocated (spec.resources.gpusPerNode > 0)",
            "generation without vLLM is only available to CPU jobs (--gpus-per-node 0)",
        ),
    ),
    "vllm_mode": (
        "(always colocate)",
        _only("colocate", "colocate dropped: vLLM always runs colocated", "only colocated vLLM is supported"),
    ),
    "vllm_tp": ("spec.vllm.tensorParallelSize", _tensor_parallel),
    "vllm_tensor_parallel_size": ("spec.vllm.tensorParallelSize", _tensor_parallel),
    "vllm_gpu_memory_utilization": (
        "spec.vllm.gpuMemoryUtilization",
        _to("vllm.gpuMemoryUtilization", lambda v: _is_number(v) and 0 < v < 1, "a fraction in (0, 1)"),
    ),
    "vllm_enable_prefix_caching": (
        "spec.vllm.enablePrefixCaching",
        _to("vllm.enablePrefixCaching", lambda v: isinstance(v, bool), "a boolean"),
    ),
    "vllm_max_model_len": (
        "spec.vllm.maxModelLen",
        _to("vllm.maxModelLen", lambda v: _is_int(v) and v > 0, "a positive integer"),
    ),
    "vllm_max_model_length": (
        "spec.vllm.maxModelLen",
        _to("vllm.maxModelLen", lambda v: _is_int(v) and v > 0, "a positive integer"),
    ),
    "vllm_max_num_seqs": (
        "spec.vllm.maxNumSeqs",
        _to("vllm.maxNumSeqs", lambda v: _is_int(v) and v > 0, "a positive integer"),
    ),
    "vllm_enable_sleep_mode": ("spec.vllm.sleepPolicy", _sleep_mode),
    # Renamed or removed in transformers 5 / TRL 1.16
    "warmup_ratio": ("trainerArgs.warmup_steps (float ratio)", _warmup_ratio),
    "overwrite_output_dir": (
        "(removed in transformers 5)",
        _drop(
            "removed in transformers 5; checkpoints go to spec.checkpoint.path and resume per spec.checkpoint.resume"
        ),
    ),
    "output_dir": (
        "spec.checkpoint.path",
        _drop("the operator sets the output directory to spec.checkpoint.path (a mounted volume)"),
    ),
    # Checkpoints
    "save_strategy": ("spec.checkpoint.saveSteps", _save_strategy),
    "save_steps": ("spec.checkpoint.saveSteps", _save_steps),
    "save_total_limit": (
        "spec.checkpoint.saveTotalLimit",
        _to("checkpoint.saveTotalLimit", lambda v: _is_int(v) and v > 0, "a positive integer"),
    ),
    # Evaluation is not part of a job
    "do_eval": ("(no evaluation)", _only(False, "false dropped: jobs do not evaluate", _NO_EVALUATION)),
    "eval_strategy": ("(no evaluation)", _only("no", "'no' dropped: jobs do not evaluate", _NO_EVALUATION)),
}


class _DuplicateTrackingLoader(yaml.SafeLoader):
    """Records top-level keys that appear more than once (YAML keeps the last silently)."""

    duplicates: list[tuple[str, Any, Any]]
    _root: yaml.Node | None


def _construct_mapping(loader: _DuplicateTrackingLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    mapping: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        value = loader.construct_object(value_node, deep=True)
        if key in mapping and node is loader._root:
            loader.duplicates.append((key, mapping[key], value))
        mapping[key] = value
    return mapping


_DuplicateTrackingLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_recipe(text: str) -> tuple[dict[str, Any], list[tuple[str, Any, Any]]]:
    """The recipe mapping and its duplicated top-level keys (key, first value, last value)."""
    loader = _DuplicateTrackingLoader(text)
    loader.duplicates = []
    try:
        loader._root = loader.get_single_node()
        data = loader.construct_document(loader._root) if loader._root is not None else None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise ValueError(f"a recipe is a YAML mapping of arguments, got {type(data).__name__}")
    if "apiVersion" in data and "kind" in data:
        # A Kubernetes manifest (often a ColocGRPOJob passed by mistake) is not a flat argument mapping;
        # translating it would report its whole spec as one untranslatable key.
        hint = "; use `colocgrpo validate/render/plan -f` on it" if data.get("kind") == "ColocGRPOJob" else ""
        raise ValueError(f"it is a Kubernetes {data.get('kind')} manifest, not a GRPO recipe{hint}")
    return data, loader.duplicates


def default_job_name(model_name: str | None) -> str:
    base = (model_name or "grpo").rstrip("/").split("/")[-1].lower()
    slug = re.sub(r"[^a-z0-9]+", "-", base).strip("-")
    if not slug or not slug[0].isalpha():
        slug = f"job-{slug}".rstrip("-")  # DNS-1035: must start with a letter
    return slug[: MAX_JOB_NAME_LENGTH - 5].rstrip("-") + "-grpo"


def translate_recipe(
    recipe: dict[str, Any],
    *,
    name: str | None = None,
    namespace: str | None = None,
    nodes: int = 1,
    gpus_per_node: int = 8,
    tp: int | None = None,
    duplicates: list[tuple[str, Any, Any]] | None = None,
) -> tuple[dict[str, Any], Translation]:
    """The ColocGRPOJob manifest for RECIPE, and the report of what happened to each key."""
    t = Translation(tp_from_command_line=tp)
    for key, first, last in duplicates or []:
        if first == last:
            t.notes.append(f"{key}: appears more than once with the same value {last!r}")
        else:
            t.untranslatable.append(
                f"{key}: appears more than once with different values ({first!r}, then {last!r}); YAML keeps the last"
            )
    t.set("resources.nodes", nodes)
    t.set("resources.gpusPerNode", gpus_per_node)
    if tp is not None:
        t.set("vllm.tensorParallelSize", tp)

    known = grpo_config_fields()
    for key, value in recipe.items():
        if key in TRANSLATIONS:
            TRANSLATIONS[key][1](t, key, value, recipe)
        elif key in REFUSED_KEYS:
            t.untranslatable.append(f"{key}: {value!r} refused: {REFUSED_KEYS[key]}")
        elif key in OWNED_KEYS:
            t.untranslatable.append(f"{key}: {value!r}: owned by {OWNED_KEYS[key]}; set that field instead")
        elif key in known:
            t.trainer_arg(key, value)
        else:
            close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.8)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            t.untranslatable.append(
                f"{key}: {value!r} is not a TRL 1.16 GRPOConfig argument nor a known recipe key{hint}"
            )

    if gpus_per_node == 0:
        t.spec.get("vllm", {}).pop("tensorParallelSize", None)
    metadata: dict[str, Any] = {"name": name or default_job_name(t.get("model.name"))}
    if namespace:
        metadata["namespace"] = namespace
    ordered = {
        k: t.spec[k]
        for k in ("model", "dataset", "resources", "vllm", "rewards", "trainerArgs", "checkpoint")
        if k in t.spec
    }
    job = {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": ordered}
    return job, t
