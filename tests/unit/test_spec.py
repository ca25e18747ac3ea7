"""Spec loading: the quickstart is valid; every broken spec names file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.core import NotFound, SpecError
from sluice.spec import load_spec_file, load_spec_text

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"
TEXT = QUICKSTART.read_text()


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def issues(text: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        load_spec_text(text, "broken.yaml")
    return [str(i) for i in caught.value.issues]


def test_quickstart_is_valid_and_templates_are_stable() -> None:
    spec = load_spec_file(QUICKSTART).spec
    assert [g.name for g in spec.groups] == ["chat", "embed"]
    assert spec.groups[0].template() == load_spec_text(TEXT).spec.groups[0].template()


def test_version_change_changes_the_template() -> None:
    a = load_spec_text(TEXT).spec.groups[0].template()
    b = load_spec_text(TEXT.replace("version: v1", "version: v2")).spec.groups[0].template()
    assert a != b


def test_unknown_field_suggests_the_right_one() -> None:
    bad = TEXT.replace("max_concurrency: 16", "max_concurency: 16")
    [msg] = issues(bad)
    assert msg.startswith(f"broken.yaml:{line_of(bad, 'max_concurency')}: groups[0].max_concurency")
    assert "did you mean 'max_concurrency'" in msg


def test_out_of_range_value_names_value_and_line() -> None:
    bad = TEXT.replace("replicas: 2", "replicas: -2")
    [msg] = issues(bad)
    assert msg.startswith(f"broken.yaml:{line_of(bad, 'replicas: -2')}: groups[0].replicas")
    assert "-2" in msg


def test_memory_that_does_not_fit_is_rejected_before_launch() -> None:
    bad = TEXT.replace("memory_gb: 8}", "memory_gb: 40}")
    [msg] = issues(bad)
    assert "does not fit 1 x 16 GiB" in msg and "groups[0].resources.memory_gb" in msg


def test_model_bigger_than_instance_memory() -> None:
    bad = TEXT.replace("memory_gb: 6", "memory_gb: 12")
    [msg] = issues(bad)
    assert "models need 12 GiB" in msg and ">= 12" in msg


def test_route_to_unknown_group_and_missing_field() -> None:
    bad = TEXT.replace("to: embed", "to: nowhere").replace("    owner: bob@example.com\n", "")
    found = issues(bad)
    assert any("groups[1].owner: required field is missing" in m for m in found)


def test_cross_reference_errors_are_all_reported() -> None:
    bad = TEXT.replace("to: embed", "to: nowhere").replace("count: 8", "count: 2")
    found = issues(bad)
    assert any(f":{line_of(bad, 'to: nowhere')}: routes[1].to: no group named" in m for m in found)
    assert any("pools[0].count: groups ask for 3 accelerators" in m for m in found)


def test_yaml_syntax_error_has_a_line() -> None:
    [msg] = issues(TEXT.replace("port: 8080", "port: [8080"))
    assert msg.startswith("broken.yaml:") and "not valid YAML" in msg


def test_a_missing_file_is_reported_as_missing_not_as_a_bad_spec() -> None:
    with pytest.raises(NotFound, match=r"spec file not found: /nonexistent/spec\.yaml"):
        load_spec_file("/nonexistent/spec.yaml")


def test_an_unreadable_path_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read spec"):
        load_spec_file(tmp_path)  # a directory


def test_weighted_route_targets_are_checked_one_by_one() -> None:
    bad = TEXT.replace(
        "    to: embed\n",
        "    to: [{group: embed, weight: 90}, {group: ghost, weight: 10}]\n    fallback: [chat]\n",
    )
    found = issues(bad)
    assert any("routes[1].to[1].group: no group named 'ghost'" in m for m in found)
    assert any(
        "routes[1].fallback[0]: group 'chat' does not serve model(s) demo-embed" in m for m in found
    )


def test_weights_must_add_up() -> None:
    bad = TEXT.replace("    to: embed\n", "    to: [{group: embed, weight: 0}]\n")
    [msg] = issues(bad)
    assert "routes[1]: the weights in 'to' must add up to more than 0" in msg


def test_the_traffic_example_is_valid() -> None:
    spec = load_spec_file(QUICKSTART.parent / "traffic.yaml").spec
    assert [r.tag for r in spec.routes] == ["beta-users", "chat-canary-10"]
