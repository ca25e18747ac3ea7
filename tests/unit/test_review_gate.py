"""Which spec changes `control.review.routes` holds back for a proposal (R5)."""

from __future__ import annotations

from sluice.control.review import gated_changes
from sluice.spec import load_spec_text

BASE = """
control: {{review: {{routes: {review}}}}}
pools: [{{name: p, count: 4, memory_gb: 16}}]
groups:
  - name: chat
    owner: o
    business: b
    alert_channel: c
    models: {{m: {{runtime: sim}}}}
    resources: {{pool: p, memory_gb: 1}}
    replicas: {replicas}
tenants: [{{name: t, api_keys: [{key}]}}]
routes: [{{tag: {tag}, match: {{models: [m]}}, to: chat}}]
"""


def spec(
    review: str = "true", replicas: int = 1, key: str = "k1-6ab9f1eb8f7d3388", tag: str = "main"
):
    text = BASE.format(review=review, replicas=replicas, key=key, tag=tag)
    return load_spec_text(text).spec


def test_routes_and_tenants_are_gated_groups_are_not() -> None:
    assert gated_changes(spec(), spec(tag="other")) == ["routes"]
    assert gated_changes(spec(), spec(key="k2-015f7e6bc5aeaf48")) == ["tenants"]
    assert gated_changes(spec(), spec(replicas=3)) == []


def test_review_off_gates_nothing_and_turning_it_off_is_itself_gated() -> None:
    assert gated_changes(spec("false"), spec("false", tag="other")) == []
    assert gated_changes(spec(), spec("false", tag="x")) == ["routes", "control.review"]
    assert gated_changes(spec("false"), spec("true")) == ["control.review"]


def test_the_first_spec_is_not_a_change() -> None:
    assert gated_changes(None, spec()) == []
