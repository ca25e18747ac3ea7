"""A live batching group sized on its capacity at the SLO (issue 36): the gateway's count of
answers that carried usage becomes a `TokenLoad` (`with_tokens`), the newest stored fit of
the group's model version becomes its server (`fitted_server`, `StoredFits`) and reaches its
policy through the kernel's `compile_spec` as a value, whose key names it; the policy reads
the mean lengths over its recent memory, not since it started."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
from pathlib import Path
from typing import Any

from sluice.control.autoscaling import with_tokens
from sluice.control.fits import StoredFits, fitted_server
from sluice.policy.autoscale import Decision, GroupLoad, SluicePolicy, TokenLoad
from sluice.policy.autoscale.base import TrafficSample
from sluice.policy.autoscale.batching import ServerModel, batching_capacity
from sluice.policy.autoscale.sluice import SluiceMemory, TokenMemory
from sluice.policy.gateways import add_samples
from sluice.policy.kernel import FittedServer, compile_spec
from sluice.policy.snapshot_wire import sample_from_json, sample_to_json
from sluice.sim.batching import LLAMA3_8B_H100
from sluice.spec import load_spec_file
from sluice.spec.autoscaling import SloSpec
from sluice.store import CapacityRun
from tests.unit.test_autoscale_sluice import World, spec

ROOT = Path(__file__).resolve().parents[2]
SLO = SloSpec(ttft_ms=2000, tpot_ms=100, target=0.99)
FIT = {"step_base_s": 0.008, "step_per_seq_s": 5e-5, "step_per_kv_token_s": 4e-8,
       "prefill_tps": 15_000.0}  # fmt: skip


def sample(**kw: Any) -> TrafficSample:
    return TrafficSample(10.0, 2, 0, 100, 98, (), (), **kw)


def load() -> GroupLoad:
    return GroupLoad(at=10.0, current=2, ready=2, slots_per_instance=8, in_flight=2, queued=0,
                     arrivals=100, completions=98)  # fmt: skip


# -- the gateway's count, on the wire and into the load --------------------------------------


def test_a_load_carries_token_counts_only_where_answers_carried_usage() -> None:
    plain = load()
    assert with_tokens(plain, sample(prompt_tokens=0, completion_tokens=90)) is plain
    counted = with_tokens(plain, sample(prompt_tokens=4000, completion_tokens=900, usage_answers=9))
    assert isinstance(counted, TokenLoad)  # (a gateway that counts no usage answers' own)
    assert (counted.token_requests, counted.prompt_tokens, counted.output_tokens) == (9, 4000, 900)
    # 9 answers with usage (90 output tokens) and 81 streams without (810 chunks): the
    # output mean is the usage answers' 10 tokens, not 900 / 9 = 100
    counted = with_tokens(
        plain,
        sample(
            prompt_tokens=4000, completion_tokens=900, usage_answers=9, usage_completion_tokens=90
        ),
    )
    assert isinstance(counted, TokenLoad)
    assert (counted.token_requests, counted.prompt_tokens, counted.output_tokens) == (9, 4000, 90)
    # every other field as it was
    assert GroupLoad(**{f.name: getattr(counted, f.name)
                        for f in dataclasses.fields(GroupLoad)}) == plain  # fmt: skip


def test_the_count_travels_and_an_older_gateways_sample_reads_as_none() -> None:
    s = sample(prompt_tokens=40, completion_tokens=9, usage_answers=3)
    doc = sample_to_json(s)
    assert doc["usage_answers"] == 3 and sample_from_json(doc) == s
    del doc["usage_answers"]  # a gateway from before the count
    assert sample_from_json(doc).usage_answers == 0
    # several gateways' samples of a group add up
    assert add_samples([s, sample(usage_answers=4)], 11.0).usage_answers == 7


# -- the stored fit -------------------------------------------------------------------------


def run(id_: int, version: str = "v7", mode: str = "live", **fit: Any) -> CapacityRun:
    report: dict[str, Any] = {"fit": {"params": fit or FIT}} if fit is not None else {}
    return CapacityRun(id_, "loadtest", "llm", version, mode, "fitted", "ops", 0.0, report)


def llm_group() -> Any:
    loaded = load_spec_file(ROOT / "examples" / "reference-sim-batching.yaml").spec
    g = loaded.groups[0]
    return g.model_copy(update={"name": "llm"}), loaded


def test_the_newest_live_fit_of_the_current_version_is_the_server() -> None:
    g, _ = llm_group()
    version = g.version_label()
    other = run(9, version="v-old", step_base_s=0.5)
    simulated = run(8, version=version, mode="simulated", step_base_s=0.4)
    no_step = run(7, version=version, prefill_tps=9000.0)
    good = run(6, version=version)
    older = run(5, version=version, step_base_s=0.3)
    fitted = fitted_server(g, [other, simulated, no_step, good, older])
    assert fitted is not None
    assert fitted.source == f"load test #6 ({version})"
    assert fitted.server == ServerModel.from_fit(FIT, g.max_concurrency)
    assert fitted.server.max_seqs == g.max_concurrency and fitted.server.kv_tokens == math.inf
    assert fitted_server(g, [other, simulated, no_step]) is None


class FakeRuns:
    def __init__(self) -> None:
        self.runs: list[CapacityRun] = []
        self.reads = 0
        self.broken = False

    def list_capacity_runs(
        self, *, group: str | None = None, kind: str | None = None, limit: int = 20
    ) -> list[CapacityRun]:
        self.reads += 1
        if self.broken:
            raise OSError("store away")
        return [r for r in self.runs if r.group == group][:limit]


def test_stored_fits_are_read_again_when_recorded_when_due_or_for_a_new_version() -> None:
    g, loaded = llm_group()
    plat = loaded.model_copy(update={"groups": [g]})
    store = FakeRuns()
    fits = StoredFits(store, refresh_s=60.0)
    asyncio.run(fits.refresh(plat, 0.0))
    assert fits.servers() == {} and store.reads == 1
    store.runs.insert(0, run(1, version=g.version_label()))
    asyncio.run(fits.refresh(plat, 30.0))  # not due: the last read stands
    assert fits.servers() == {} and store.reads == 1
    fits.recorded()  # a load test was recorded through this controller
    asyncio.run(fits.refresh(plat, 31.0))
    assert set(fits.servers()) == {"llm"} and store.reads == 2
    seen = fits.servers()
    asyncio.run(fits.refresh(plat, 100.0))  # due: read, the same fit, the same mapping
    assert fits.servers() is seen and store.reads == 3
    store.broken = True
    fits.recorded()
    asyncio.run(fits.refresh(plat, 101.0))  # the store is away: the fit stands
    assert fits.servers() is seen
    store.broken = False
    models = {k: m.model_copy(update={"version": "v9"}) for k, m in g.models.items()}
    plat2 = plat.model_copy(update={"groups": [g.model_copy(update={"models": models})]})
    asyncio.run(fits.refresh(plat2, 102.0))  # a new version: no fit of it yet
    assert fits.servers() == {}


# -- the kernel ------------------------------------------------------------------------------


def test_a_fit_reaches_the_policy_as_a_value_and_its_key_names_it() -> None:
    g, loaded = llm_group()
    plat = loaded.model_copy(update={"groups": [g]})
    declared = compile_spec(plat)  # the simulator's: the declared sim.batching block
    live = compile_spec(plat, declared=False)  # the live sim worker does not batch
    fit = FittedServer(ServerModel.from_fit(FIT, 256) or LLAMA3_8B_H100, "load test #6 (v7)")
    fitted = compile_spec(plat, servers={"llm": fit}, declared=False)
    refit = FittedServer(dataclasses.replace(fit.server, step_base_s=0.01), "load test #7 (v7)")
    refitted = compile_spec(plat, servers={"llm": refit}, declared=False)
    pols = [c.policies["llm"] for c in (declared, live, fitted, refitted)]
    assert all(isinstance(p, SluicePolicy) for p in pols)
    servers = [p.server for p in pols]  # type: ignore[attr-defined]
    assert servers[0] is not None and servers[1] is None
    assert servers[2] == fit.server and servers[3] == refit.server
    assert pols[2].server_from == "load test #6 (v7)"  # type: ignore[attr-defined]
    # no fit: the key it always had; a fit, and a new fit, each a key of its own
    keys = [c.keys["llm"] for c in (declared, live, fitted, refitted)]
    assert keys[0] == keys[1] and len(set(keys[1:])) == 3


# -- the policy's recent lengths --------------------------------------------------------------


class Tokens:
    """The policy fed `TokenLoad`s whose counts grow by `per_s` requests a second of the
    lengths `lengths(t)` sets: (prompt, output) tokens each."""

    def __init__(self, policy: SluicePolicy, lengths: Any, per_s: int = 10) -> None:
        self.policy, self.name, self.lengths, self.per_s = policy, policy.name, lengths, per_s
        self.counts = (0, 0, 0)
        self.memories: list[SluiceMemory] = []

    def initial(self) -> SluiceMemory:
        return self.policy.initial()

    def step(
        self, memory: SluiceMemory, load: GroupLoad, now: float
    ) -> tuple[Decision, SluiceMemory]:
        n, p, o = self.counts
        prompt, output = self.lengths(now)
        self.counts = (n + self.per_s, p + self.per_s * prompt, o + self.per_s * output)
        n, p, o = self.counts
        fields = {f.name: getattr(load, f.name) for f in dataclasses.fields(load)}
        d, m = self.policy.step(
            memory, TokenLoad(**fields, token_requests=n, prompt_tokens=p, output_tokens=o), now
        )
        self.memories.append(m)
        return d, m


def capacity(prompt: float, output: float) -> float:
    return round(batching_capacity(LLAMA3_8B_H100, prompt, output, 2.0, 0.1, 0.99).rps, 3)


def test_the_capacity_reads_the_recent_lengths_not_those_since_the_start() -> None:
    """Long prompts for 300 s, then short ones, 100 a second: a memory span (60 s here,
    6,000 requests) later the capacity is the short prompts' (the cumulative mean, about
    4,600 tokens, would size for many more)."""
    pol = SluicePolicy(spec(panic={"enabled": False}), slo=SLO, server=LLAMA3_8B_H100)
    fed = Tokens(pol, lambda t: (6000, 28) if t < 300 else (500, 28), per_s=100)
    w = World(fed, current=2, service_s=0.5)  # type: ignore[arg-type]
    d_long = w.run(300, 10)
    assert d_long.signals["capacity_rps"] == capacity(6000, 28)
    d_short = w.run(100, 10)
    assert d_short.signals["capacity_rps"] == capacity(500, 28) > capacity(4600, 28)
    # a snapshot every 30 s, the oldest at or before the memory span's start
    m = fed.memories[-1]
    assert isinstance(m, TokenMemory)
    times = [s[0] for s in m.lengths]
    assert all(b - a >= 30.0 for a, b in itertools.pairwise(times))
    assert times[0] <= w.t - 1 - 60 < times[1]


def test_a_slow_group_reads_at_least_4000_requests() -> None:
    """10 a second: 1,000 short prompts after 3,000 long ones are not yet a window of their
    own; the mean is over the 3,990 since the first snapshot (the first tick's)."""
    pol = SluicePolicy(spec(panic={"enabled": False}), slo=SLO, server=LLAMA3_8B_H100)
    fed = Tokens(pol, lambda t: (6000, 28) if t < 300 else (500, 28))
    w = World(fed, current=2, service_s=0.5)  # type: ignore[arg-type]
    d = w.run(400, 10)
    mixed = float(f"{(2990 * 6000 + 1000 * 500) / 3990:.3g}")
    assert d.signals["capacity_rps"] == capacity(mixed, 28)


def test_a_quiet_window_or_a_restarted_count_reads_the_lengths_since_the_start() -> None:
    pol = SluicePolicy(spec(panic={"enabled": False}), slo=SLO, server=LLAMA3_8B_H100)
    fed = Tokens(pol, lambda t: (6000, 28), per_s=100)
    w = World(fed, current=2, service_s=0.5)  # type: ignore[arg-type]
    w.run(120, 10)
    fed.per_s = 0  # nothing counted for an hour: the cumulative means
    d = w.run(3700, 10)
    m = fed.memories[-1]
    assert isinstance(m, TokenMemory) and {s[1] for s in m.lengths} == {12_000}
    assert d.signals["capacity_rps"] == capacity(6000, 28)
    fed.counts, fed.per_s = (0, 0, 0), 10  # a gateway's count started again
    fed.lengths = lambda t: (1000, 28)
    d = w.run(2, 10)
    assert d.signals["capacity_rps"] == capacity(1000, 28)


def test_a_group_without_a_server_keeps_the_memory_it_had() -> None:
    pol = SluicePolicy(spec(panic={"enabled": False}), slo=SLO)
    fed = Tokens(pol, lambda t: (6000, 28))
    w = World(fed, current=2, service_s=0.5)  # type: ignore[arg-type]
    d = w.run(60, 10)
    assert type(fed.memories[-1]) is SluiceMemory and "capacity_rps" not in d.signals


def test_the_sizing_note_names_the_fit() -> None:
    pol = SluicePolicy(
        spec(panic={"enabled": False}), slo=SLO, server=LLAMA3_8B_H100,
        server_from="load test #6 (v7)",
    )  # fmt: skip
    w = World(Tokens(pol, lambda t: (6000, 28)), current=2, service_s=0.5)  # type: ignore[arg-type]
    d = w.run(90, 10)
    assert "batching capacity" in d.reason and "server from load test #6 (v7)" in d.reason


def test_missing_metrics_keep_the_snapshots() -> None:
    pol = SluicePolicy(spec(panic={"enabled": False}), slo=SLO, server=LLAMA3_8B_H100)
    fed = Tokens(pol, lambda t: (6000, 28))
    w = World(fed, current=2, service_s=0.5)  # type: ignore[arg-type]
    w.run(30, 10)
    kept = fed.memories[-1]
    assert isinstance(kept, TokenMemory) and kept.lengths
    w.tick(10, fresh=False)
    m = fed.memories[-1]
    assert isinstance(m, TokenMemory) and m.lengths == kept.lengths
