"""Quota and budget validation: bad guarantees, caps and budgets name file:line and numbers."""

from __future__ import annotations

import pytest

from sluice.core import SpecError
from sluice.spec import load_spec_text

HEAD = """\
pools:
  - name: gpu
    count: 10
    memory_gb: 80
    price_per_hour: 2.0
  - name: train
    count: 4
    memory_gb: 80
    purpose: training
groups:
"""


def group(name: str, quota: str = "", *, extra: str = "", accelerators: int = 1) -> str:
    text = f"""\
  - name: {name}
    owner: o@example.com
    business: b
    alert_channel: "#c"
    models:
      m-{name}: {{runtime: sim, version: v1}}
    resources: {{pool: gpu, accelerators: {accelerators}, memory_gb: 8}}
    replicas: 1
"""
    if quota:
        text += f"    quota: {quota}\n"
    return text + extra


def issues(text: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        load_spec_text(text, "q.yaml")
    return [str(i) for i in caught.value.issues]


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_guarantees_that_fit_are_accepted() -> None:
    text = HEAD + group("a", "{guaranteed: 6, limit: 8}") + group("b", "{guaranteed: 4}")
    spec = load_spec_text(text).spec
    assert spec.groups[0].quota.guaranteed == 6
    assert spec.groups[1].quota.borrow_limit is None  # no cap: may borrow up to its limit


def test_a_group_without_quota_is_valid_best_effort() -> None:
    spec = load_spec_text(HEAD + group("a")).spec
    q = spec.groups[0].quota
    assert (q.guaranteed, q.limit, q.borrow_limit, q.reserved) == (0, None, None, False)


def test_guarantees_exceeding_the_pool_name_the_numbers_and_line() -> None:
    text = HEAD + group("a", "{guaranteed: 8}") + group("b", "{guaranteed: 4}")
    [msg] = issues(text)
    assert msg.startswith(f"q.yaml:{line_of(text, 'count: 10')}: pools[0].count")
    assert "groups guarantee 12 accelerators in pool 'gpu' (a: 8, b: 4) but it has 10" in msg


def test_limit_below_guaranteed_and_lendable_above_guaranteed() -> None:
    [msg] = issues(HEAD + group("a", "{guaranteed: 4, limit: 2}"))
    assert "limit (2) is below guaranteed (4)" in msg
    [msg] = issues(HEAD + group("a", "{guaranteed: 2, lendable: 3}"))
    assert "lendable (3) exceeds guaranteed (2)" in msg


def test_limit_beyond_the_pool_or_below_one_instance() -> None:
    text = HEAD + group("a", "{limit: 12}")
    [msg] = issues(text)
    assert "groups[0].quota.limit" in msg and "limit 12 exceeds pool 'gpu'" in msg
    text = HEAD + group("a", "{limit: 1}", accelerators=2).replace("replicas: 1", "replicas: 0")
    [msg] = issues(text)
    assert "limit 1 is below one instance's 2 accelerators" in msg


def test_replicas_or_autoscaling_floor_above_the_caps() -> None:
    text = HEAD + group("a", "{limit: 2}").replace("replicas: 1", "replicas: 3")
    [msg] = issues(text)
    assert f"q.yaml:{line_of(text, 'quota:')}: groups[0].quota.limit" in msg
    assert "replicas needs 3 x 1 = 3 accelerators but limit is 2" in msg
    scaled = "    autoscaling: {min: 2, max: 6, stable: 3}\n"
    text = HEAD + group("a", "{guaranteed: 1, borrow_limit: 1}", extra=scaled)
    [msg] = issues(text)
    assert "groups[0].quota.borrow_limit" in msg
    assert "autoscaling.stable needs 3 x 1 = 3 accelerators but guaranteed + borrow_limit is 2" in (
        msg
    )


def test_budgets_below_the_guaranteed_spend_rate() -> None:
    text = HEAD + group(
        "a", "{guaranteed: 5}", extra="    budget: {per_hour: 8, per_month: 5000}\n"
    )
    found = issues(text)
    assert any(
        "groups[0].budget.per_hour" in m
        and "per_hour 8 is below a's guaranteed spend rate 10/h" in m
        for m in found
    )
    assert any("per_month 5000" in m and "10/h x 744 = 7440" in m for m in found)
    text = (
        HEAD.replace("pools:", "budget: {per_hour: 9}\npools:")
        + group("a", "{guaranteed: 3}")
        + group("b", "{guaranteed: 2}")
    )
    [msg] = issues(text)
    assert msg.startswith(f"q.yaml:{line_of(text, 'budget:')}: budget.per_hour")
    assert "below all groups' guaranteed spend rate 10/h" in msg


def test_inference_group_on_a_training_pool_is_refused() -> None:
    text = HEAD + group("a").replace("pool: gpu", "pool: train")
    [msg] = issues(text)
    assert "training pool" in msg and "(Q5)" in msg


def test_budgets_in_accelerators_and_accelerator_hours() -> None:
    budget = "    budget: {max_accelerators: 6, accelerator_hours_per_month: 3000}\n"
    text = HEAD.replace("pools:", "budget: {max_accelerators: 9}\npools:") + group(
        "a", extra=budget
    )
    spec = load_spec_text(text).spec
    assert spec.budget is not None and spec.budget.max_accelerators == 9
    b = spec.groups[0].budget
    assert b is not None and (b.max_accelerators, b.accelerator_hours_per_month) == (6, 3000)


def test_accelerator_budgets_below_one_or_not_positive_are_refused() -> None:
    for field, value, why in [
        ("max_accelerators", "0", "greater than or equal to 1"),
        ("max_accelerators", "-2", "greater than or equal to 1"),
        ("max_accelerators", "1.5", "valid integer"),
        ("accelerator_hours_per_month", "0", "greater than 0"),
        ("accelerator_hours_per_month", "-10", "greater than 0"),
    ]:
        text = HEAD + group("a", extra=f"    budget: {{{field}: {value}}}\n")
        [msg] = issues(text)
        assert msg.startswith(f"q.yaml:{line_of(text, 'budget:')}: groups[0].budget.{field}")
        assert why in msg and f"(got {value})" in msg
