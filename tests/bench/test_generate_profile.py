"""bench.generate_profile's arithmetic and report, without torch: what each variant changes, the decode floor and each
variant against it, the GPU's busy time from its intervals, the differences between variants and the table. The run
itself on CPU (the vLLM stand-in): tests/training/test_generate_profile_cpu.py."""

from __future__ import annotations

import pytest

from bench import generate_profile as gp

# The trainer's sampling as bench.generate_profile writes it (its keys checked on CPU in tests/training/).
TRAINER = dict(
    n=1, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, max_tokens=64, logprobs=0, ignore_eos=True, detokenize=False
)


@pytest.mark.parametrize(
    ("variant", "changed"),
    [
        ("trainer", {}),
        ("after-wake", {}),  # the same sampling, after a sleep and a wake
        ("no-logprobs", {"logprobs": None}),
        ("detokenize", {"detokenize": True}),
        ("greedy", {"temperature": 0.0}),
        ("prefill-only", {"max_tokens": 1}),
    ],
)
def test_each_variant_changes_one_thing_of_the_trainers_sampling(variant, changed):
    sampling = gp.variant_sampling(variant, TRAINER)
    assert {k: v for k, v in sampling.items() if TRAINER.get(k, "absent") != v} == changed
    assert TRAINER["logprobs"] == 0 and TRAINER["detokenize"] is False  # the base is never changed in place


def test_every_variant_is_listed_once():
    assert sorted(gp.VARIANTS) == sorted(gp.VARIANT_CHANGES) and len(set(gp.VARIANTS)) == 6


def test_the_decode_floor_reads_the_bf16_weights_once_per_token_step():
    # The large size's 3B shape on an 80 GiB card: 3.0B parameters, 64 steps at 3.0 TB/s (read + write, as
    # bench.grpo.floor measures it).
    floor = gp.decode_floor(3_000_000_000, 3.0e12, 64)
    assert floor["weight_bytes"] == 6_000_000_000
    assert floor["per_step_s"] == pytest.approx(0.002)
    assert floor["floor_s"] == pytest.approx(0.128)
    assert gp.decode_floor(1000, 1000.0, 10, bytes_per_param=4)["floor_s"] == pytest.approx(40.0)


def test_a_variant_against_the_floor_whole_and_per_token_step():
    floor = gp.decode_floor(3_000_000_000, 3.0e12, 64)
    result = gp.with_floor({"median_s": 0.64, "tokens_per_sequence": 64}, floor)
    assert result["ratio_to_floor"] == pytest.approx(5.0)
    assert result["s_per_token_step"] == pytest.approx(0.01)
    assert result["step_ratio_to_floor"] == pytest.approx(5.0)
    # One token per sequence: against the 64-step floor the whole call is short, its one step is long.
    prefill = gp.with_floor({"median_s": 0.064, "tokens_per_sequence": 1}, floor)
    assert prefill["ratio_to_floor"] == pytest.approx(0.5)
    assert prefill["step_ratio_to_floor"] == pytest.approx(32.0)
    # No floor (no bandwidth measured): the wall time per step alone; a failed variant: nothing added.
    assert "ratio_to_floor" not in gp.with_floor({"median_s": 0.64, "tokens_per_sequence": 64}, None)
    assert gp.with_floor({"status": "failed"}, floor) == {"status": "failed"}


def test_the_gpu_is_busy_for_the_union_of_its_intervals():
    assert gp.interval_union([]) == 0
    assert gp.interval_union([(0, 10)]) == 10
    assert gp.interval_union([(20, 30), (0, 10)]) == 20  # unsorted, apart
    assert gp.interval_union([(0, 10), (5, 15), (12, 14), (20, 21)]) == 16  # overlapping counted once
    assert gp.interval_union([(0, 10), (10, 20)]) == 20  # touching


def test_timing_summary_and_the_differences_between_variants():
    assert gp.timing_summary([0.3, 0.1, 0.2]) == {
        "reps": 3,
        "seconds": [0.3, 0.1, 0.2],
        "median_s": 0.2,
        "min_s": 0.1,
        "max_s": 0.3,
    }

    def measured(median, **extra):
        return {"status": "measured", "median_s": median, **extra}

    variants = {
        "trainer": measured(0.6, tokens_per_sequence=64),
        "no-logprobs": measured(0.5),
        "detokenize": measured(0.65),
        "greedy": measured(0.4),
        "prefill-only": measured(0.09),
        "after-wake": measured(0.7, later={"median_s": 0.6}),
    }
    diff = gp.differences(variants)
    assert diff == pytest.approx(
        {
            "logprobs_s": 0.1,
            "detokenize_s": 0.05,
            "sampling_s": 0.2,
            "prefill_and_first_token_s": 0.09,
            "decode_after_first_token_s": 0.51,
            "decode_s_per_step": 0.51 / 63,
            "first_after_wake_s": 0.1,
        }
    )
    # A variant that failed or was skipped gives no difference; without the trainer's, none at all.
    variants["greedy"] = {"status": "failed: RuntimeError"}
    assert "sampling_s" not in gp.differences(variants)
    assert gp.differences({"greedy": measured(0.4)}) == {}


def test_the_table_lists_every_variant_with_its_status():
    floor = gp.decode_floor(3_000_000_000, 3.0e12, 64)
    report = {
        "device": "NVIDIA H100 80GB HBM3",
        "commit": "abc1234",
        "model": {"kind": "large", "shape": "3b", "params": 3_000_000_000},
        "batch": {"sequences": 128, "prompts": 16, "num_generations": 8, "completion_tokens": 64},
        "engine": {"gpu_memory_utilization": 0.5},
        "floor": floor,
        "order": ["trainer", "after-wake", "greedy"],
        "variants": {
            "trainer": gp.with_floor(
                {"status": "measured", **gp.timing_summary([0.6, 0.64]), "tokens": 8192, "tokens_per_sequence": 64},
                floor,
            ),
            "after-wake": {
                "status": "measured",
                **gp.timing_summary([0.9]),
                "tokens_per_sequence": 64,
                "later": gp.timing_summary([0.6]),
            },
            "greedy": {"status": "skipped (time budget: 231 s used of 230)"},
        },
        "profile": {
            "status": "measured",
            "wall_s": 0.7,
            "gpu_busy_s": 0.14,
            "device_sum_s": 0.15,
            "gpu_busy_fraction": 0.2,
            "gpu_busy_fraction_of_unprofiled": 0.23,
        },
        "differences": {"sampling_s": 0.2},
        "notes": ["ignore_eos=True in every variant"],
    }
    text = "\n".join(gp.render_markdown(report))
    assert "3.00B parameters" in text and "0.128 s" in text
    assert "| trainer | measured | 2 | 0.620 | 0.600 | 0.640 | 8192 | 4.84 | 9.69 | 4.84 |" in text
    assert "| after-wake, the next generate | measured | 1 | 0.600 |" in text
    assert "| greedy | skipped (time budget: 231 s used of 230) |" in text
    assert "GPU busy 0.140 s of 0.700 s wall (20 %" in text
    assert "sampling_s +0.200" in text and "Note: ignore_eos=True" in text
    assert "DRY RUN" not in text
    assert "CPU DRY RUN" in "\n".join(gp.render_markdown({**report, "cpu_dry_run": True}))
    # A run that stopped before any variant (no model, no engine) still renders, and says why.
    assert "STOPPED: no model at /x" in gp.render_markdown({"order": [], "variants": {}, "error": "no model at /x\n.."})


def test_arguments():
    args = gp.parse_args(["--out", "x"])
    assert (args.size, args.reps, args.variants, args.util) == ("large", 5, list(gp.VARIANTS), 0.5)
    assert gp.parse_args(["--out", "x", "--cpu"]).size == "cpu"
    assert gp.parse_args(["--out", "x", "--variants", "greedy,trainer"]).variants == ["greedy", "trainer"]
    for bad in (["--cpu", "--size", "large"], ["--variants", "trainer,fast"], ["--reps", "0"]):
        with pytest.raises(SystemExit):
            gp.parse_args(["--out", "x", *bad])


class FakeClock(gp.Clock):
    """A clock that moves only when a step runs."""

    def __init__(self, budget_s: float) -> None:
        super().__init__(budget_s)
        self.now = 0.0

    def elapsed(self) -> float:
        return self.now


def test_a_failing_step_is_recorded_and_the_rest_still_run_until_the_budget():
    clock = FakeClock(budget_s=100.0)
    writes = []
    seconds = {"trainer": 10.0, "profile": 20.0, "greedy": 10.0, "no-logprobs": 35.0, "prefill-only": 5.0}

    def measure(name):
        clock.now += seconds.get(name, 0.0)
        if name == "greedy":
            raise RuntimeError("CUDA error: an illegal memory access")
        return {"status": "measured", "median_s": 0.5}

    report = {"order": [], "variants": {}}
    steps = ["trainer", "profile", "greedy", "no-logprobs", "prefill-only", "after-wake"]
    complete = gp.run_steps(steps, measure, clock, report, lambda: writes.append(len(writes)))
    assert not complete
    assert report["order"] == ["trainer", "greedy", "no-logprobs", "prefill-only", "after-wake"]
    assert report["profile"]["status"] == "measured" and "step_wall_s" in report["profile"]
    greedy = report["variants"]["greedy"]
    assert greedy["status"] == "failed: RuntimeError: CUDA error: an illegal memory access"
    assert "Traceback" in greedy["error"]
    # 75 s used after no-logprobs: prefill-only (guessed 35 s like the last step) would end past 100 s.
    assert report["variants"]["no-logprobs"]["status"] == "measured"
    for name in ("prefill-only", "after-wake"):
        assert report["variants"][name]["status"] == "skipped (time budget: 75 s used of 100)", name
    assert len(writes) == len(steps)  # the report is written after every step
    assert report["differences"] == {"logprobs_s": 0.0}

    report = {"order": [], "variants": {}}
    assert gp.run_steps(["trainer"], lambda name: {"status": "measured"}, FakeClock(10.0), report, lambda: None)
