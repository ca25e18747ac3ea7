"""`sluice simulate --routed` as a person runs it: one trace of callers (two tenants, two
models, asked priorities) goes through the spec's own rate limits and route choice, then the
whole fleet; the JSON says per route and per tenant what became of their requests."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

from sluice.policy.routing import PRIORITIES
from sluice.sim.routed import route_trace
from sluice.sim.trace import load_trace
from sluice.spec import load_spec_file
from tests.integration.test_simulate_cli import ROOT, sluice

SPEC = ROOT / "examples" / "routed.yaml"


def callers(path: Path, seconds: float = 300.0) -> Path:
    """Poisson arrivals: `search` asks chat-large at 3/s and embed-small at 6/s; `batch`
    asks chat-large at 8/s, above its 5/s limit, half of them asking for high priority."""
    rng = np.random.default_rng(7)
    rows: list[tuple[float, int, int, str, str, str]] = []
    for tenant, model, rate, asks in (
        ("search", "chat-large", 3.0, ("normal",)),
        ("search", "embed-small", 6.0, ("normal",)),
        ("batch", "chat-large", 8.0, ("high", "low")),
    ):
        t = np.cumsum(rng.exponential(1.0 / rate, int(rate * seconds * 1.2)))
        for k, at in enumerate(t[t < seconds]):
            out = 1 if model == "embed-small" else int(rng.integers(50, 400))
            rows.append(
                (
                    round(float(at), 3),
                    int(rng.integers(20, 900)),
                    out,
                    model,
                    tenant,
                    asks[k % len(asks)],
                )
            )
    rows.sort()
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["t_s", "input_tokens", "output_tokens", "model", "tenant", "priority"])
        w.writerows(rows)
    return path


def test_a_trace_of_callers_reports_per_route_and_per_tenant(tmp_path: Path) -> None:
    trace = callers(tmp_path / "callers.csv")
    r = sluice("simulate", "--spec", str(SPEC), "--trace", str(trace), "--routed", "--json",
               home=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    routes, tenants = out["routed"]["routes"], out["routed"]["tenants"]
    assert set(routes) == {"embeddings", "chat-canary-10"}
    assert routes["embeddings"]["groups"] == ["embed"]
    assert routes["chat-canary-10"]["groups"] == ["chat", "chat-canary"]
    assert set(tenants) == {"search", "batch"}
    total = len(trace.read_text().splitlines()) - 1
    assert tenants["search"]["requests"] + tenants["batch"]["requests"] == total
    # batch offers 8/s against its 5/s limit: about 3/8 of its requests are the gateway's 429s
    refused = tenants["batch"]["refused"]["rate_limited"]
    assert 0.25 < refused / tenants["batch"]["requests"] < 0.5
    assert "refused" not in tenants["search"] or not tenants["search"]["refused"]
    routed = sum(o["requests"] for o in routes.values())
    assert routed == total - refused  # every request not refused took exactly one route
    groups = {g["group"]: g for g in out["groups"]}
    assert sum(g["requests"] for g in groups.values()) == routed
    canary_share = groups["chat-canary"]["requests"] / routes["chat-canary-10"]["requests"]
    assert 0.06 < canary_share < 0.14  # the 90/10 split, drawn per request
    for o in (*routes.values(), *tenants.values()):
        assert 0.0 <= o["slo_attainment"] <= 1.0 and o["completed"] <= o["requests"]
    again = sluice("simulate", "--spec", str(SPEC), "--trace", str(trace), "--routed",
                   "--json", home=tmp_path)  # fmt: skip
    assert json.loads(again.stdout)["routed"] == out["routed"]  # seeded: the same run
    table = sluice("simulate", "--spec", str(SPEC), "--trace", str(trace), "--routed",
                   home=tmp_path)  # fmt: skip
    assert table.returncode == 0 and "by route" in table.stdout and "by tenant" in table.stdout


def test_priorities_are_the_tenants_unless_it_may_ask(tmp_path: Path) -> None:
    """search is always served at its own (high); batch may ask, so half its requests run
    high and half low in the group's admission queue."""
    routed = route_trace(load_spec_file(SPEC).spec, load_trace(callers(tmp_path / "c.csv")))
    chat = routed.groups["chat"]
    by_tenant = {
        name: {p for p in chat.priority[chat.tenant == k].tolist()}
        for k, name in enumerate(chat.tenants)
    }
    assert {PRIORITIES[p] for p in by_tenant["search"]} == {"high"}
    assert {PRIORITIES[p] for p in by_tenant["batch"]} == {"high", "low"}


def test_a_trace_without_tenants_is_a_clear_error(tmp_path: Path) -> None:
    plain = tmp_path / "plain.csv"
    plain.write_text("t_s,input_tokens,output_tokens,model\n0.0,10,10,chat-large\n")
    r = sluice("simulate", "--spec", str(SPEC), "--trace", str(plain), "--routed", home=tmp_path)
    assert r.returncode == 2
    assert "tenant" in r.stderr and "Traceback" not in r.stderr
