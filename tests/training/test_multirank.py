"""World size 4 on CPU: a 4-GPU job with vLLM TP 2 (two TP groups of two ranks) under DeepSpeed
ZeRO-3 over gloo, through the pod's own command.

The job is rendered by the operator and its pod command runs here on the rendered
accelerate.yaml and deepspeed.json (`support.local_pod` lists what a host changes; the job
itself sets `trainerArgs.ddp_backend: gloo`, since accelerate hands DeepSpeed no backend on a
machine without CUDA and would then count one process). vLLM is the CPU stand-in
(`support.cpu_vllm`); `support.rank_probe` records what every rank did and injects the faults.

Three launches, each under a hard time limit (a hang fails the test, it never stalls CI):
1. fresh: level-1 wakes 0.5 s slower on ranks 2 and 3 (auto's measured costs skewed per rank);
   after step 2, SIGTERM to rank 3 only;
2. resume: a newer complete checkpoint that ranks 2 and 3 do not see (their listing lags);
3. SIGTERM to rank 3 while its engine is built, before training starts.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
from pathlib import Path

import pytest

from colocgrpo_training.checkpoints import COMPLETE_MARKER
from colocgrpo_training.failures import EXIT_TERMINATED
from colocgrpo_training.generation.policy import PRIOR_HOST_LINK_BYTES_PER_S, PRIOR_PUSH_BYTES_PER_S
from support import rank_probe
from support.local_pod import Launch, cpu_pod_job, launch_pod, progress_steps, read_json_lines, render_pod

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

torch = pytest.importorskip("torch")

WORLD, TP = 4, 2
GROUPS = [(0, 1), (2, 3)]
SKEWED_RANKS, WAKE1_SKEW_S = (2, 3), 0.5
SIGTERM_AFTER_STEP = 2
LAUNCH_LIMIT_S = 300  # a launch takes ~1 min on two loaded cores; past this it hangs


def job(work: Path, model: Path, max_steps: int) -> dict:
    return cpu_pod_job(
        work,
        model,
        name="multirank",
        gpus=WORLD,
        tp=TP,
        sleep_policy="auto",
        checkpoint={"path": str(work.parent / "checkpoints"), "saveFinalModel": False},
        trainer_args={
            "max_steps": max_steps,
            "per_device_train_batch_size": 2,
            # Each prompt 4 times: twice on each rank of one TP group.
            "num_generations": 4,
            "max_completion_length": 6,
            # Two generates per optimizer step: the first has no push due before the next.
            "gradient_accumulation_steps": 2,
            "steps_per_generation": 1,
            "learning_rate": 0.05,
            "seed": 5,
        },
    )


def launch(
    name: str,
    work_root: Path,
    model: Path,
    env: dict,
    *,
    max_steps: int,
    probe_env: dict[str, str],
    sigterm_rank_after_step: int | None = None,
) -> Launch:
    work = work_root / name
    work.mkdir(parents=True)
    command = render_pod(job(work, model, max_steps), work / "config", reward_modules_dir=work / "rewards")
    env = {
        **env,
        rank_probe.DIR_ENV: str(work / "probe"),
        "COLOCGRPO_TERMINATION_LOG": str(work / "termination-log"),
        "PYTHONUNBUFFERED": "1",
        **probe_env,
    }
    until = None
    if sigterm_rank_after_step is not None:
        until = functools.partial(_sigterm_after, work, sigterm_rank_after_step)
    return launch_pod(command, work, env, world=WORLD, limit_s=LAUNCH_LIMIT_S, probe_dir=work / "probe", until=until)


def _sigterm_after(work: Path, step: int) -> bool:
    """SIGTERM to rank 3 alone once rank 0 reported `step` (as a preempted pod's one process might get it)."""
    steps = progress_steps((work / "stdout.log").read_text(errors="replace"))
    builds = [r for r in read_json_lines(work / "probe" / "rank3.jsonl") if r["event"] == "build"]
    if not builds or not steps or max(steps) < step:
        return False
    os.kill(builds[0]["pid"], signal.SIGTERM)
    return True


@pytest.fixture(scope="module")
def work_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("multirank")


@pytest.fixture(scope="module")
def launch_env(work_root, pod_env) -> dict:
    return pod_env(work_root)


@pytest.fixture(scope="module")
def fresh(work_root, tiny_model_dir, launch_env) -> Launch:
    run = launch(
        "fresh",
        work_root,
        tiny_model_dir,
        launch_env,
        max_steps=50,  # never reached: SIGTERM stops it
        probe_env={rank_probe.WAKE1_SKEW_ENV: f"{','.join(map(str, SKEWED_RANKS))}:{WAKE1_SKEW_S}"},
        sigterm_rank_after_step=SIGTERM_AFTER_STEP,
    )
    assert run.records[3], run.tail()
    return run


def stop_step(fresh: Launch) -> int:
    saved = sorted((fresh.work.parent / "checkpoints").glob("checkpoint-*"))
    assert len(saved) == 1, saved
    return json.loads((saved[0] / "trainer_state.json").read_text())["global_step"]


@pytest.fixture(scope="module")
def resumed(fresh, work_root, tiny_model_dir, launch_env) -> Launch:
    step = stop_step(fresh)
    checkpoints = work_root / "checkpoints"
    # A newer complete checkpoint, visible to ranks 0 and 1 only (a lagging listing on 2 and 3).
    newer = checkpoints / f"checkpoint-{step + 5}"
    shutil.copytree(checkpoints / f"checkpoint-{step}", newer)
    state = json.loads((newer / "trainer_state.json").read_text())
    (newer / "trainer_state.json").write_text(json.dumps({**state, "global_step": step + 5}))
    try:
        return launch(
            "resume",
            work_root,
            tiny_model_dir,
            launch_env,
            max_steps=step + 2,
            probe_env={rank_probe.HIDE_ENV: f"2,3:{newer.name}"},
        )
    finally:
        shutil.rmtree(newer)


@pytest.fixture(scope="module")
def early(work_root, tiny_model_dir, launch_env) -> Launch:
    fresh_root = work_root / "early-root"
    fresh_root.mkdir()
    return launch(
        "early",
        fresh_root,
        tiny_model_dir,
        launch_env,
        max_steps=50,
        probe_env={rank_probe.SIGTERM_AT_BUILD_ENV: "3"},
    )


# ------------------------------------------------------------------------------ generate


@pytest.mark.parametrize("which", ["fresh", "resumed"])
def test_tp_groups_generate_alike_and_duplicates_sample_apart(which, request):
    run: Launch = request.getfixturevalue(which)
    calls = {rank: run.events(rank, "generate") for rank in range(WORLD)}
    counts = {rank: len(c) for rank, c in calls.items()}
    assert len(set(counts.values())) == 1 and counts[0] >= 4, (counts, run.tail())
    for index in range(counts[0]):
        for a, b in GROUPS:
            first, second = calls[a][index], calls[b][index]
            # The group's requests: both ranks' prompts, in rank order, with the group's seeds.
            assert first["prompts"] == second["prompts"] and len(first["prompts"]) == 4
            assert first["seeds"] == second["seeds"] and None not in first["seeds"]
            assert first["completions"] == second["completions"]
            # GRPO's num_generations copies of one prompt sample differently within the group.
            assert len({tuple(p) for p in first["prompts"]}) == 1
            assert len(set(first["seeds"])) == 4
            assert len({tuple(c) for c in first["completions"]}) > 1, first["completions"]
        assert set(calls[0][index]["seeds"]).isdisjoint(calls[2][index]["seeds"])  # groups differ too
        assert calls[0][index]["prompts"] != calls[2][index]["prompts"]


# ------------------------------------------------------------------------------ push


@pytest.mark.parametrize("which", ["fresh", "resumed"])
def test_every_push_leaves_every_engine_with_the_gathered_weights(which, request):
    run: Launch = request.getfixturevalue(which)
    pushes = {rank: run.events(rank, "push") for rank in range(WORLD)}
    assert len({len(p) for p in pushes.values()}) == 1 and len(pushes[0]) >= 2, (
        {r: len(p) for r, p in pushes.items()},
        run.tail(),
    )
    for index, push in enumerate(pushes[0]):
        same = [pushes[rank][index] for rank in range(WORLD)]
        assert all(p["equal"] for p in same), same  # engine == gathered trainer weights, bit for bit
        assert len({p["digest"] for p in same}) == 1
        assert len({p["version"] for p in same}) == 1
        # ZeRO-3 partitions over all 4 ranks; most tensors are split (tiny ones may sit whole on one rank).
        assert all(p["partition_world_sizes"] == [WORLD] for p in same)
        assert push["split_parameters"] > push["parameters"] // 2
    # One set of weights per trainer version (a level-2 sleep re-pushes the same one), new ones per step.
    digests = {}
    for push in pushes[0]:
        digests.setdefault(push["version"], set()).add(push["digest"])
    assert all(len(d) == 1 for d in digests.values()), digests
    assert len(set().union(*digests.values())) == len(digests) >= 2, digests


# ------------------------------------------------------------------------------ sleep policy


def test_every_rank_sleeps_alike_under_per_rank_cost_skew(fresh):
    levels = {rank: [r["level"] for r in fresh.events(rank, "sleep")] for rank in range(WORLD)}
    assert all(levels[rank] == levels[0] for rank in range(WORLD)), (levels, fresh.tail())
    decisions = {rank: [r["level"] for r in fresh.events(rank, "decision")] for rank in range(WORLD)}
    assert all(decisions[rank] == decisions[0] for rank in range(WORLD)), decisions
    assert 1 in levels[0], levels[0]  # a level-1 cycle ran, so the skewed wake was measured
    # The skew is real: ranks 2 and 3 measured a level-1 wake at least 0.5 s slower than rank 0 ...
    local = {rank: [r["local"] for r in fresh.events(rank, "agree")] for rank in range(WORLD)}
    agreed = {rank: [r["agreed"] for r in fresh.events(rank, "agree")] for rank in range(WORLD)}
    assert all(agreed[rank] == agreed[0] for rank in range(WORLD))
    skewed = [i for i, v in enumerate(local[2]) if v >= WAKE1_SKEW_S and local[0][i] < WAKE1_SKEW_S / 2]
    assert skewed, local
    # ... and rank 0 decided on the agreed (slow) wake: a level-1 cycle then costs more than the
    # level-2 one, which rank 0's own measurements would not have shown.
    after = fresh.events(0, "decision")
    assert any((d["cost_level1"] or 0) >= WAKE1_SKEW_S for d in after), after


def test_level1_prior_moves_one_tp_shard(fresh):
    for rank in range(WORLD):
        (build,) = fresh.events(rank, "build")
        assert build["tp"] == TP
        shard = build["weight_bytes"] / TP
        assert build["priors"]["sleep1"] == pytest.approx(shard / PRIOR_HOST_LINK_BYTES_PER_S)
        assert build["priors"]["wake1"] == pytest.approx(shard / PRIOR_HOST_LINK_BYTES_PER_S)
        assert build["priors"]["push"] == pytest.approx(build["weight_bytes"] / PRIOR_PUSH_BYTES_PER_S)


# ------------------------------------------------------------------------------ SIGTERM and resume


def test_sigterm_to_one_rank_stops_every_rank_at_one_complete_checkpoint(fresh):
    step = stop_step(fresh)
    assert step > SIGTERM_AFTER_STEP, fresh.tail()
    checkpoint = fresh.work.parent / "checkpoints" / f"checkpoint-{step}"
    assert (checkpoint / COMPLETE_MARKER).is_file()
    assert sorted(p.name for p in (checkpoint / f"global_step{step}").glob("*_model_states.pt")) == [
        f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(WORLD)
    ]
    assert fresh.exit_codes() == dict.fromkeys(range(WORLD), EXIT_TERMINATED), fresh.tail()
    assert fresh.returncode == EXIT_TERMINATED, fresh.tail()  # the pod exits with the code its ranks agreed on
    stops = re.findall(r"colocgrpo: stopped by (.+?) at step (\d+);", fresh.stdout)
    assert sorted(stops) == sorted([("a signal to another rank", str(step))] * 3 + [("signal 15", str(step))])
    message = json.loads((fresh.work / "termination-log").read_text())
    assert message["reason"] == "Terminated" and checkpoint.name in message["message"]


def test_resume_takes_the_newest_step_every_rank_sees_with_its_weights(fresh, resumed):
    step = stop_step(fresh)
    assert resumed.returncode == 0, resumed.tail()
    resumed_from = re.findall(r"rank(\d) WARNING colocgrpo_training.grpo_run: resuming from (\S+)", resumed.stderr)
    assert sorted(resumed_from) == [
        (str(r), str(fresh.work.parent / "checkpoints" / f"checkpoint-{step}")) for r in range(WORLD)
    ]
    assert f"newer ones seen by only some ranks: rank 0: [{step + 5}]; rank 1: [{step + 5}]" in resumed.stderr
    steps = resumed.progress_steps()
    assert min(steps) == step and max(steps) == step + 2
    assert {r["version"] for r in resumed.events(0, "push")} >= {step, step + 1}
    assert resumed.events(0, "push")[0]["version"] == step
    # The first push after resuming carries the checkpoint's weights, bit for bit.
    from safetensors.torch import load_file

    saved = load_file(str(fresh.work.parent / "checkpoints" / f"checkpoint-{step}" / "model.safetensors"))
    pushed = torch.load(resumed.work / "probe" / "first-push.pt")
    assert set(pushed) <= set(saved)
    assert all(torch.equal(pushed[name], saved[name]) for name in pushed)


def test_sigterm_to_one_rank_before_training_stops_every_rank(early):
    assert early.events(3, "sigterm_at_build"), early.tail()
    assert early.exit_codes() == dict.fromkeys(range(WORLD), EXIT_TERMINATED), early.tail()
    assert early.returncode == EXIT_TERMINATED, early.tail()
    stops = re.findall(r"colocgrpo: stopped by (.+?) before the first step", early.stdout)
    assert sorted(stops) == sorted(["a signal to another rank"] * 3 + ["signal 15"])
    assert not any(early.events(rank, "generate") for rank in range(WORLD))
    assert not list((early.work.parent / "checkpoints").glob("checkpoint-*"))
    assert json.loads((early.work / "termination-log").read_text())["reason"] == "Terminated"
