"""`OperatorConfig`: every knob a flag of `colocgrpo-operator`, bad values refused by flag name."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from colocgrpo_operator.daemon import build_parser, config_from_args, main
from colocgrpo_operator.kopf_glue.config import FLAGS, ConfigError, OperatorConfig


def test_every_field_is_a_flag_and_every_flag_a_field() -> None:
    fields = {field.name for field in dataclasses.fields(OperatorConfig)}
    assert set(FLAGS) == fields
    options = {option for action in build_parser()._actions for option in action.option_strings}
    assert set(FLAGS.values()) <= options
    help_text = build_parser().format_help()
    for flag in FLAGS.values():
        assert flag in help_text


def test_no_flags_give_the_class_defaults() -> None:
    assert config_from_args(build_parser().parse_args([])) == OperatorConfig()


def test_flags_reach_the_config(tmp_path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("{}")
    args = build_parser().parse_args(
        [
            "-n",
            "a",
            "--namespace=b",
            "--trainer-image=reg/trainer:1",
            "--metrics-port=0",
            "--liveness-port=8081",
            "--recheck-seconds=2.5",
            "--api-threads=4",
            "--kopf-connections=0",
            f"--kubeconfig={kubeconfig}",
            "--log-level=DEBUG",
        ]
    )
    assert config_from_args(args) == OperatorConfig(
        namespaces=("a", "b"),
        trainer_image="reg/trainer:1",
        metrics_port=0,
        liveness_port=8081,
        recheck_seconds=2.5,
        api_threads=4,
        kopf_connections=0,
        kubeconfig=str(kubeconfig),
        log_level="DEBUG",
    )


def test_an_empty_trainer_image_means_the_default() -> None:
    # The chart renders `--trainer-image=` when trainerImage is empty.
    assert OperatorConfig(trainer_image="").trainer_image is None


@pytest.mark.parametrize(
    ("settings", "flag"),
    [
        ({"namespaces": ("a", "")}, "--namespace"),
        ({"metrics_port": 70000}, "--metrics-port"),
        ({"liveness_port": -1}, "--liveness-port"),
        ({"metrics_port": 8080, "liveness_port": 8080}, "--metrics-port"),
        ({"recheck_seconds": 0}, "--recheck-seconds"),
        ({"recheck_seconds": float("inf")}, "--recheck-seconds"),
        ({"api_threads": 0}, "--api-threads"),
        ({"kopf_connections": -1}, "--kopf-connections"),
        ({"kubeconfig": "/nonexistent/kubeconfig"}, "--kubeconfig"),
        ({"log_level": "LOUD"}, "--log-level"),
        ({"trainer_image": "Trainer Image:latest"}, "--trainer-image"),
        ({"trainer_image": "reg/trainer:tag with space"}, "--trainer-image"),
    ],
)
def test_bad_values_are_refused_naming_the_flag(settings: dict[str, Any], flag: str) -> None:
    with pytest.raises(ConfigError) as refused:
        OperatorConfig(**settings)
    assert refused.value.flag == flag
    assert str(refused.value).startswith(f"{flag}: ")


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--recheck-seconds=-1"], "--recheck-seconds"),
        (["--api-threads=0"], "--api-threads"),
        (["-A", "-n", "team-a"], "--all-namespaces"),
    ],
)
def test_the_command_exits_2_naming_the_flag_before_starting(argv: list[str], flag: str, capsys) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(f"error: {flag}: ")
