"""Prefix-cache-aware instance choice (issue 35): the gateway-side index, the picker's load
guard and consistency, and the simulated fleet of KV caches it is studied on."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from sluice.core.errors import SpecError
from sluice.policy.prefix import PrefixIndex, pick_prefix, prompt_blocks
from sluice.policy.routing import Endpoint, PrefixRouting
from sluice.policy.snapshot import build_routing_snapshot
from sluice.sim.prefix import (
    CacheModel,
    PromptRequest,
    bound_hit_rate,
    load_block_trace,
    simulate_picker,
)
from sluice.spec import load_spec_text


def fleet(n: int, slots: int = 64) -> list[Endpoint]:
    return [Endpoint(f"i{k}", "127.0.0.1", 8000 + k, slots) for k in range(n)]


def test_the_index_knows_the_longest_prefix_each_instance_was_sent() -> None:
    index = PrefixIndex(blocks_per_instance=100)
    index.sent("a", [1, 2, 3, 4])
    index.sent("b", [1, 2, 9])
    assert index.matched([1, 2, 3, 5], ["a", "b", "c"]) == {"a": 3, "b": 2, "c": 0}
    assert index.matched([7, 1], ["a", "b"]) == {"a": 0, "b": 0}  # a prefix, not any block


def test_the_index_is_bounded_per_instance_and_forgets_who_left() -> None:
    index = PrefixIndex(blocks_per_instance=3)
    index.sent("a", [1, 2, 3])
    index.sent("a", [1, 4])  # 1 is used again, so 2 is the oldest: it goes
    assert len(index) == 3
    assert index.matched([1, 2], ["a"]) == {"a": 1}
    index.sent("b", [1])
    index.forget(keep={"b"})
    assert len(index) == 1 and index.matched([1], ["a", "b"]) == {"a": 0, "b": 1}
    with pytest.raises(ValueError):
        PrefixIndex(0)


def test_a_new_prefix_lands_on_the_same_instance_from_every_gateway() -> None:
    """Two gateways with their own (empty) indexes agree: the choice is rendezvous on the
    first block, not anything one gateway saw."""
    eps = fleet(8)
    idle = {ep.instance_id: 0 for ep in eps}
    for first in range(200):
        a = pick_prefix(eps, [first, 1000 + first], idle, PrefixIndex(10))
        b = pick_prefix(list(reversed(eps)), [first, 2000 + first], idle, None)
        assert a is not None and b is not None and a.endpoint == b.endpoint


def test_an_instance_leaving_moves_only_its_own_prefixes() -> None:
    eps = fleet(8)
    idle = {ep.instance_id: 0 for ep in eps}

    def owner(fleet: list[Endpoint], k: int) -> Endpoint:
        pick = pick_prefix(fleet, [k], idle, None)
        assert pick is not None
        return pick.endpoint

    before = {k: owner(eps, k) for k in range(2000)}
    gone = eps[3]
    after = {k: owner([e for e in eps if e != gone], k) for k in range(2000)}
    moved = [k for k in before if before[k] != after[k]]
    assert moved and all(before[k] == gone for k in moved)
    assert all(after[k] != gone for k in after)


def test_the_instance_holding_the_prefix_wins_until_it_is_over_the_bound() -> None:
    eps = fleet(4)
    index = PrefixIndex(100)
    index.sent("i2", [5, 6, 7])
    prompt = [5, 6, 7, 8]
    loads = {"i0": 2, "i1": 2, "i2": 3, "i3": 2}
    pick = pick_prefix(eps, prompt, loads, index, epsilon=1.0)
    assert pick is not None and pick.endpoint.instance_id == "i2"
    # bound = ceil((1 + epsilon) x (outstanding + 1) / instances): 5 when i2 was at 3; with
    # i2 at 6 and the others at 1 it is still 5, and i2 is over it, so another takes it
    loads = {"i0": 1, "i1": 1, "i2": 6, "i3": 1}
    pick = pick_prefix(eps, prompt, loads, index, epsilon=1.0)
    assert pick is not None and pick.endpoint.instance_id != "i2"
    # a full instance (at its max_concurrency) is never chosen for its cache
    small = [Endpoint(e.instance_id, e.host, e.port, 3) for e in eps]
    loads = {"i0": 0, "i1": 0, "i2": 3, "i3": 0}
    pick = pick_prefix(small, prompt, loads, index, epsilon=10.0)
    assert pick is not None and pick.endpoint.instance_id != "i2"


def test_everyone_over_the_bound_goes_to_the_least_loaded_and_skips_are_honoured() -> None:
    eps = fleet(3, slots=2)
    loads = {"i0": 2, "i1": 2, "i2": 2}
    pick = pick_prefix(eps, [1], loads, None)
    assert pick is not None
    assert pick_prefix(eps, [1], loads, None, skip={"i0", "i1", "i2"}) is None
    pick = pick_prefix(eps, [], {"i0": 4, "i1": 1, "i2": 3}, None)
    assert pick is not None and pick.endpoint.instance_id == "i1"


def conversations(seed: int = 3, n: int = 1500) -> list[PromptRequest]:
    """Multi-turn chats over shared system prompts: 300 conversations over 6 system prompts
    (8 blocks each), each turn re-sending the history (up to 40 blocks) plus a new block;
    Poisson arrivals at 12/s, blocks of 512 tokens."""
    rng = random.Random(seed)
    history: dict[int, list[int]] = {}
    next_block = 10_000
    out = []
    t = 0.0
    for _ in range(n):
        t += rng.expovariate(12.0)
        conv = rng.randrange(300)
        if conv not in history:
            history[conv] = [conv % 6 * 100 + b for b in range(8)]
        history[conv].append(next_block)
        next_block += 1
        blocks = tuple(history[conv][:40])
        out.append(PromptRequest(t, 512 * len(blocks), rng.randint(20, 200), blocks))
    return out


def test_the_prefix_picker_keeps_most_of_the_fleets_cache_and_a_better_tail() -> None:
    """On conversation traffic, with caches too small for everything: power of two choices
    scatters each chat over the fleet; the prefix picker keeps >= 80 % of what one cache of
    the fleet's size would hit, with a p99 time to first token no worse than power of two
    choices', and its guard spreads the hot system prompts that affinity piles up."""
    trace = conversations()
    model = CacheModel(instances=6, cache_blocks=200, prefill_tps=60_000.0)
    fleet_bound = bound_hit_rate(trace, model.instances * model.cache_blocks, 512)
    assert bound_hit_rate(trace, math.inf, 512) > fleet_bound > 0.5
    p2c = simulate_picker(trace, "p2c", model)
    affinity = simulate_picker(trace, "affinity", model)
    prefix = simulate_picker(trace, "prefix", model)
    assert prefix.hit_rate >= 0.8 * fleet_bound, (prefix, fleet_bound)
    assert prefix.hit_rate > p2c.hit_rate + 0.08, (prefix, p2c)
    assert prefix.ttft_p99_s <= p2c.ttft_p99_s, (prefix, p2c)
    assert prefix.busiest_share < affinity.busiest_share, (prefix, affinity)


def test_a_block_trace_line_that_is_not_mooncake_is_named(tmp_path: Path) -> None:
    good = '{"timestamp": 1000, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}'
    f = tmp_path / "t.jsonl"
    f.write_text(good + "\n" + '{"timestamp": 2000, "input_length": 5}\n')
    with pytest.raises(ValueError, match=r"t\.jsonl:2: not a Mooncake trace line"):
        load_block_trace(f)
    f.write_text(good + "\n")
    (req,) = load_block_trace(f)
    assert req == PromptRequest(0.0, 600, 5, (1, 2))
    with pytest.raises(ValueError, match="unknown picker"):
        simulate_picker([req], "random", CacheModel())


def test_prompt_blocks_hash_whole_blocks_of_the_rendered_prefix() -> None:
    system = {"role": "system", "content": "You are terse. " * 100}  # 1,500 bytes
    a = prompt_blocks({"messages": [system, {"role": "user", "content": "a" * 600}]}, 256, 64)
    b = prompt_blocks({"messages": [system, {"role": "user", "content": "b" * 600}]}, 256, 64)
    assert len(a) == len(b) == 8  # 2,1xx bytes: whole blocks only
    assert a[:5] == b[:5] and a[6:] != b[6:]  # equal up to where the prompts differ
    parts = {"role": "system", "content": [{"type": "text", "text": "You are terse. " * 100}]}
    assert prompt_blocks({"messages": [parts]}, 256, 64) == prompt_blocks(
        {"messages": [system]}, 256, 64
    )
    assert len(prompt_blocks({"messages": [system]}, 256, 2)) == 2  # the cap
    assert prompt_blocks({"prompt": ["x" * 1000]}, 256, 64) == prompt_blocks(
        {"prompt": "x" * 1000}, 256, 64
    )
    assert prompt_blocks({"prompt": "short"}, 256, 64) == ()
    assert prompt_blocks(["not", "a", "request"], 256, 64) == ()


def test_prefix_routing_is_on_for_groups_that_generate_unless_turned_off() -> None:
    """Written settings win; a group that generates (here `sim`) gets the defaults; an
    embedding group, or one written `enabled: false`, goes by power of two choices."""
    spec = load_spec_text(
        """
pools: [{name: p, count: 4, memory_gb: 80}]
groups:
  - name: chat
    owner: a@example.com
    business: b
    alert_channel: '#b'
    models: {m: {runtime: sim}}
    resources: {pool: p, memory_gb: 1}
    prefix_routing: {block_bytes: 1024, index_blocks: 2000}
  - name: other
    owner: a@example.com
    business: b
    alert_channel: '#b'
    models: {n: {runtime: sim}}
    resources: {pool: p, memory_gb: 1}
  - name: plain
    owner: a@example.com
    business: b
    alert_channel: '#b'
    models: {o: {runtime: sim}}
    resources: {pool: p, memory_gb: 1}
    prefix_routing: {enabled: false}
  - name: vectors
    owner: a@example.com
    business: b
    alert_channel: '#b'
    models: {e: {runtime: embedding}}
    resources: {pool: p, memory_gb: 1}
"""
    ).spec
    snap = build_routing_snapshot(spec, {}, 1)
    assert snap.traffic["chat"].prefix == PrefixRouting(1024, 64, 1.0, 2000)
    assert snap.traffic["other"].prefix == PrefixRouting()
    assert snap.traffic["plain"].prefix is None
    assert snap.traffic["vectors"].prefix is None
    with pytest.raises(SpecError, match="block_bytes"):
        load_spec_text(
            "pools: [{name: p, count: 1, memory_gb: 8}]\ngroups:\n  - name: g\n"
            "    owner: a@example.com\n    business: b\n    alert_channel: '#b'\n"
            "    models: {m: {runtime: sim}}\n    resources: {pool: p, memory_gb: 1}\n"
            "    prefix_routing: {block_bytes: 8}\n"
        )
