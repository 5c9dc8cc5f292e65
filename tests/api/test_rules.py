"""The table of cross-field rules (colocgrpo_training.rules) and its readers off the cluster: `colocgrpo validate`
reports each broken rule once, at its field, in the words the CRD's CEL says; the trainer config checks the rules
whose fields it carries; the table's defaults are the types' own."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from colocgrpo_operator.api import JobSpecError, parse_job
from colocgrpo_operator.api.crd import cel_rule
from colocgrpo_operator.api.model import ColocGRPOJob, ColocGRPOJobSpec, Toleration
from colocgrpo_operator.render import render_trainer_config
from colocgrpo_training import rules
from colocgrpo_training.config import TrainerConfig
from support.rule_cases import BREAKS, broken, seed_job


def test_every_rule_has_a_case_that_breaks_it():
    assert sorted(BREAKS) == sorted(rule.name for rule in rules.RULES)
    parse_job(seed_job())  # and the seed breaks none


@pytest.mark.parametrize("rule", rules.RULES, ids=lambda rule: rule.name)
def test_validate_reports_a_broken_rule_once_at_its_field(rule):
    with pytest.raises(JobSpecError) as caught:
        parse_job(broken(rule))
    (problem,) = caught.value.errors
    path, message = problem
    where = f"spec.{rule.scope}[0]" if rule.scope else "spec"
    assert path == (f"{where}.{rule.fields[rule.reports].spec}" if rule.reports else where)
    if rule.cel is not None:
        cel = cel_rule(rule)
        if "message" in cel:  # no values in it: the API server's words are these, after the field's path
            assert cel["message"] == (f"{path} {message}" if rule.reports else message)
        else:  # the same text with the values CEL inserts (tests/api/test_crd_cluster.py reads them back)
            assert cel["messageExpression"].startswith(f'"{path} ')


def _default(model: type[BaseModel], path: str) -> object:
    node: type[BaseModel] = model
    for part in path.split("."):
        name = next(n for n, info in node.model_fields.items() if part in (info.alias, n))
        info = node.model_fields[name]
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            node = info.annotation
            continue
        return info.get_default(call_default_factory=True)
    raise AssertionError(f"{path} is a section, not a field")


@pytest.mark.parametrize("rule", rules.RULES, ids=lambda rule: rule.name)
def test_the_tables_defaults_are_the_types_own(rule):
    for field in rule.fields.values():
        if field.spec.startswith("trainerArgs."):
            assert field.default is None
            continue
        model: type[BaseModel] = Toleration if rule.scope else ColocGRPOJobSpec
        assert _default(model, field.spec) == field.default, field.spec
        if field.config is not None and not field.config.startswith("grpo."):
            assert _default(TrainerConfig, field.config) == field.default, field.config


@pytest.mark.parametrize("rule", [rule for rule in rules.RULES if rule.in_config], ids=lambda rule: rule.name)
def test_a_trainer_config_gets_the_rules_it_carries(rule):
    # What the operator would render for the broken job (the model checks single fields only): the config itself
    # refuses it, naming the field in the config's own words.
    job = ColocGRPOJob.model_validate(broken(rule))
    with pytest.raises(ValidationError) as refused:
        render_trainer_config(job)
    assert rule.reports is not None
    opening = rule.message.split("<")[0].split("{")[0]  # the message's words before its first field or value
    assert f"{rule.fields[rule.reports].config}: {opening}" in str(refused.value)
