"""`colocgrpo train --config FILE`: run the trainer in this process (needs the trainer extras)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "train",
        help="run a GRPO training job from a trainer config (what the pods run)",
        description="Run a GRPO training job from a trainer config file (grpo.yaml). "
        "Needs torch/transformers/trl (pip install 'colocgrpo[trainer]').",
    )
    parser.add_argument("--config", required=True, help="trainer config file (grpo.yaml)")
    parser.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    import importlib.util
    import sys

    missing = [name for name in ("torch", "transformers", "trl") if importlib.util.find_spec(name) is None]
    if missing:
        print(
            f"colocgrpo train: the trainer's dependencies are not installed ({', '.join(missing)}); "
            "pip install 'colocgrpo[trainer]' (and torch)",
            file=sys.stderr,
        )
        return 2
    # Imported here: the operator package never imports the trainer's heavy dependencies.
    from colocgrpo_training.entrypoint import exit_process, main

    exit_process(main(["--config", args.config]))  # as `python -m colocgrpo_training` ends
