"""`exit_process`: the trainer process ends as Python's exit would, less the interpreter's finalization.

The abort it prevents (a torch process-group thread releasing a finished collective during finalization) is a race;
test_old_logps_multirank.py's launches end through it at world size 2, where an abort fails the launch.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.trainer

SCRIPT = textwrap.dedent(
    """
    import atexit, pathlib, sys, threading

    from colocgrpo_training.entrypoint import exit_process

    out = pathlib.Path(sys.argv[1])


    class Finalized:
        def __del__(self):
            (out / "finalized").write_text("the interpreter's finalization ran")


    kept = Finalized()  # a module global: released only by the interpreter's finalization
    atexit.register(lambda: (out / "atexit").write_text("ran"))
    go = threading.Event()


    def worker():
        go.wait()
        (out / "thread").write_text("finished")


    threading.Thread(target=worker).start()  # not a daemon: exit waits for it
    go.set()
    sys.stdout.write("buffered, no newline")  # stdout is a pipe here: block-buffered
    exit_process(int(sys.argv[2]))
    """
)


@pytest.mark.parametrize("code", [0, 143])
def test_exit_keeps_the_code_threads_atexit_and_output_and_skips_finalization(tmp_path, code):
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), str(code)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == code, result.stderr
    assert result.stdout == "buffered, no newline"
    assert (tmp_path / "thread").read_text() == "finished"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert not (tmp_path / "finalized").exists()


PYTEST_FILE = textwrap.dedent(
    """
    import os, pathlib


    class Finalized:
        # What it needs is bound here: by the time finalization releases it, module globals may be gone.
        def __del__(self, write=pathlib.Path(os.environ["OUT"], "finalized").write_text):
            write("the interpreter's finalization ran")


    kept = Finalized()


    def test_outcome():
        assert os.environ["OUTCOME"] == "pass"
    """
)


@pytest.mark.parametrize(("outcome", "code"), [("pass", 0), ("fail", 1)])
def test_the_gpu_suites_pytest_plugin_exits_with_pytests_status_after_its_reports(tmp_path, outcome, code):
    """tests/gpu/drivers/pytest_exit.py, as run_on_device.sh loads it into every pytest process of the GPU suites."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "test_suite.py").write_text(PYTEST_FILE)
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": f"{repo}:{repo / 'training'}",
        "OUT": str(tmp_path),
        "OUTCOME": outcome,
    }
    options = ["-p", "tests.gpu.drivers.pytest_exit", "-p", "no:cacheprovider", "--noconftest"]
    options += [f"--junitxml={tmp_path / 'junit.xml'}", str(tmp_path / "test_suite.py")]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *options],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == code, result.stdout + result.stderr
    assert f"1 {'passed' if code == 0 else 'failed'}" in result.stdout  # the summary, written before the exit
    assert 'tests="1"' in (tmp_path / "junit.xml").read_text()
    assert not (tmp_path / "finalized").exists()


# -- a finished trainer exits with its reward module's threads alive ------------------------------------------------

# Reward modules as judge or API clients are written: a pool kept for the process's life, or a long-lived event loop
# that hands blocking calls to `asyncio.to_thread`. Each leaves idle non-daemon worker threads behind.
POOL_REWARD = """
from concurrent.futures import ThreadPoolExecutor

POOL = ThreadPoolExecutor(max_workers=2)


def pooled(completions, **kwargs):
    return list(POOL.map(lambda c: float(len(str(c)) % 5), completions))
"""
TO_THREAD_REWARD = """
import asyncio

LOOP = asyncio.new_event_loop()


async def _scores(completions):
    return await asyncio.gather(*(asyncio.to_thread(lambda c=c: float(len(str(c)) % 5)) for c in completions))


def threaded(completions, **kwargs):
    return list(LOOP.run_until_complete(_scores(completions)))
"""
REWARD_MODULES = {"pool_reward": ("pooled", POOL_REWARD), "to_thread_reward": ("threaded", TO_THREAD_REWARD)}
SAVED_LINE = "colocgrpo: final model saved"
EXIT_AFTER_SAVE_S = 10  # what a finished trainer may take from its final save to its exit
GIVE_UP_S = 300  # a run that has not ended by then hangs (each takes well under a minute alone)


def _trainer_config(workdir, model_dir, modules: list[str], max_steps: int):
    import json

    import yaml

    from colocgrpo_training.config import CONFIG_VERSION

    rewards = workdir / "rewards"
    rewards.mkdir()
    for module in modules:
        (rewards / f"{module}.py").write_text(REWARD_MODULES[module][1])
    data = workdir / "train.jsonl"
    data.write_text("".join(json.dumps({"problem": f"What is {i} + {i}?"}) + "\n" for i in range(4)))
    config = {
        "version": CONFIG_VERSION,
        "job": {"name": "exits", "namespace": "default"},
        "model": {"name_or_path": str(model_dir), "dtype": "float32"},
        "dataset": {"name_or_path": str(data), "max_prompt_tokens": 32},
        "rewards": [{"function": f"{module}:{REWARD_MODULES[module][0]}"} for module in modules],
        "reward_modules_dir": str(rewards),
        "vllm": {"enabled": False},
        "checkpoint": {"dir": str(workdir / "checkpoints"), "save_final_model": True},
        "progress": {"min_interval_seconds": 0, "patch_status": False},
        "grpo": {
            "max_steps": max_steps,
            "per_device_train_batch_size": 4,
            "num_generations": 2,
            "max_completion_length": 4,
            "seed": 3,
            "dataloader_num_workers": 0,
            "disable_tqdm": True,
        },
    }
    path = workdir / "grpo.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


class _Run:
    """The trainer's console script in a subprocess, its stdout lines timed as they arrive."""

    def __init__(self, config, env) -> None:
        import threading
        import time
        from pathlib import Path

        self.lines: list[tuple[float, str]] = []
        script = Path(sys.executable).parent / "colocgrpo-train"  # what a CPU job's pod runs
        self.process = subprocess.Popen(
            [str(script), "--config", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.process.stderr), daemon=True).start()
        self._clock = time.monotonic

    def _read(self) -> None:
        import time

        for line in self.process.stdout:
            self.lines.append((time.monotonic(), line))

    def first(self, text: str, limit_s: float) -> float | None:
        """When the first line containing `text` arrived, waiting at most `limit_s` (None: it did not, or the
        process ended without it)."""
        import time

        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            found = next((at for at, line in list(self.lines) if text in line), None)
            if found is not None:
                return found
            if self.process.poll() is not None and not any(text in line for _, line in self.lines):
                time.sleep(0.5)  # the reader may still hold the last lines
                return next((at for at, line in list(self.lines) if text in line), None)
            time.sleep(0.1)
        return None

    def end(self, limit_s: float) -> float | None:
        """When the process ended, waiting at most `limit_s`; None (and the process killed) if it did not."""
        import time

        try:
            self.process.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return None
        return time.monotonic()

    def tail(self) -> str:
        return "".join(self.stderr)[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("module", sorted(REWARD_MODULES))
def test_a_finished_trainer_exits_0_with_its_reward_modules_threads_alive(
    tmp_path, tiny_model_dir, trainer_env, module
):
    run = _Run(_trainer_config(tmp_path, tiny_model_dir, [module], max_steps=1), trainer_env(tmp_path))
    saved = run.first(SAVED_LINE, GIVE_UP_S)
    assert saved is not None, run.tail()
    ended = run.end(EXIT_AFTER_SAVE_S * 3)
    assert ended is not None, f"still running {EXIT_AFTER_SAVE_S * 3} s after its final save\n{run.tail()}"
    assert run.process.returncode == 0, run.tail()
    assert ended - saved <= EXIT_AFTER_SAVE_S, f"exited {ended - saved:.1f} s after its final save"


@pytest.mark.slow
def test_sigterm_stops_a_trainer_with_reward_threads_alive_with_143(tmp_path, tiny_model_dir, trainer_env):
    import signal

    run = _Run(_trainer_config(tmp_path, tiny_model_dir, sorted(REWARD_MODULES), max_steps=500), trainer_env(tmp_path))
    assert run.first('{"progress"', GIVE_UP_S) is not None, run.tail()  # training is stepping
    run.process.send_signal(signal.SIGTERM)
    assert run.end(120) is not None, f"no exit within 120 s of SIGTERM\n{run.tail()}"
    assert run.process.returncode == 143, run.tail()
