"""A group handed back after a drill (`sluice.policy.kernel.handed_back`): its autoscaler
starts afresh from the count the drill found, so the drill's peak, which no caller sent, no
longer holds instances through the cooldown."""

from __future__ import annotations

import pytest

from sluice.policy.autoscale import GroupLoad
from sluice.policy.kernel import Compiled, Memory, World, compile_spec, handed_back, step
from sluice.spec import load_spec_text

T0 = 1_800_000_000.0
SPEC = """
pools:
  - {name: gpu, count: 16, memory_gb: 16}
groups:
  - name: elastic
    owner: o
    business: b
    alert_channel: c
    models: {m: {runtime: sim}}
    resources: {pool: gpu, memory_gb: 1}
    max_concurrency: 2
    autoscaling:
      {min: 1, max: 8, stable: STABLE, interval_s: 1, down: {cooldown_s: 600, stabilization_s: 600}}
  - name: advised
    owner: o
    business: b
    alert_channel: c
    models: {m: {runtime: sim}}
    resources: {pool: gpu, memory_gb: 1}
    replicas: 2
    autoscaling: {min: 1, max: 4, mode: advisory}
  - name: fixed
    owner: o
    business: b
    alert_channel: c
    models: {m: {runtime: sim}}
    resources: {pool: gpu, memory_gb: 1}
    replicas: 2
"""


def compiled(stable: int = 0) -> Compiled:
    return compile_spec(load_spec_text(SPEC.replace("STABLE", str(stable))).spec)


PEAK_S = 30
"""elastic gets 40 requests a second for its first 30 s, then none"""


def run(memory: Memory, c: Compiled, since_s: int, seconds: int) -> Memory:
    """`seconds` one-second ticks of elastic from `since_s` (the peak, then no load)."""
    for k in range(since_s, since_s + seconds):
        busy = k < PEAK_S
        arrivals = 40 * min(k + 1, PEAK_S)  # cumulative, as the gateway counts
        current = memory.counts.get("elastic", 1)
        load = GroupLoad(
            at=T0 + k,
            current=current,
            ready=current,
            slots_per_instance=2,
            in_flight=8 if busy else 0,
            queued=20 if busy else 0,
            arrivals=arrivals,
            completions=arrivals,
        )
        _, memory = step(memory, World(c, [], loads={"elastic": load}), T0 + k)
    return memory


def test_a_handed_back_group_forgets_the_peak_and_an_untouched_one_holds_it() -> None:
    c = compiled()
    after_peak = run(Memory(), c, 0, PEAK_S)
    assert after_peak.counts["elastic"] > 1
    # left alone, the 600 s cooldown keeps the peak's instances once the load is gone
    assert run(after_peak, c, PEAK_S, 30).counts["elastic"] == after_peak.counts["elastic"]
    count, back = handed_back(after_peak, c, "elastic", 1)
    assert count == 1 and back.counts["elastic"] == 1
    assert run(back, c, PEAK_S, 30).counts["elastic"] == 1
    # the memory given is not changed (a value in, a value out)
    assert after_peak.counts["elastic"] > 1


def test_the_count_handed_back_stays_within_the_autoscalers_bounds() -> None:
    c = compiled(stable=2)
    assert handed_back(Memory(), c, "elastic", 0)[0] == 2  # max(min 1, stable 2)
    assert handed_back(Memory(), c, "elastic", 50)[0] == 8  # max


@pytest.mark.parametrize("group", ["advised", "fixed", "nope"])
def test_only_an_actively_autoscaled_group_is_handed_back(group: str) -> None:
    with pytest.raises(KeyError):
        handed_back(Memory(), compiled(), group, 1)
