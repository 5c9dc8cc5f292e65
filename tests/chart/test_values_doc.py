"""values.yaml, values.schema.json and the docs' values table agree."""

from __future__ import annotations

import importlib.util
import json

import jsonschema
import pytest
import yaml
from helm_chart import CHART, REPO


def _values_table_module():
    spec = importlib.util.spec_from_file_location("values_table", REPO / "charts" / "values_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


values_table = _values_table_module()
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def test_committed_values_table_is_current():
    document = (REPO / "docs" / "install.md").read_text()
    assert values_table.with_table(document, values_table.render_table()) == document, (
        "docs/install.md's values table is stale: run `python charts/values_table.py --write`"
    )


def test_default_values_satisfy_the_schema():
    jsonschema.validate(VALUES, SCHEMA)


def test_schema_rejects_a_misspelt_nested_key():
    bad = yaml.safe_load((CHART / "values.yaml").read_text())
    bad["metrics"]["serviceMonitor"]["enable"] = True
    with pytest.raises(jsonschema.ValidationError, match="'enable' was unexpected"):
        jsonschema.validate(bad, SCHEMA)


def _closed_objects(schema, path=()):
    if schema.get("type") == "object" and "properties" in schema:
        yield path, schema
        for key, sub in schema["properties"].items():
            yield from _closed_objects(sub, (*path, key))


def test_every_object_with_keys_is_closed_and_every_key_described():
    for path, schema in _closed_objects(SCHEMA):
        assert schema.get("additionalProperties") is False, f"{'.'.join(path) or '<root>'} accepts unknown keys"
    documented = {row[0] for row in values_table.rows(SCHEMA, VALUES)}
    for key, _, _, description in values_table.rows(SCHEMA, VALUES):
        assert description, f"{key} has no description in values.schema.json"

    # Every default in values.yaml is documented (a leaf or a documented pass-through object).
    def leaves(node, path=()):
        if isinstance(node, dict) and node and ".".join(path) not in documented:
            for key, sub in node.items():
                yield from leaves(sub, (*path, key))
        else:
            yield ".".join(path)

    assert set(leaves(VALUES)) <= documented


def test_chart_versions_and_default_images_match_the_code():
    """Chart appVersion = the package version; the chart's default trainer image = the operator's built-in one."""
    import tomllib

    import colocgrpo_operator
    from colocgrpo_operator.render import DEFAULT_TRAINER_IMAGE

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == version == colocgrpo_operator.__version__
    # The CRD chart is released with the operator chart (one CRD, generated from one model).
    crds = yaml.safe_load((REPO / "charts" / "colocgrpo-crds" / "Chart.yaml").read_text())
    assert (crds["version"], crds["appVersion"]) == (chart["version"], chart["appVersion"])
    assert VALUES["trainerImage"] == DEFAULT_TRAINER_IMAGE
    assert VALUES["trainerImage"].endswith(f":{version}")


def test_the_trainer_image_is_held_to_the_grammar_spec_image_is() -> None:
    """The chart refuses at install what the operator would refuse at start (`--trainer-image`) and the API in a
    job's spec.image: one grammar, the model's."""
    from colocgrpo_operator.api.model import IMAGE_REFERENCE_PATTERN

    assert SCHEMA["properties"]["trainerImage"]["pattern"] == IMAGE_REFERENCE_PATTERN
