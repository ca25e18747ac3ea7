"""`autoscaling.mode` and `quota.mode` (issue 16): active by default; an advisory
autoscaler that could not make sense is a located error that names the fix."""

from __future__ import annotations

from sluice.policy import build_routing_snapshot
from sluice.spec import load_spec_text
from tests.unit.test_spec_quota import HEAD, group, issues, line_of


def scaled(autoscaling: str, *, replicas: int = 1, quota: str = "") -> str:
    text = HEAD + group("a", quota, extra=f"    autoscaling: {autoscaling}\n")
    return text.replace("replicas: 1", f"replicas: {replicas}")


def test_modes_are_active_unless_told() -> None:
    g = load_spec_text(scaled("{max: 3}")).spec.groups[0]
    assert g.autoscaling is not None and g.autoscaling.mode == "active"
    assert g.quota.mode == "active"
    g = load_spec_text(scaled("{mode: advisory, max: 3}", quota="{mode: advisory}")).spec.groups[0]
    assert g.autoscaling is not None and g.autoscaling.mode == "advisory"
    assert g.quota.mode == "advisory"


def test_an_unknown_mode_is_located() -> None:
    text = scaled("{mode: watch, max: 3}")
    [msg] = issues(text)
    assert f"q.yaml:{line_of(text, 'autoscaling:')}: groups[0].autoscaling.mode" in msg
    assert "'active' or 'advisory'" in msg


def test_an_advisory_group_at_zero_or_with_a_warm_standby_names_the_fix() -> None:
    text = scaled("{mode: advisory, min: 0, max: 3}", replicas=0)
    [msg] = issues(text)
    assert f"q.yaml:{line_of(text, 'replicas:')}: groups[0].replicas" in msg
    assert "0 would serve no request" in msg and "autoscaling.mode: active" in msg
    text = scaled("{mode: advisory, max: 3, warm_standby: 1}")
    [msg] = issues(text)
    assert "groups[0].autoscaling.warm_standby" in msg
    assert "set warm_standby: 0, or autoscaling.mode: active" in msg
    load_spec_text(scaled("{min: 0, max: 3, warm_standby: 1}", replicas=0))  # active: fine


def test_an_advisory_group_needs_room_for_its_replicas_not_its_autoscaling_min() -> None:
    load_spec_text(scaled("{mode: advisory, min: 3, max: 6}", quota="{limit: 2}"))
    [msg] = issues(scaled("{min: 3, max: 6}", quota="{limit: 2}"))
    assert "autoscaling.min needs 3 x 1 = 3 accelerators but limit is 2" in msg


def test_the_gateway_holds_no_request_for_an_advisory_group_at_zero() -> None:
    spec = load_spec_text(scaled("{min: 0, max: 3}")).spec
    assert build_routing_snapshot(spec, {}, 1).traffic["a"].buffer_when_cold
    spec = load_spec_text(scaled("{mode: advisory, min: 0, max: 3}")).spec
    assert not build_routing_snapshot(spec, {}, 1).traffic["a"].buffer_when_cold


def test_sleeping_standby_needs_servers_that_sleep_and_an_active_autoscaler() -> None:
    text = scaled("{max: 3, sleeping_standby: 1}")  # a `sim` group: the sim worker sleeps
    sleep = load_spec_text(text).spec.groups[0].sleep  # loads: no issue
    assert sleep is not None and (sleep.sleep_path, sleep.wake_path) == ("/sleep", "/wake_up")
    argv = '["srv", "--port", "{port}"]'  # a command server that declares no sleep mode
    text = text.replace("runtime: sim, version: v1", f"runtime: command, command: {{argv: {argv}}}")
    [msg] = issues(text)
    assert "groups[0].models.m-a" in msg, msg
    assert "command.sleep" in msg and "sleeping_standby: 0" in msg
    [msg] = issues(scaled("{max: 2, stable: 1, warm_standby: 1, sleeping_standby: 1}"))
    assert "stable + warm_standby + sleeping_standby must not exceed max" in msg
    msgs = issues(scaled("{mode: advisory, max: 3, sleeping_standby: 1}"))
    assert any("set sleeping_standby: 0, or autoscaling.mode: active" in m for m in msgs), msgs


def test_a_group_with_sleeping_standby_tells_the_gateways_how_to_wake_it() -> None:
    argv = '["srv", "--port", "{port}"]'
    sleep = "{wake_path: /wake, wake_timeout_s: 12, host_memory_gb: 16}"
    model = f"runtime: command, command: {{argv: {argv}, sleep: {sleep}}}"
    text = scaled("{max: 3, sleeping_standby: 1}").replace("runtime: sim, version: v1", model)
    spec = load_spec_text(text).spec
    wake = build_routing_snapshot(spec, {}, 1).traffic["a"].wake
    assert wake is not None and (wake.path, wake.timeout_s) == ("/wake", 12.0)
