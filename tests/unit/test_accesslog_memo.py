"""The access log's rendered-latency memo stays small however many distinct latencies come:
in a 10-minute soak its old bound (20,000 entries, 2.7 MB) was still filling at the end."""

from __future__ import annotations

import io

from sluice.gateway.accesslog import AccessLog


def test_latency_memo_is_bounded() -> None:
    log = AccessLog(io.StringIO())
    texts = [log._render_latency(us) for us in range(25_000, 45_000)]  # 20 ms of spread
    assert texts[0] == "25.000" and texts[-1] == "44.999"
    assert len(log._latency) <= 4096
