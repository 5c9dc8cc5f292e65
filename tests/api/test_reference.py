"""docs/api.md carries the field reference generated from the model; it must be current."""

from __future__ import annotations

from pathlib import Path

from colocgrpo_operator.api.reference import BEGIN, END, field_reference_markdown

REPO = Path(__file__).resolve().parents[2]


def test_docs_api_md_field_reference_is_current():
    text = (REPO / "docs/api.md").read_text()
    start, stop = text.index(BEGIN), text.index(END) + len(END)
    assert text[start:stop] + "\n" == field_reference_markdown(), (
        "docs/api.md is stale: replace its generated block with `colocgrpo crd --reference`"
    )


def test_reference_lists_every_spec_field_with_required_marks():
    reference = field_reference_markdown()
    for path in (
        "spec.vllm.tensorParallelSize",
        "spec.trainerArgs",
        "spec.runPolicy.suspend",
        "status.progress.metrics",
    ):
        assert f"| `{path}` |" in reference
    assert "| `spec.model` | object | **required** |" in reference
