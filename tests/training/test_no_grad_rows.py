"""The no-grad forwards (old log-probs, reference log-probs) in larger chunks give TRL's values.

ColocGRPOTrainer runs TRL's `_get_per_token_logps_and_entropies` with more rows per forward when no
gradient is recorded; the rows of a batch are independent, so the log-probs must equal those of TRL's
chunking (one micro-batch per forward) while the model runs fewer forwards. With gradients on (the
training forward) the chunking stays TRL's.
"""

from __future__ import annotations

import pytest

from colocgrpo_training.generation.trainer import no_grad_rows

pytestmark = [pytest.mark.trainer]

torch = pytest.importorskip("torch")


def test_rows_per_no_grad_forward():
    assert no_grad_rows(16, 104, 8192) == 78
    assert no_grad_rows(16, 1024, 8192) == 16  # never fewer rows than the training micro-batch
    assert no_grad_rows(16, 104, 0) == 16  # 0: TRL's chunking
    assert no_grad_rows(4, 13, 64) == 4


@pytest.fixture(scope="module")
def trainer(tiny_model_dir, tmp_path_factory):
    from datasets import Dataset
    from trl import GRPOConfig

    from colocgrpo_training.config import VLLMSettings
    from colocgrpo_training.generation import ColocGRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("out")),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        report_to=[],
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        seed=3,
        disable_tqdm=True,
    )
    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + 1?"}]} for i in range(8)]
    return ColocGRPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=args,
        train_dataset=Dataset.from_list(rows),
        generation_settings=VLLMSettings(enabled=False),
    )


def logps_and_forwards(trainer, ids, mask, grad: bool, no_grad_tokens: int):
    calls = []
    handle = trainer.model.register_forward_hook(lambda module, args, out: calls.append(1))
    trainer.no_grad_tokens = no_grad_tokens
    try:
        with torch.set_grad_enabled(grad):
            logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, 6, batch_size=4)
    finally:
        handle.remove()
    return logps, len(calls)


def test_no_grad_log_probs_equal_trls_in_fewer_forwards(trainer):
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, trainer.model.config.vocab_size, (32, 13), generator=generator)
    mask = torch.ones_like(ids)
    mask[5, -2:] = 0  # a shorter completion: padding inside the batch
    trainer.model.eval()
    trls, trl_forwards = logps_and_forwards(trainer, ids, mask, grad=False, no_grad_tokens=0)
    ours, our_forwards = logps_and_forwards(trainer, ids, mask, grad=False, no_grad_tokens=32 * 13)
    assert (trl_forwards, our_forwards) == (8, 1)
    assert trls.shape == ours.shape == (32, 6)
    torch.testing.assert_close(ours, trls, rtol=1e-5, atol=1e-6)
    # A budget between the two: chunks of 8 rows, 4 forwards, the same values.
    middle, forwards = logps_and_forwards(trainer, ids, mask, grad=False, no_grad_tokens=8 * 13)
    assert forwards == 4
    torch.testing.assert_close(middle, trls, rtol=1e-5, atol=1e-6)


def test_the_training_forward_keeps_trls_chunks(trainer):
    ids = torch.randint(0, trainer.model.config.vocab_size, (8, 13), generator=torch.Generator().manual_seed(1))
    logps, forwards = logps_and_forwards(trainer, ids, torch.ones_like(ids), grad=True, no_grad_tokens=8192)
    assert forwards == 2 and logps.requires_grad
