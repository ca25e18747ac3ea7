"""Per-instance series on the gateway's metrics: requests through a real gateway to real
upstreams on 127.0.0.1 are counted under the instance that answered them (`instance` label),
by the class of its answer, with their latency; an instance that gave no answer counts as "0"."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest

from .gateway_fakes import AUTH, CHAT, FakeUpstream, make_snapshot, metric_values, running

REQUESTS = "sluice_gateway_instance_requests_total"
DURATION = "sluice_gateway_instance_request_duration_seconds"


@pytest.mark.asyncio
async def test_each_answer_is_counted_under_its_instance() -> None:
    ok, failing = FakeUpstream("ok", latency=0.03), FakeUpstream("failing", status=500)
    async with running(ok, failing) as (gw, client, _log):
        served: Counter[tuple[str, int]] = Counter()
        for _ in range(8):
            resp = await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
            served[resp.headers["x-sluice-instance"], resp.status_code] += 1
        value = metric_values(gw.metrics_text()[0].decode())

    assert set(served) <= {("ok", 200), ("failing", 500)} and sum(served.values()) == 8
    for iid, status, cls in (("ok", 200, "2xx"), ("failing", 500, "5xx")):
        assert value(REQUESTS, group="g1", instance=iid, code_class=cls) == served[iid, status]
        assert value(REQUESTS, group="g1", instance=iid, code_class="0") == 0
        assert value(DURATION + "_count", group="g1", instance=iid) == served[iid, status]
    if served["ok", 200]:  # the fast one's answers all took over 25 ms at the instance
        assert value(DURATION + "_bucket", group="g1", instance="ok", le="0.025") == 0
        assert (
            value(DURATION + "_bucket", group="g1", instance="ok", le="+Inf") == served["ok", 200]
        )


@pytest.mark.asyncio
async def test_an_answer_cut_off_or_never_given_counts_as_no_answer() -> None:
    cut, abrupt = FakeUpstream("cut", mode="die_mid_stream"), FakeUpstream("abrupt", mode="abrupt")
    async with running(cut) as (gw, client, _log):
        with pytest.raises(httpx.RemoteProtocolError):
            async with asyncio.timeout(5):
                async with client.stream("POST", "/v1/completions", json=CHAT, headers=AUTH) as r:
                    assert r.status_code == 200  # the head came, then the instance went away
                    async for _ in r.aiter_raw():
                        pass
        value = metric_values(gw.metrics_text()[0].decode())
    assert value(REQUESTS, group="g1", instance="cut", code_class="0") == 1
    assert value(REQUESTS, group="g1", instance="cut", code_class="2xx") == 0

    async with running(abrupt) as (gw, client, _log):
        resp = await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
        assert resp.status_code == 502  # the gateway's answer: the instance gave none
        value = metric_values(gw.metrics_text()[0].decode())
    assert value(REQUESTS, group="g1", instance="abrupt", code_class="0") == 1
    assert value(REQUESTS, group="g1", instance="abrupt", code_class="5xx") == 0


@pytest.mark.asyncio
async def test_an_instance_out_of_routing_keeps_its_series_for_a_while() -> None:
    a, b = FakeUpstream("a"), FakeUpstream("b")
    async with running(a, b) as (gw, client, _log):
        for _ in range(6):
            await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
        before = metric_values(gw.metrics_text()[0].decode())
        gw.update(make_snapshot(2, [("b", b.port)]))  # a leaves the group
        after = metric_values(gw.metrics_text()[0].decode())
    for iid in ("a", "b"):  # still scraped: Prometheus sees its last counts (then it goes)
        n = before(REQUESTS, group="g1", instance=iid, code_class="2xx")
        assert after(REQUESTS, group="g1", instance=iid, code_class="2xx") == n
    assert sum(before(REQUESTS, group="g1", instance=i, code_class="2xx") for i in "ab") == 6
