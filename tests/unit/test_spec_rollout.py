"""Rollout specs: defaults, step and pacing validation, and cross-checks against groups and
tenants, each naming the file, line and field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sluice.core import SpecError
from sluice.spec import load_spec_text
from sluice.spec.rollouts import DEFAULT_STEPS, AnalysisSpec, PacingSpec, RolloutSpec

HEAD = """\
pools:
  - {name: gpu, count: 10, memory_gb: 80}
tenants:
  - {name: tools, api_keys: [k1-6ab9f1eb8f7d3388]}
  - {name: payments, api_keys: [k2-015f7e6bc5aeaf48], groups: [chat, chat-v2]}
groups:
"""


def group(name: str, models: str = "chat-model", business: str = "b") -> str:
    body = ", ".join(f"{m}: {{runtime: sim}}" for m in models.split(","))
    return f"""\
  - name: {name}
    owner: o@example.com
    business: {business}
    alert_channel: "#c"
    models: {{{body}}}
    resources: {{pool: gpu, memory_gb: 8}}
"""


GROUPS = group("chat") + group("chat-v2", "chat-model,extra")


def rollout(
    name: str = "v2", baseline: str = "chat", canary: str = "chat-v2", extra: str = ""
) -> str:
    return f"  - {{name: {name}, baseline: {baseline}, canary: {canary}{extra}}}\n"


def issues(text: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        load_spec_text(text, "r.yaml")
    return [str(i) for i in caught.value.issues]


def test_a_rollout_with_defaults_loads() -> None:
    text = (
        HEAD
        + GROUPS
        + "rollouts:\n"
        + rollout(extra=", pacing: {early: [tools], late: [payments]}")
    )
    [r] = load_spec_text(text).spec.rollouts
    assert r.steps == list(DEFAULT_STEPS) == [1, 2, 4, 8, 16, 32, 50, 70, 85, 95, 100]
    assert (r.hold_s, r.max_wait_s, r.on_no_data) == (60.0, 1800.0, "pause")
    assert r.analysis.min_samples is None and r.analysis.disable == []
    assert (r.analysis.false_rollback_rate, r.analysis.power) == (0.01, 0.95)
    assert r.pacing.late_from_percent == 50 and r.compare is None
    assert load_spec_text(HEAD + GROUPS).spec.rollouts == []


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([], "at least one percent"),
        ([5, 5, 100], "steps[1] = 5 must be greater than steps[0] = 5"),
        ([10, 50], "the last step is 50; it must be 100"),
        ([0, 100], "steps[0] = 0, must be > 0 and <= 100"),
        ([50, 120], "steps[1] = 120, must be > 0 and <= 100"),
    ],
)
def test_steps_must_climb_to_100(steps: list[float], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        RolloutSpec(name="r", baseline="a", canary="b", steps=steps)


def test_field_level_rules() -> None:
    with pytest.raises(ValidationError, match="baseline and canary are both 'a'"):
        RolloutSpec(name="r", baseline="a", canary="a")
    with pytest.raises(ValidationError, match="max_wait_s = 30 must be >= hold_s = 60"):
        RolloutSpec(name="r", baseline="a", canary="b", max_wait_s=30)
    with pytest.raises(ValidationError, match="both early and late"):
        PacingSpec(early=["x"], late=["x"])
    with pytest.raises(ValidationError, match="late_from_percent = 10 must be >= normal"):
        PacingSpec(normal_from_percent=20, late_from_percent=10)
    with pytest.raises(ValidationError):
        AnalysisSpec(disable=["no_such_criterion"])  # type: ignore[list-item]
    with pytest.raises(ValidationError):
        AnalysisSpec(latency_p95_ratio=2)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match=r"alpha = 0\.05 is no longer a setting"):
        AnalysisSpec.model_validate({"alpha": 0.05})
    with pytest.raises(ValidationError, match="false_rollback_rate"):
        AnalysisSpec(false_rollback_rate=0.5)
    with pytest.raises(ValidationError, match="gross_error_rate"):
        AnalysisSpec(gross_error_rate=1.0)  # a canary can fail no more than all its answers


def test_bad_analysis_knobs_are_located() -> None:
    text = HEAD + GROUPS + "rollouts:\n" + rollout(extra=", analysis: {power: 1.5}")
    msgs = issues(text)
    line = len((HEAD + GROUPS).splitlines()) + 2
    assert any(m.startswith(f"r.yaml:{line}: rollouts[0].analysis.power") for m in msgs), msgs
    assert any("less than 1" in m for m in msgs), msgs


def test_unknown_groups_and_tenants_are_located() -> None:
    text = (
        HEAD
        + GROUPS
        + "rollouts:\n"
        + rollout(canary="chat-v3", extra=", pacing: {early: [nobody]}")
    )
    msgs = issues(text)
    line = len((HEAD + GROUPS).splitlines()) + 2
    assert any(
        m.startswith(f"r.yaml:{line}: rollouts[0].canary: no group named 'chat-v3'") for m in msgs
    ), msgs
    assert any("rollouts[0].pacing.early[0]: no tenant named 'nobody'" in m for m in msgs), msgs


def test_canary_must_serve_the_baseline_models_for_the_same_business() -> None:
    text = HEAD + group("chat", "chat-model,summarize") + group("chat-v2", "chat-model", "other")
    msgs = issues(text + "rollouts:\n" + rollout())
    assert any("does not serve model(s) summarize of baseline 'chat'" in m for m in msgs), msgs
    assert any("serves business 'other' but baseline 'chat' serves 'b'" in m for m in msgs), msgs


def test_names_unique_and_one_rollout_per_group() -> None:
    text = HEAD + GROUPS + group("chat-v3") + "rollouts:\n" + rollout() + rollout(canary="chat-v3")
    msgs = issues(text)
    assert any("rollouts[1].name: duplicate rollout name 'v2'" in m for m in msgs), msgs
    assert any("group 'chat' is already the baseline of rollouts[0] ('v2')" in m for m in msgs), (
        msgs
    )


def test_a_tenant_allowed_the_baseline_must_be_allowed_the_canary() -> None:
    text = HEAD.replace("groups: [chat, chat-v2]", "groups: [chat]") + GROUPS
    [msg] = issues(text + "rollouts:\n" + rollout())
    assert "tenants[1].groups" in msg
    assert "tenant 'payments' may reach baseline 'chat' of rollout 'v2' but not its canary" in msg
