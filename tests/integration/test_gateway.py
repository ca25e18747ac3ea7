"""The gateway in front of tiny real upstream servers on 127.0.0.1, driven by real clients."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections import Counter
from typing import Any

import httpx
import openai
import pytest

from sluice.gateway import Gateway
from sluice.policy.routing import (
    GroupTraffic,
    PrefixRouting,
    RouteRule,
    RoutingSnapshot,
    TenantAccess,
)
from sluice.spec.models import GatewayLimits

from .gateway_fakes import (
    AUTH,
    CHAT,
    INTERNALS,
    FakeUpstream,
    chat,
    free_port,
    g1,
    groups_of,
    log_lines,
    make_snapshot,
    metric_values,
    q,
    running,
    snapshot,
)

# -- happy path -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_proxies_with_sluice_headers_and_one_log_line() -> None:
    up = FakeUpstream("i1")
    async with running(up) as (gw, client, log):
        resp = await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
        assert resp.status_code == 200
        assert resp.json()["instance"] == "i1"
        assert resp.headers["x-sluice-group"] == "g1"  # the upstream's spoofed one is dropped
        assert resp.headers["x-sluice-instance"] == "i1"
        assert resp.headers["x-sluice-route"] == "r1"
        assert resp.headers["x-custom"] == "i1"
        assert "keep-alive" not in resp.headers
        request_id = resp.headers["x-request-id"]
        seen = resp.json()["seen_headers"]
        assert seen["x-request-id"] == request_id
        assert "authorization" not in seen  # tenant keys never reach instances
        assert seen["host"] == f"127.0.0.1:{up.port}"
        assert "connection" not in seen
        assert gw.outstanding() == {}
        [line] = log_lines(log)
    expected = {"request_id": request_id, "method": "POST", "path": "/v1/chat/completions"}
    expected |= {"status": 200, "tenant": "t1", "model": "m1", "priority": "normal", "via": None}
    expected |= {"route": "r1", "group": "g1", "instance": "i1", "mirror": None, "error": None}
    assert {k: line[k] for k in expected} == expected and line["retried"] is False
    assert line["queue_ms"] == 0.0 and line["bytes_out"] == len(resp.content)
    assert isinstance(line["latency_ms"], float) and abs(line["ts"] - time.time()) < 60


@pytest.mark.asyncio
async def test_client_request_id_is_kept_and_connections_are_reused() -> None:
    up = FakeUpstream("i1")
    async with running(up) as (_, client, _log):
        for _ in range(5):
            resp = await client.post(
                "/v1/embeddings", json={"model": "m1"}, headers={**AUTH, "x-request-id": "abc"}
            )
            assert resp.headers["x-request-id"] == "abc"
        assert up.requests[-1][2]["x-request-id"] == "abc"
        assert up.accepted == 1


@pytest.mark.asyncio
async def test_healthz_and_models() -> None:
    tenant = TenantAccess("t1", models=frozenset({"m1"}))
    up = FakeUpstream("i1")
    async with running(up, snapshot=make_snapshot(3, [], tenant=tenant)) as (gw, client, log):
        gw.update(make_snapshot(4, [("i1", 1)], tenant=tenant))
        health = await client.get("/healthz")
        assert health.status_code == 200
        # fed in process (no sync): ready from the first snapshot on, never stale
        assert health.json() == {"status": "ok", "version": 4, "ready": True, "stale": False}
        ready = await client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json() == {"ready": True, "stale": False, "version": 4}
        assert gw.snapshot_version == 4
        models = (await client.get("/v1/models", headers=AUTH)).json()
        assert models["data"] == [{"id": "m1", "object": "model", "owned_by": "sluice"}]
        assert models["object"] == "list"
        assert (await client.get("/v1/models")).status_code == 401
        assert len(log_lines(log)) == 4


@pytest.mark.asyncio
async def test_headers_naming_internals_are_not_relayed() -> None:
    up = FakeUpstream("i1", events=2)
    async with running(up) as (_gw, client, log):
        plain = await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
        async with client.stream(
            "POST", "/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH
        ) as streamed:
            body = await streamed.aread()
        assert plain.status_code == streamed.status_code == 200
        assert body.endswith(b"data: [DONE]\n\n")
        for resp in (plain, streamed):
            for name in INTERNALS:
                assert name not in resp.headers, (name, resp.headers)
            raw = b"".join(name + b": " + value for name, value in resp.headers.raw)
            assert b"uvicorn" not in raw and b"10.0.0.7" not in raw and b"starlette" not in raw
            assert resp.headers["date"] == "Mon, 01 Jan 2024 00:00:00 GMT"  # harmless: kept
            assert resp.headers["x-sluice-instance"] == "i1"  # the gateway's own stay
            assert resp.headers["x-sluice-group"] == "g1"
            assert resp.headers["x-sluice-route"] == "r1"
        assert streamed.headers["content-type"] == "text/event-stream"
        assert [line["status"] for line in log_lines(log)] == [200, 200]


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_errors_are_json_with_known_headers() -> None:
    tenant = TenantAccess("t1", models=frozenset({"m1"}))
    snap = make_snapshot(1, [], tenant=tenant)
    limits = GatewayLimits(max_body_bytes=1024)
    async with running(snapshot=snap, limits=limits) as (_, client, log):

        async def call(body: Any, headers: dict[str, str] = AUTH, raw: bytes | None = None):
            content = raw if raw is not None else json.dumps(body).encode()
            return await client.post("/v1/chat/completions", content=content, headers=headers)

        cases = [
            (await call(CHAT, {}), 401, "unauthorized"),
            (await call(CHAT, {"Authorization": "Bearer nope"}), 401, "unauthorized"),
            (await call(None, raw=b"{not json"), 400, "invalid_request"),
            (await call({"messages": []}), 400, "invalid_request"),
            (await call({"model": "nope"}), 404, "not_found"),
            (await call({"model": "m2"}), 403, "forbidden"),
            (await call(CHAT), 503, "unavailable"),
            (await call(None, raw=b'{"model":"m1","x":"' + b"a" * 2000 + b'"}'), 413, None),
            (await client.get("/nowhere"), 404, "not_found"),
            (await client.get("/metrics"), 404, "not_found"),  # the control API serves it
            (await client.get("/v1/chat/completions", headers=AUTH), 405, None),
        ]
        for resp, status, code in cases:
            assert resp.status_code == status, resp.text
            assert resp.headers["content-type"] == "application/json"
            assert "x-request-id" in resp.headers
            error = resp.json()["error"]
            assert set(error) >= {"code", "message"}
            if code is not None:
                assert error["code"] == code
        forbidden = cases[5][0]
        assert "g-secret" not in forbidden.text and "x-sluice-group" not in forbidden.headers
        unavailable = cases[6][0]
        assert unavailable.headers["retry-after"] == "1"
        assert unavailable.headers["x-sluice-group"] == "g1"
        assert unavailable.headers["x-sluice-route"] == "r1"
        assert "x-sluice-instance" not in unavailable.headers
        lines = log_lines(log)
        assert [line["status"] for line in lines] == [status for _, status, _ in cases]
        assert lines[0]["error"] == "unauthorized" and lines[0]["tenant"] is None


@pytest.mark.asyncio
async def test_oversized_upload_gets_413_not_a_reset() -> None:
    async with running() as (_, client, log):
        body = b'{"model":"m1","pad":"' + b"x" * (9 * 1024 * 1024) + b'"}'
        resp = await client.post("/v1/chat/completions", content=body, headers=AUTH)
        assert resp.status_code == 413 and resp.json()["error"]["code"] == "request_too_large"
        assert log_lines(log)[0]["status"] == 413


@pytest.mark.asyncio
async def test_upstream_timeout_is_504() -> None:
    up = FakeUpstream("i1", mode="hang")
    async with running(up, upstream_timeout_s=0.3) as (gw, client, log):
        start = time.perf_counter()
        resp = await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
        assert resp.status_code == 504 and 0.25 < time.perf_counter() - start < 3.0
        assert resp.headers["x-sluice-instance"] == "i1"
        assert gw.outstanding() == {}
        assert log_lines(log)[0]["error"] == "upstream_timeout"


@pytest.mark.asyncio
async def test_every_instance_failing_is_502() -> None:
    up = FakeUpstream("i1", mode="abrupt")
    async with running(up) as (gw, client, log):
        resp = await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
        assert resp.status_code == 502
        assert resp.json()["error"]["code"] == "upstream_error"
        assert gw.outstanding() == {}
        assert log_lines(log)[0]["retried"] is True


# -- streaming --------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_streaming_arrives_incrementally() -> None:
    up = FakeUpstream("i1", mode="sse", events=5, delay=0.2)
    async with running(up) as (gw, client, log):
        arrivals: list[float] = []
        start = time.perf_counter()
        body = b""
        async with client.stream(
            "POST", "/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH
        ) as resp:
            assert resp.headers["x-sluice-instance"] == "i1"
            assert resp.headers["transfer-encoding"] == "chunked"
            async for chunk in resp.aiter_raw():
                arrivals.append(time.perf_counter() - start)
                body += chunk
                if len(arrivals) == 1:
                    assert gw.outstanding() == {"i1": 1}
        assert body.count(b"data: ") == 6 and body.endswith(b"data: [DONE]\n\n")
        assert arrivals[0] < 0.5  # the first event is not held back...
        assert arrivals[-1] - arrivals[0] > 0.6  # ...until the last one
        assert gw.outstanding() == {}
        assert log_lines(log)[0]["bytes_out"] == len(body)


@pytest.mark.asyncio
async def test_sampled_groups_record_status_latency_and_first_byte_of_streams() -> None:
    """Rows for the canary analysis of servers that keep no samples: only for groups named
    (`sample_groups`), with time to the first body byte for streamed answers only; an
    answer the instance failed counts as its 5xx."""
    up = FakeUpstream("i1", mode="sse", events=3, delay=0.2)
    async with running(up) as (gw, client, _):
        await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
        assert gw.samples("i1", 0, 10) == ([], 0)  # g1 is not sampled: nothing kept
        gw.sample_groups(["g1"])
        async with client.stream(
            "POST", "/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH
        ) as resp:
            body = await resp.aread()
        rows, cursor = gw.samples("i1", 0, 10)
        (row,) = rows
        assert row["status"] == 200 and row["output_bytes"] == len(body)
        assert row["ttft_s"] < 0.15 and row["latency_s"] > 0.55, row
        assert abs(row["at"] - time.time()) < 5
        # no usage in this stream: its 3 chunks with content are its tokens, 0.2 s apart
        assert row["output_tokens"] == 3 and row["finish_reason"] is None
        assert 0.15 < row["tpot_s"] < 0.5, row
        gw.sample_groups([])
        await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
        assert gw.samples("i1", cursor, 10) == ([], cursor)
    down = FakeUpstream("i1", mode="hang")
    async with running(down, upstream_timeout_s=0.3) as (gw, client, _):
        gw.sample_groups(["g1"])
        assert (
            await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
        ).status_code == 504
        (row,) = gw.samples("i1", 0, 10)[0]
        assert row["status"] == 504 and row["ttft_s"] is None
        assert row["output_tokens"] is None and row["finish_reason"] is None
    async with running(FakeUpstream("i1")) as (gw, client, _):
        gw.sample_groups(["g1"])
        assert (await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)).is_success
        (row,) = gw.samples("i1", 0, 10)[0]  # a JSON answer: its usage and finish reason
        assert row["output_tokens"] == 3 and row["finish_reason"] == "stop"
        assert row["tpot_s"] is None  # not streamed: no time per token


@pytest.mark.asyncio
@pytest.mark.parametrize("ask", [True, False])
async def test_tokens_are_counted_per_tenant_from_usage_or_a_streams_events(ask: bool) -> None:
    """Every answered request's tokens, by group and tenant: a JSON answer's usage (1 prompt,
    3 completion in the fake); a stream's usage, which the gateway asked the server for
    (2 prompt, 3 completion), or, where the group says not to ask (`ask_stream_usage`), its
    data events but [DONE] (3); a stream's time per output token (0.2 s apart)."""
    up = FakeUpstream("i1", events=3, delay=0.2)
    async with running(up, snapshot=g1(up, traffic={"g1": q(ask_stream_usage=ask)})) as (
        gw,
        client,
        _,
    ):
        for _ in range(2):
            assert (await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)).is_success
        async with client.stream(
            "POST", "/v1/chat/completions", json={**CHAT, "stream": True}, headers=AUTH
        ) as resp:
            body = await resp.aread()
        value = metric_values(gw.metrics_text()[0].decode())
        sample = gw.traffic()["g1"]
    asked = up.requests[-1][3]
    # the answers whose usage was read: the autoscaler's mean lengths' denominator
    assert sample.usage_answers == 2 + ask
    assert sample.usage_completion_tokens == 2 * 3 + 3 * ask  # the stream's chunks: not these
    assert (sample.prompt_tokens, sample.completion_tokens) == (2 + 2 * ask, 2 * 3 + 3)
    assert ("stream_options" in asked) is ask
    assert b'"usage"' not in body  # the caller did not ask for it: it gets none either way
    assert body.count(b"data: ") == 4 and body.endswith(b"data: [DONE]\n\n")
    assert value("sluice_gateway_prompt_tokens_total", group="g1", tenant="t1") == 2 + 2 * ask
    assert value("sluice_gateway_completion_tokens_total", group="g1", tenant="t1") == 2 * 3 + 3
    assert value("sluice_gateway_time_per_output_token_seconds_count", group="g1") == 1
    tpot = value("sluice_gateway_time_per_output_token_seconds_sum", group="g1")
    assert 0.15 < tpot < 0.5


@pytest.mark.asyncio
async def test_a_caller_who_asks_for_a_streams_usage_gets_it() -> None:
    """Only what the gateway asked for on its caller's behalf is taken out: a caller's own
    `stream_options` (and its other fields) reach the server as sent, and its usage chunk
    reaches the caller."""
    up = FakeUpstream("i1", events=2)
    async with running(up) as (gw, client, log):
        options = {"include_usage": True}
        async with client.stream(
            "POST",
            "/v1/chat/completions",
            json={**CHAT, "stream": True, "stream_options": options},
            headers=AUTH,
        ) as resp:
            body = await resp.aread()
        assert up.requests[-1][3]["stream_options"] == options
        assert body.count(b'"usage"') == 1 and body.endswith(b"data: [DONE]\n\n")
        assert log_lines(log)[0]["bytes_out"] == len(body)
        value = metric_values(gw.metrics_text()[0].decode())
        assert value("sluice_gateway_prompt_tokens_total", group="g1", tenant="t1") == 2


@pytest.mark.asyncio
async def test_body_ended_by_upstream_close_is_rechunked() -> None:
    async with running(FakeUpstream("i1", mode="eof")) as (_, client, log):
        resp = await client.post("/v1/completions", json=CHAT, headers=AUTH)
        assert resp.status_code == 200
        assert resp.headers["transfer-encoding"] == "chunked"
        assert resp.text == "until the end"
        assert log_lines(log)[0]["error"] is None


@pytest.mark.asyncio
async def test_client_leaving_mid_stream_frees_the_instance() -> None:
    up = FakeUpstream("i1", mode="sse", events=50, delay=0.05)
    async with running(up) as (gw, client, log):
        async with client.stream("POST", "/v1/completions", json=CHAT, headers=AUTH) as resp:
            async for _ in resp.aiter_raw():
                break  # leaving the block closes the connection mid-response
        async with asyncio.timeout(3):
            while gw.outstanding() or not log.getvalue() or up.open_connections:
                await asyncio.sleep(0.01)
        [line] = log_lines(log)
        assert line["status"] == 200 and line["error"] == "client_disconnected"


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["dies", "is_killed"])
async def test_upstream_dying_mid_stream_breaks_the_response_without_hanging(how: str) -> None:
    if how == "dies":  # it closes the connection after one chunk
        up = FakeUpstream("i1", mode="die_mid_stream")
    else:  # the whole server goes away with the response half sent
        up = FakeUpstream("i1", mode="sse", events=100, delay=0.05)
    async with running(up) as (gw, client, log):
        start = time.perf_counter()
        with pytest.raises(httpx.RemoteProtocolError):
            async with asyncio.timeout(5):
                async with client.stream("POST", "/v1/completions", json=CHAT, headers=AUTH) as r:
                    assert r.status_code == 200
                    async for _ in r.aiter_raw():
                        if how == "is_killed":
                            await up.stop()
        assert time.perf_counter() - start < 2.0
        assert gw.outstanding() == {} and gw.status()["groups"]["g1"]["in_use"] == 0
        [line] = log_lines(log)
        assert line["status"] == 200 and line["error"] == "upstream_error"


# -- resilience -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_dead_instance_is_retried_on_another() -> None:
    up = FakeUpstream("i2")
    await up.start()
    snapshot = make_snapshot(1, [("i1", free_port()), ("i2", up.port)])
    async with running(snapshot=snapshot) as (gw, client, log):
        for _ in range(6):
            resp = await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
            assert resp.status_code == 200
            assert resp.headers["x-sluice-instance"] == "i2"
        lines = log_lines(log)
        assert any(line["retried"] for line in lines)
        assert all(line["instance"] == "i2" and line["status"] == 200 for line in lines)
        assert gw.outstanding() == {}
    await up.stop()


def g1_of(version: int, *ups: FakeUpstream, max_wait_s: float = 5.0) -> RoutingSnapshot:
    return snapshot(
        version,
        {"g1": ups},
        [RouteRule("r1", (("g1", 1),))],
        traffic={"g1": q(max_wait_s=max_wait_s)},
    )


@pytest.mark.asyncio
async def test_an_instance_that_refuses_a_connection_is_out_at_once() -> None:
    dead, alive = FakeUpstream("dead"), FakeUpstream("alive")
    async with running(dead, alive, snapshot=lambda: g1_of(1, dead, alive)) as (gw, client, log):
        await groups_of(client, 10)
        await dead.stop()  # its port refuses from now on
        served = await groups_of(client, 20, concurrency=1, header="x-sluice-instance")
        assert served == {"alive": 20}
        # one request found the port closed and went to the other; the rest did not try it
        # (not five in a row until outlier ejection, with a retry each)
        assert sum(line["retried"] for line in log_lines(log)) == 1
        group = gw.status()["groups"]["g1"]
        assert group["unreachable"] == ["dead"] and group["slots"] == 8


@pytest.mark.asyncio
async def test_requests_wait_while_every_instance_refuses_then_go_to_a_new_one() -> None:
    """Every instance dies at once: until the controller's next table, requests wait in the
    queue (they would have failed with 502, then 503) and go to the instance it brings."""
    a, b, c = FakeUpstream("a"), FakeUpstream("b"), FakeUpstream("c")
    async with running(a, b, c, snapshot=lambda: g1_of(1, a, b)) as (gw, client, log):
        await groups_of(client, 10)
        await a.stop()
        await b.stop()
        waiting = [asyncio.create_task(chat(client)) for _ in range(6)]
        async with asyncio.timeout(3):
            while gw.status()["groups"]["g1"]["queued"]["normal"] < 6:
                await asyncio.sleep(0.01)
        group = gw.status()["groups"]["g1"]
        assert group["unreachable"] == ["a", "b"] and group["slots"] == group["in_use"] == 0
        gw.update(g1_of(2))  # the controller saw them exit: no instance at all for a while
        await asyncio.sleep(0.3)
        waiting.append(asyncio.create_task(chat(client)))  # (arrives with none: waits too)
        await asyncio.sleep(0.1)
        assert not any(t.done() for t in waiting)
        gw.update(g1_of(3, c))  # the replacement is ready
        async with asyncio.timeout(3):
            answers = await asyncio.gather(*waiting)
        assert [r.status_code for r in answers] == [200] * 7
        assert {r.headers["x-sluice-instance"] for r in answers} == {"c"}
        assert all(line["queue_ms"] >= 300 for line in log_lines(log)[-7:-1])
        assert gw.status()["groups"]["g1"]["in_use"] == 0 and gw.outstanding() == {}


@pytest.mark.asyncio
async def test_an_outage_longer_than_max_wait_is_refused_without_waiting() -> None:
    a = FakeUpstream("a")
    async with running(a, snapshot=lambda: g1_of(1, a, max_wait_s=0.3)) as (_gw, client, _log):
        assert (await chat(client)).status_code == 200
        await a.stop()
        start = time.perf_counter()
        resp = await chat(client)  # the outage is new: it waits its max_wait_s, in vain
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "queue_timeout"
        assert 0.25 < time.perf_counter() - start < 1.0
        await asyncio.sleep(0.1)
        start = time.perf_counter()
        resp = await chat(client)  # down for longer than max_wait_s: no point waiting
        assert time.perf_counter() - start < 0.2
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "unavailable"


@pytest.mark.asyncio
async def test_stale_pooled_connection_never_loses_the_request() -> None:
    up = FakeUpstream("i1", mode="once")
    async with running(up) as (_, client, log):
        for _ in range(3):
            resp = await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
            assert resp.status_code == 200
        assert [line["retried"] for line in log_lines(log)] == [False] * 3
        assert len(up.requests) == 5  # two of them hit a connection the upstream had dropped


@pytest.mark.asyncio
async def test_removed_instance_idle_connections_are_closed() -> None:
    a, b = FakeUpstream("a"), FakeUpstream("b")
    async with running(a, b) as (gw, client, _log):
        for _ in range(4):
            await client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
        assert a.open_connections == 1
        gw.update(make_snapshot(2, [("b", b.port)]))
        async with asyncio.timeout(2):
            while a.open_connections:
                await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_swapping_snapshots_mid_traffic_loses_no_request() -> None:
    ups = [FakeUpstream(name) for name in ("a1", "a2", "b1", "b2")]
    async with running(*ups) as (gw, client, _log):
        sets = [[(u.name, u.port) for u in ups[:2]], [(u.name, u.port) for u in ups[2:]]]
        stop = asyncio.Event()

        async def swap() -> None:
            version = 1
            while not stop.is_set():
                version += 1
                gw.update(make_snapshot(version, sets[version % 2]))
                await asyncio.sleep(0.003)

        swapper = asyncio.create_task(swap())
        async with asyncio.timeout(30):
            served = await groups_of(client, 200, concurrency=8, header="x-sluice-instance")
        stop.set()
        await swapper
        assert served.total() == 200
        assert {"a1", "a2"} & set(served) and {"b1", "b2"} & set(served)
        assert gw.outstanding() == {}


@pytest.mark.asyncio
async def test_stop_lets_a_stream_in_flight_finish() -> None:
    up = FakeUpstream("i1", mode="sse", events=4, delay=0.1)
    await up.start()
    gw = Gateway(rng=random.Random(1))
    gw.update(make_snapshot(1, [("i1", up.port)]))
    await gw.start()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.port}") as client:
        async with client.stream("POST", "/v1/completions", json=CHAT, headers=AUTH) as resp:
            stopping = asyncio.create_task(gw.stop(timeout=5))
            body = b"".join([chunk async for chunk in resp.aiter_raw()])
        await stopping
    assert body.endswith(b"data: [DONE]\n\n")
    await up.stop()


@pytest.mark.asyncio
async def test_pipelined_requests_are_answered_in_order() -> None:
    up = FakeUpstream("i1")
    async with running(up) as (gw, _client, log):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(
            b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n"
            b"authorization: Bearer sk-test-f3abf2a6cc4f0098\r\n"
            b'content-length: 14\r\n\r\n{"model":"m1"}'
            b"GET /nowhere HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        )
        async with asyncio.timeout(5):
            data = await reader.read(-1)
        writer.close()
        await writer.wait_closed()
        assert re.findall(rb"HTTP/1\.1 (\d{3})", data) == [b"200", b"200", b"404"]
        paths = [line["path"] for line in log_lines(log)]
        assert paths == ["/healthz", "/v1/completions", "/nowhere"]
        assert up.requests[0][2]["content-length"] == "14"  # a chunked upload, forwarded whole


@pytest.mark.asyncio
async def test_expect_100_continue_is_answered() -> None:
    async with running(FakeUpstream("i1")) as (gw, _client, _log):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n"
            b"authorization: Bearer sk-test-f3abf2a6cc4f0098\r\n"
            b"expect: 100-continue\r\ncontent-length: 14\r\nconnection: close\r\n\r\n"
        )
        async with asyncio.timeout(5):
            assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(b'{"model":"m1"}')
            data = await reader.read(-1)
        writer.close()
        await writer.wait_closed()
        assert data.startswith(b"HTTP/1.1 200 OK\r\n")


# -- a real OpenAI client ---------------------------------------------------------------------


@pytest.mark.asyncio
async def test_openai_client_through_the_gateway() -> None:
    up = FakeUpstream("i1", delay=0.01)
    async with (
        running(up) as (gw, _client, _log),
        openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{gw.port}/v1",
            api_key="sk-test-f3abf2a6cc4f0098",
            max_retries=0,
        ) as oai,
    ):
        completion = await oai.chat.completions.create(model="m1", messages=CHAT["messages"])
        assert completion.choices[0].message.content == "hello from i1"
        stream = await oai.chat.completions.create(
            model="m1", messages=CHAT["messages"], stream=True
        )
        tokens = [chunk.choices[0].delta.content async for chunk in stream]
        assert tokens == [f"tok{i} " for i in range(5)]
        models = await oai.models.list()
        assert [m.id for m in models.data] == ["m1", "m2"]


# -- traffic splitting, admission, fallback, mirror (the data plane's policies, end to end) ---


@pytest.mark.asyncio
async def test_weighted_split_then_failover_and_back() -> None:
    a, b, c = FakeUpstream("a"), FakeUpstream("b"), FakeUpstream("c")
    rules = [RouteRule("split", (("ga", 90), ("gb", 10)))]

    def snap(version: int, redirects: dict[str, str] | None = None) -> RoutingSnapshot:
        return snapshot(version, {"ga": [a], "gb": [b], "gc": [c]}, rules, redirects=redirects)

    async with running(a, b, c, snapshot=lambda: snap(1)) as (gw, client, log):
        split = await groups_of(client, 2000)
        assert abs(split["ga"] / 2000 - 0.9) <= 0.03 and split["ga"] + split["gb"] == 2000
        gw.update(snap(2, {"ga": "gc"}))  # failover: all of ga's traffic, at once
        moved = await groups_of(client, 200)
        assert moved["ga"] == 0 and moved["gc"] > 150
        vias = {ln["via"] for ln in log_lines(log)[-200:] if ln["group"] == "gc"}
        assert vias == {"failover ga->gc"}
        gw.update(snap(3))
        back = await groups_of(client, 100)
        assert back["gc"] == 0 and back["ga"] > 75


@pytest.mark.asyncio
async def test_overload_sheds_low_then_normal_then_high() -> None:
    up = FakeUpstream("i1", latency=0.5)
    tenants = {"sk-test-f3abf2a6cc4f0098": TenantAccess("t1", priority_header=True)}
    snap = g1(up, tenants=tenants, traffic={"g1": q(max_queue=2)}, max_concurrency=1)
    async with running(up, snapshot=snap) as (gw, client, log):
        calls = []
        for prio in ["normal", "low", "low", "low", "normal", "normal", "normal"] + ["high"] * 3:
            calls.append((prio, asyncio.create_task(chat(client, x_sluice_priority=prio))))
            await asyncio.sleep(0.03)  # arrive in this order
        assert gw.status()["groups"]["g1"]["queued"] == {"high": 2, "normal": 0, "low": 0}
        async with asyncio.timeout(5):
            done = [(prio, await task) for prio, task in calls]
        shed = [(prio, r) for prio, r in done if r.status_code == 429]
        assert Counter(prio for prio, _ in shed) == {"low": 3, "normal": 3, "high": 1}
        assert {(r.json()["error"]["code"], r.headers["retry-after"]) for _, r in shed} == {
            ("overloaded", "1")
        }
        served = [ln for ln in log_lines(log) if ln["status"] == 200]
        assert [ln["priority"] for ln in served] == ["normal", "high", "high"]
        assert served[-1]["queue_ms"] > 400  # waited for two answers of 0.5 s
        assert up.peak == 1 and gw.status()["groups"]["g1"]["in_use"] == 0


@pytest.mark.asyncio
async def test_warm_standby_joins_at_once_when_requests_wait_and_leaves_after_its_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fast tier: one instance in rotation (1 slot), one warm standby out of it. A
    second request that would wait is served by the standby at once, not after the first
    answer; once the hold is over and nothing waits, the standby is out again."""
    monkeypatch.setattr("sluice.gateway.groups.STANDBY_HOLD_S", 1.5)
    busy, spare = FakeUpstream("busy", latency=0.5), FakeUpstream("spare", latency=0.5)
    snap = lambda: snapshot(  # noqa: E731
        1, {"g1": [busy]}, [RouteRule("r1", (("g1", 1),))], max_concurrency=1,
        standby={"g1": [spare]},
    )  # fmt: skip
    async with running(busy, spare, snapshot=snap) as (gw, client, log):
        assert (await chat(client)).headers["x-sluice-instance"] == "busy"  # alone: no wait
        assert spare.accepted == 0 and gw.status()["groups"]["g1"]["standby"] == 1
        start = time.perf_counter()
        first = asyncio.create_task(chat(client))
        await asyncio.sleep(0.05)
        second = await chat(client)
        assert second.headers["x-sluice-instance"] == "spare"
        assert time.perf_counter() - start < 0.8  # served beside the first, not after it
        assert (await first).headers["x-sluice-instance"] == "busy"
        assert log_lines(log)[-1]["queue_ms"] < 100
        value = metric_values(gw.metrics_text()[0].decode())
        assert value("sluice_gateway_standby_promotions_total", group="g1") == 1
        assert gw.status()["groups"]["g1"]["instances"] == 2
        assert gw.traffic()["g1"].standby_in_rotation == 2  # the controller takes it in
        async with asyncio.timeout(3):
            while gw.status()["groups"]["g1"]["instances"] == 2:
                await asyncio.sleep(0.05)
        assert gw.status()["groups"]["g1"]["standby_promoted_s"] is None
        assert gw.traffic()["g1"].standby_in_rotation == 0
        for _ in range(3):  # out of rotation again: one at a time goes to the busy one
            assert (await chat(client)).headers["x-sluice-instance"] == "busy"


@pytest.mark.asyncio
async def test_a_batching_groups_standby_joins_past_its_level_before_anything_waits() -> None:
    """A batching server admits many requests (8 slots here) and queues them inside, so the
    gateway's own queue would form too late: past the group's standby level (1 request in
    flight per instance in rotation: its capacity at the SLO), the warm standby joins at
    once, and the next request goes to it; none waited at the gateway."""
    busy, spare = FakeUpstream("busy", latency=0.5), FakeUpstream("spare", latency=0.5)
    snap = lambda: snapshot(  # noqa: E731
        1, {"g1": [busy]}, [RouteRule("r1", (("g1", 1),))], max_concurrency=8,
        standby={"g1": [spare]}, traffic={"g1": GroupTraffic(standby_at=1.0)},
    )  # fmt: skip
    async with running(busy, spare, snapshot=snap) as (gw, client, log):
        assert (await chat(client)).headers["x-sluice-instance"] == "busy"  # 1: at the level
        assert gw.status()["groups"]["g1"]["instances"] == 1
        first = asyncio.create_task(chat(client))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(chat(client))  # 2 in flight on 1 instance: past it
        await asyncio.sleep(0.05)
        assert gw.status()["groups"]["g1"]["instances"] == 2
        third = await chat(client)
        assert third.headers["x-sluice-instance"] == "spare"
        assert {(await first).status_code, (await second).status_code} == {200}
        assert all(ln["queue_ms"] < 50 for ln in log_lines(log))
        value = metric_values(gw.metrics_text()[0].decode())
        assert value("sluice_gateway_standby_promotions_total", group="g1") == 1


@pytest.mark.asyncio
async def test_queue_timeout_is_503_and_a_removed_group_frees_its_waiters() -> None:
    up = FakeUpstream("i1", latency=1.0)
    snap = g1(up, traffic={"g1": q(max_wait_s=0.2)}, max_concurrency=1)
    async with running(up, snapshot=snap) as (gw, client, _log):
        busy = asyncio.create_task(chat(client))
        await asyncio.sleep(0.05)
        start = time.perf_counter()
        resp = await chat(client)
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "queue_timeout"
        assert 0.15 < time.perf_counter() - start < 0.8 and resp.headers["retry-after"] == "1"
        waiter = asyncio.create_task(chat(client))
        await asyncio.sleep(0.05)
        gw.update(snapshot(2, {"g2": [up]}, [RouteRule("r2", (("g2", 1),))]))
        async with asyncio.timeout(0.5):
            assert (await waiter).status_code == 503
        assert (await busy).status_code == 200


@pytest.mark.asyncio
async def test_rules_on_headers_and_priority() -> None:
    a, b, c = FakeUpstream("a"), FakeUpstream("b"), FakeUpstream("c")
    rules = [
        RouteRule("beta", (("gb", 1),), header_prefixes=(("x-cohort", "beta"),)),
        RouteRule("low", (("gc", 1),), priorities=frozenset({"low"})),
        RouteRule("rest", (("ga", 1),)),
    ]
    tenants = {"sk-test-f3abf2a6cc4f0098": TenantAccess("t1", priority_header=True)}
    snap = lambda: snapshot(1, {"ga": [a], "gb": [b], "gc": [c]}, rules, tenants=tenants)  # noqa: E731
    async with running(a, b, c, snapshot=snap) as (_gw, client, _log):
        for headers, route in [({"X-Cohort": "beta-2"}, "beta"), ({"x-cohort": "gamma"}, "rest")]:
            assert (await chat(client, **headers)).headers["x-sluice-route"] == route
        for prio, route in [("low", "low"), ("high", "rest"), ("bogus", "rest")]:
            resp = await chat(client, x_sluice_priority=prio)
            assert resp.headers["x-sluice-route"] == route


@pytest.mark.asyncio
async def test_a_client_leaving_the_queue_is_cancelled() -> None:
    up = FakeUpstream("i1", latency=0.5)
    async with running(up, snapshot=g1(up, max_concurrency=1)) as (gw, client, log):
        busy = asyncio.create_task(chat(client))
        await asyncio.sleep(0.05)
        leaver = asyncio.create_task(chat(client))
        await asyncio.sleep(0.05)
        assert gw.status()["groups"]["g1"]["queued"]["normal"] == 1
        leaver.cancel()  # the client closes its connection
        async with asyncio.timeout(2):
            while gw.status()["groups"]["g1"]["queued"]["normal"]:
                await asyncio.sleep(0.01)
        assert (await busy).status_code == 200 and len(up.requests) == 1
        assert [ln["status"] for ln in log_lines(log)] == [499, 200]
        assert gw.status()["groups"]["g1"]["in_use"] == 0


@pytest.mark.asyncio
async def test_fallback_to_a_group_with_headroom() -> None:
    slow, spare = FakeUpstream("slow", latency=0.5), FakeUpstream("spare")
    rules = [RouteRule("r1", (("ga", 1),), fallback=("gb",))]

    def snap(version: int, ga: list[FakeUpstream]) -> RoutingSnapshot:
        return snapshot(version, {"ga": ga, "gb": [spare]}, rules, max_concurrency=1)

    async with running(slow, spare, snapshot=lambda: snap(1, [slow])) as (gw, client, log):
        busy = asyncio.create_task(chat(client))
        await asyncio.sleep(0.05)
        resp = await chat(client)  # ga is full: gb has a free slot
        assert resp.status_code == 200 and resp.headers["x-sluice-group"] == "gb"
        gw.update(snap(2, []))
        assert (await chat(client)).headers["x-sluice-group"] == "gb"
        await busy
        vias = [ln["via"] for ln in log_lines(log) if ln["group"] == "gb"]
        assert vias == ["fallback ga->gb: overloaded", "fallback ga->gb: no ready instance"]


@pytest.mark.asyncio
async def test_mirror_copies_without_delaying_the_caller() -> None:
    fast, shadow = FakeUpstream("fast"), FakeUpstream("shadow", latency=1.0)
    rules = [RouteRule("r1", (("g1", 1),), mirror=("gm", 100.0))]
    snap = lambda: snapshot(1, {"g1": [fast], "gm": [shadow]}, rules)  # noqa: E731
    async with running(fast, shadow, snapshot=snap) as (gw, client, log):
        for _ in range(5):
            start = time.perf_counter()
            resp = await chat(client)
            assert resp.status_code == 200 and resp.headers["x-sluice-instance"] == "fast"
            assert time.perf_counter() - start < 0.3
        async with asyncio.timeout(3):
            while len(shadow.requests) < 5:
                await asyncio.sleep(0.01)
        assert shadow.requests[0][3] == fast.requests[0][3]  # the same body
        lines = log_lines(log)
        assert len(lines) == 5 and {ln["mirror"] for ln in lines} == {"gm"}
        assert 'sluice_gateway_mirrored_total{group="gm"} 5.0' in gw.metrics_text()[0].decode()


@pytest.mark.asyncio
async def test_outlier_is_ejected_and_status_says_why() -> None:
    good, bad = FakeUpstream("good"), FakeUpstream("bad", status=500)
    snap = g1(good, bad, traffic={"g1": q(outlier_failures=2, outlier_base_ejection_s=30)})
    async with running(good, bad, snapshot=snap) as (gw, client, _log):
        statuses = [(await chat(client)).status_code for _ in range(30)]
        assert statuses.count(500) == 2 and statuses[-20:] == [200] * 20
        group = gw.status()["groups"]["g1"]
        [ejected] = group["ejected"]
        assert ejected["instance"] == "bad" and ejected["times"] == 1
        assert ejected["reason"] == "2 failures in a row, last: HTTP 500"
        assert 25 < ejected["until_s"] <= 30 and group["slots"] == 8


@pytest.mark.asyncio
async def test_a_slow_instance_is_ejected_for_latency_and_status_says_why() -> None:
    fast = [FakeUpstream(f"fast{k}", latency=0.01) for k in range(2)]
    slow = FakeUpstream("slow", latency=0.1)  # answers, 10x slower: no failure to count
    traffic = {"g1": q(outlier_latency_min_requests=10, outlier_base_ejection_s=30)}
    async with running(*fast, slow, snapshot=g1(*fast, slow, traffic=traffic)) as (gw, client, _):
        for _ in range(60):
            assert (await chat(client)).status_code == 200
            if gw.status()["groups"]["g1"]["ejected"]:
                break
        group = gw.status()["groups"]["g1"]
        [ejected] = group["ejected"]
        assert ejected["instance"] == "slow" and ejected["times"] == 1
        assert re.fullmatch(
            r"latency \d+ ms vs peers \d+ ms \(\d+\.\dx\) over its last ~10 requests \(\d+ seen\)",
            ejected["reason"],
        ), ejected["reason"]
        assert group["slots"] == 16  # two instances of 8 left
        before = len(slow.requests)
        assert {(await chat(client)).headers["x-sluice-instance"] for _ in range(20)} <= {
            "fast0",
            "fast1",
        }
        assert len(slow.requests) == before


@pytest.mark.asyncio
async def test_affinity_header_pins_a_key_to_one_instance() -> None:
    ups = [FakeUpstream(f"i{n}") for n in range(4)]
    snap = g1(*ups, traffic={"g1": q(affinity_header="x-session")})
    async with running(*ups, snapshot=snap) as (_gw, client, _log):
        for key in ("alice", "bob", "carol"):
            pinned = {(await chat(client, x_session=key)).headers["x-sluice-instance"]}
            for _ in range(8):
                assert (await chat(client, x_session=key)).headers["x-sluice-instance"] in pinned
        spread = {(await chat(client)).headers["x-sluice-instance"] for _ in range(40)}
        assert len(spread) > 1  # without the header: balanced


@pytest.mark.asyncio
async def test_prefix_routing_keeps_a_conversation_on_the_instance_that_holds_it() -> None:
    """Each conversation re-sends its history: with prefix routing on, all its turns go to
    one instance (the one its first turn went to), different system prompts spread over the
    fleet, and the gateway's metrics count the blocks it expected to hit."""
    ups = [FakeUpstream(f"i{n}") for n in range(4)]
    prefix = PrefixRouting(block_bytes=256, max_blocks=16, index_blocks=1000)
    snap = g1(*ups, traffic={"g1": q(prefix=prefix)})
    async with running(*ups, snapshot=snap) as (gw, client, _log):
        first: dict[int, str] = {}
        for conv in range(12):
            history = [{"role": "system", "content": f"system prompt {conv} " * 40}]
            for turn in range(4):
                history.append({"role": "user", "content": f"turn {turn} of {conv} " * 20})
                resp = await client.post(
                    "/v1/chat/completions",
                    json={"model": "m1", "messages": history},
                    headers=AUTH,
                )
                assert resp.status_code == 200, resp.text
                instance = resp.headers["x-sluice-instance"]
                assert first.setdefault(conv, instance) == instance, (conv, turn)
                history.append({"role": "assistant", "content": "ok " * 30})
        assert len(set(first.values())) > 1  # conversations spread, each one stays
        short = await chat(client)  # a prompt under one block: power of two choices
        assert short.status_code == 200
        value = metric_values(gw.metrics_text()[0].decode())
    blocks = value("sluice_gateway_prefix_blocks_total", group="g1")
    cached = value("sluice_gateway_prefix_cached_blocks_total", group="g1")
    assert blocks > 0 and 0.5 * blocks < cached < blocks  # later turns hit, first ones miss


@pytest.mark.asyncio
async def test_rate_limit_is_429_with_retry_after() -> None:
    up = FakeUpstream("i1")
    snap = g1(up, tenants={"sk-test-f3abf2a6cc4f0098": TenantAccess("t1", rate_limit=(0.5, 2))})
    async with running(up, snapshot=snap) as (_gw, client, log):
        codes = [(await chat(client)).status_code for _ in range(3)]
        resp = await chat(client)
        assert codes == [200, 200, 429] and resp.headers["retry-after"] == "2"
        assert resp.json()["error"]["code"] == "rate_limited"
        assert log_lines(log)[-1]["tenant"] == "t1" and len(up.requests) == 2


@pytest.mark.asyncio
async def test_metrics_count_requests_and_show_the_data_plane() -> None:
    up = FakeUpstream("i1")
    async with running(up) as (gw, client, _log):
        for _ in range(3):
            await chat(client)
        await chat(client, model="nope")  # 404: no group, no route
        public = await client.get("/metrics")  # not on the public port, to anyone
        for headers in (
            {"Authorization": "Bearer sk-test-f3abf2a6cc4f0098"},
            {"Accept": "text/plain"},
        ):
            assert (await client.get("/metrics", headers=headers)).status_code == 404
        body, content_type = gw.metrics_text()

    assert public.status_code == 404 and public.headers["content-type"] == "application/json"
    assert public.json()["error"]["code"] == "not_found" and b"sluice_gateway" not in public.content
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    assert isinstance(body, bytes)
    value = metric_values(body.decode())
    assert value("sluice_gateway_requests_total", group="g1", route="r1", status="200") == 3
    assert value("sluice_gateway_requests_total", group="", route="", status="404") == 4
    assert value("sluice_gateway_request_duration_seconds_count", group="g1", route="r1") == 3
    assert (
        value("sluice_gateway_request_duration_seconds_bucket", group="g1", route="r1", le="60.0")
        == 3
    )
    assert value("sluice_gateway_slots", group="g1") == 8
    assert value("sluice_gateway_inflight", group="g1") == 0
    assert value("sluice_gateway_queue_length", group="g1", priority="low") == 0
    assert value("sluice_gateway_instances", group="g1", state="ready") == 1
    assert value("sluice_gateway_instances", group="g1", state="ejected") == 0
    assert value("sluice_gateway_shed_total", group="g1", reason="overloaded") == 0
    assert value("sluice_gateway_mirrored_total", group="g1") == 0
    assert value("sluice_gateway_queue_wait_seconds_count", group="g1") == 0
    assert value("sluice_gateway_snapshot_version") == 1


@pytest.mark.asyncio
async def test_served_seconds_count_time_at_the_instance_not_in_the_queue() -> None:
    """The autoscaler's service time (`TrafficSample.served_s`): three 0.3 s requests on one
    slot wait 0, 0.3 and 0.6 s in the queue; each is counted at about 0.3 s served."""
    up = FakeUpstream("i1", latency=0.3)
    async with running(up, snapshot=g1(up, max_concurrency=1)) as (gw, client, _):
        body = {"model": "m1", "messages": []}
        resps = await asyncio.gather(
            *(client.post("/v1/chat/completions", json=body, headers=AUTH) for _ in range(3))
        )
        assert [r.status_code for r in resps] == [200, 200, 200]
        sample = gw.traffic()["g1"]
        latency = sum(
            b * n for b, n in zip(sample.latency_bounds, sample.latency_counts, strict=False)
        )
    assert sample.completions == 3
    assert 0.85 <= sample.served_s <= 1.3  # ~3 x 0.3 s; queueing would make it ~1.8 s
    assert sample.served_sq_s == pytest.approx(3 * (sample.served_s / 3) ** 2, rel=0.3)
    assert latency > sample.served_s  # the bucket bounds of 0.3 / 0.6 / 0.9 s latencies
