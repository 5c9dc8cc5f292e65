"""`python -m colocgrpo_training --config FILE` (and `colocgrpo train`): the pod's main program.

Exit codes: 0 done; 1 a failure (reason in the termination message); 2 invalid config;
143 stopped by SIGTERM after saving a checkpoint (the next pod resumes from it).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

from pydantic import ValidationError

from colocgrpo_training.config import TrainerConfig
from colocgrpo_training.cuda_arch import make_arch_list_deepspeed_readable
from colocgrpo_training.failures import EXIT_TERMINATED, InvalidConfigError, classify, write_termination_message


def load_config(path: str) -> TrainerConfig:
    """The trainer config, or InvalidConfigError naming the bad field."""
    try:
        return TrainerConfig.load(path)
    except FileNotFoundError as err:
        raise InvalidConfigError(f"trainer config {path} does not exist") from err
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in err.errors())
        raise InvalidConfigError(f"trainer config {path}: {problems}") from err
    except ValueError as err:  # bad YAML or an unsupported version
        raise InvalidConfigError(f"trainer config {path}: {err}") from err


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m colocgrpo_training", description="Run one GRPO training job from a trainer config."
    )
    parser.add_argument("--config", required=True, help="trainer config (grpo.yaml rendered by the operator)")
    return parser


def _setup_logging() -> None:
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.INFO if rank == "0" else logging.WARNING,
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
    )


def run(config_path: str) -> int:
    """Load, train, and turn any fatal error into a termination message + exit code."""
    from colocgrpo_training.checkpoints import TerminationRequest

    termination = TerminationRequest()
    termination.install()
    arch_list = make_arch_list_deepspeed_readable()
    if arch_list is not None:
        logging.getLogger(__name__).info("TORCH_CUDA_ARCH_LIST set to %s for DeepSpeed's op builds", arch_list)
    try:
        config = load_config(config_path)
        from colocgrpo_training.grpo_run import run_grpo  # heavy: torch, transformers, trl

        code = run_grpo(config, termination)
        if code == EXIT_TERMINATED:
            termination.ignore_further()
        return code
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        failure = classify(exc)
        traceback.print_exc()
        print(f"colocgrpo: {failure.reason}: {failure.message}", file=sys.stderr, flush=True)
        write_termination_message(failure)
        return failure.exit_code


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging()
    return run(args.config)
