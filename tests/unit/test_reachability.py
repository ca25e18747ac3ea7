"""Reachability: an instance that refused a connection is out for `retry_s`, and suspect
until a connection to it succeeds."""

from __future__ import annotations

from sluice.policy import Reachability


def test_a_refusal_marks_an_instance_until_retry_then_suspect_until_a_success() -> None:
    reach = Reachability(retry_s=1.0)
    assert reach.unreachable(0.0) == {} and not reach.suspect("a")
    assert reach.failed("a", 10.0) is True  # newly out
    assert reach.failed("a", 10.5) is False  # still out: renewed, nothing changes
    assert reach.unreachable(11.0) == {"a": 11.5}
    assert reach.unreachable(11.5) == {}  # time for one more try...
    assert reach.suspect("a")  # ...but not trusted until it connects
    assert reach.failed("a", 11.6) is True  # refused again: out again
    assert reach.connected("a") is True and not reach.suspect("a")
    assert reach.unreachable(11.7) == {} and reach.connected("a") is False


def test_forget_drops_instances_that_left_the_group() -> None:
    reach = Reachability(retry_s=5.0)
    reach.failed("a", 0.0)
    reach.failed("b", 0.0)
    reach.forget({"b", "c"})
    assert reach.unreachable(1.0) == {"b": 5.0} and not reach.suspect("a")
