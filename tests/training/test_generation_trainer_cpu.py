"""TRL's real GRPO loop through ColocGRPOTrainer on CPU, with a CPU stand-in for vLLM
(tests/support/cpu_vllm.py) that really loses weights on a level-2 sleep.

At every generate the engine's weights are compared with the trainer's weights at that
moment; a deliberately broken push shows the comparison can fail.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

torch = pytest.importorskip("torch")


def run(tiny_model_dir, tmp_path, monkeypatch, policy: str, steps_per_generation: int | None = None):
    from support import cpu_vllm
    from support.cpu_trainer import cpu_trainer

    cpu_vllm.install(monkeypatch)
    trainer = cpu_trainer(
        tiny_model_dir,
        tmp_path / "out",
        prompts=16,
        policy=policy,
        per_device_train_batch_size=4,
        num_generations=4,
        gradient_accumulation_steps=2,
        steps_per_generation=steps_per_generation,
        max_steps=3,
        max_completion_length=5,
        learning_rate=0.05,  # large: every step visibly changes the weights
        seed=3,
    )
    fresh: list[bool] = []
    seen_weights: list[torch.Tensor] = []

    def compare(engine_model):
        trainer_params = dict(trainer.model.named_parameters())
        fresh.append(
            all(
                torch.equal(p, trainer_params[n].detach())
                for n, p in engine_model.named_parameters()
                if n in trainer_params
            )
        )
        seen_weights.append(next(engine_model.parameters()).detach().clone())

    cpu_vllm.GENERATE_HOOKS.append(compare)
    trainer.train()
    return trainer, fresh, seen_weights


@pytest.mark.parametrize("policy", ["off", "level1", "level2", "auto"])
def test_every_generate_uses_the_trainers_current_weights(policy, tiny_model_dir, tmp_path, monkeypatch):
    # steps_per_generation 1 with gradient accumulation 2: two generates per optimizer step.
    trainer, fresh, seen = run(tiny_model_dir, tmp_path, monkeypatch, policy, steps_per_generation=1)
    assert len(fresh) == 6 and all(fresh), fresh
    assert not torch.equal(seen[0], seen[-1]), "the weights never changed: the check would prove nothing"
    m = trainer.generation_metrics()
    assert m["generation/generates"] == 6
    if policy in ("off", "level1"):
        assert m["generation/pushes"] == 3  # once per weight version (the base is never trusted)
    if policy == "level2":
        assert m["generation/pushes"] == 6
    if policy == "auto":
        # On this CPU the push is cheap against a level-1 round trip: like level 2, and
        # never more pushes than generates.
        assert 3 <= m["generation/pushes"] <= 6
    if policy != "off":
        assert m["generation/sleeps_level1"] + m["generation/sleeps_level2"] == 7  # initial + one per generate


def test_a_broken_push_is_detected(tiny_model_dir, tmp_path, monkeypatch):
    from colocgrpo_training.generation.vllm_engine import ColocatedVLLM

    original = ColocatedVLLM._push_bucketed
    calls = []

    def push_only_once(self):
        calls.append(1)
        return original(self) if len(calls) == 1 else 0

    monkeypatch.setattr(ColocatedVLLM, "_push_bucketed", push_only_once)
    _, fresh, _ = run(tiny_model_dir, tmp_path, monkeypatch, "level1", steps_per_generation=1)
    assert fresh[0] and not all(fresh)


@pytest.mark.parametrize("option", ["tools", "environment_factory"])
def test_tool_calling_is_refused_up_front(option, tiny_model_dir, tmp_path):
    # TRL's tool loop generates again for the samples that called a tool: ranks would make
    # different numbers of generate calls, each a collective over all ranks (a hang).
    from datasets import Dataset
    from trl import GRPOConfig

    from colocgrpo_training.config import VLLMSettings
    from colocgrpo_training.generation import ColocGRPOTrainer
    from support.cpu_trainer import length_reward

    def add(a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: the first number
            b: the second number
        """
        return a + b

    value = [add] if option == "tools" else object  # a factory of environments
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], num_generations=2)
    with pytest.raises(ValueError, match=rf"^{option} \(tool calling, multi-turn generation\) is not supported"):
        ColocGRPOTrainer(
            model=str(tiny_model_dir),
            reward_funcs=[length_reward],
            args=args,
            train_dataset=Dataset.from_list([{"prompt": "What is 1 + 1?"}] * 4),
            generation_settings=VLLMSettings(),
            **{option: value},
        )


def test_a_grpo_config_whose_vllm_settings_differ_is_refused(tiny_model_dir, tmp_path):
    # Each vLLM setting has one writer (grpo_args.vllm_args); the trainer checks its GRPOConfig against it.
    from datasets import Dataset
    from trl import GRPOConfig

    from colocgrpo_training.config import VLLMSettings
    from colocgrpo_training.generation import ColocGRPOTrainer
    from colocgrpo_training.grpo_args import vllm_args
    from support.cpu_trainer import length_reward

    settings = VLLMSettings(tensor_parallel_size=2, sleep_policy="level1")
    given = {**vllm_args(settings), "vllm_tensor_parallel_size": 4, "vllm_enable_sleep_mode": False}
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], num_generations=2, **given)
    with pytest.raises(ValueError, match="differ from generation_settings") as refused:
        ColocGRPOTrainer(
            model=str(tiny_model_dir),
            reward_funcs=[length_reward],
            args=args,
            train_dataset=Dataset.from_list([{"prompt": "What is 1 + 1?"}] * 4),
            generation_settings=settings,
        )
    assert "vllm_tensor_parallel_size is 4 where vllm.tensorParallelSize sets 2" in str(refused.value)
    assert "vllm_enable_sleep_mode is False where vllm.sleepPolicy sets True" in str(refused.value)


def test_the_engine_refuses_trl_arguments_that_differ():
    from colocgrpo_training.config import VLLMSettings
    from colocgrpo_training.generation.vllm_engine import ColocatedVLLM

    settings = VLLMSettings(tensor_parallel_size=2, gpu_memory_utilization=0.4, sleep_policy="off")
    with pytest.raises(ValueError, match="tensor_parallel_size is 1 where vllm.tensorParallelSize sets 2"):
        ColocatedVLLM(None, None, None, settings=settings, tensor_parallel_size=1)
    with pytest.raises(ValueError, match="enable_sleep_mode is True where vllm.sleepPolicy sets False"):
        ColocatedVLLM(None, None, None, settings=settings, enable_sleep_mode=True)
