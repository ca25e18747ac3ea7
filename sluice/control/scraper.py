"""Scrape the Prometheus metrics of every READY instance whose server (a `command`, or an
`external` endpoint) declares a `metrics_path` (vLLM, SGLang, llama.cpp; what is read and
how it is named across them is `sluice.policy.server_metrics`), and keep each one's latest
signals.

What they are used for:
- autoscaling (`load`): the servers' running and waiting requests, summed per group over
  fresh scrapes, become `GroupLoad.in_flight` / `server_waiting`: a queue inside a server is
  load the gateway's counters show as served;
- canary analysis (`reset`, `window`): TTFT and TPOT histograms differenced between scrapes
  since a step began, per group; shown beside the analysis of command groups, whose servers
  keep no per-request samples (not gated on);
- operators: `status()` (GET /v1/status, "servers") and `prometheus_text()` (the control
  API's /metrics, `sluice_server_*` gauges by group and instance), KV-cache use included.

Like `sluice.control.samples`, the scraping runs in its own task, never in the tick: the
tick says what to read (`watch`). Every instance is read concurrently, each within
`INSTANCE_TIMEOUT_S` and `MAX_BODY_BYTES`, so a hung or flooding server costs one slot of
one round and nothing else; a failed read (timeout, refusal, a body too big, garbage) is
counted in the status and leaves that instance's signals to go stale (`MAX_AGE_S`), never
zero. Parsing runs in a thread: in `sluice up` the gateway shares this event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import httpx

from sluice.control.polling import RoundPoller
from sluice.core import InstanceState, InstanceStatus
from sluice.policy.server_metrics import Histogram, ServerLoad, ServerSignals, parse_server_metrics
from sluice.spec import GroupSpec, PlatformSpec

__all__ = ["ScrapeTarget", "ServerScraper", "ServerWindow", "metrics_path", "scrape_targets"]


POLL_S = 1.0
"""A round starts this often (or as soon as the last one ended, if it took longer)."""
INSTANCE_TIMEOUT_S = 1.5
"""One instance's whole read (connect, headers, body) must be done within this."""
MAX_BODY_BYTES = 4 * 2**20
"""A larger answer is refused unread: vLLM's whole page is ~50-300 KiB."""
MAX_AGE_S = 5.0
"""Signals older than this are stale: `load` leaves them out (missing, never zero)."""


class ScrapeTarget(NamedTuple):
    group: str
    instance: str
    url: str
    """the full URL of the server's metrics page"""


def metrics_path(spec: GroupSpec) -> str | None:
    """Where the group's server (a command, or an external endpoint) serves its Prometheus
    metrics, if it says. An external endpoint's page is read without its API key (vLLM and
    SGLang serve /metrics to anyone; one that does not is a counted failure)."""
    for m in spec.models.values():
        server = m.command or m.external
        if server is not None:
            return server.metrics_path
    return None


def scrape_targets(spec: PlatformSpec, observed: Sequence[InstanceStatus]) -> list[ScrapeTarget]:
    """The READY instances of command and external groups that declare a `metrics_path`."""
    paths = {g.name: metrics_path(g) for g in spec.groups}
    return [
        ScrapeTarget(i.group, i.id, i.url + path)
        for i in observed
        if i.state is InstanceState.READY and i.url and (path := paths.get(i.group))
    ]


@dataclass
class ServerWindow:
    """One group's servers' TTFT and TPOT observations since `since` (epoch s): the sum of
    what each instance's histograms gained between two of its scrapes."""

    since: float = 0.0
    ttft: Histogram | None = None
    tpot: Histogram | None = None

    def to_json(self) -> dict[str, Any]:
        def q(h: Histogram | None, p: float) -> float | None:
            value = h.quantile(p) if h is not None else None
            return None if value is None else round(value, 6)

        return {
            "since": self.since,
            "requests": round(self.ttft.total) if self.ttft is not None else 0,
            "ttft_p50_s": q(self.ttft, 0.5),
            "ttft_p99_s": q(self.ttft, 0.99),
            "tpot_p50_s": q(self.tpot, 0.5),
            "tpot_p99_s": q(self.tpot, 0.99),
        }


@dataclass
class _Seen:
    """What one instance said last, and how reading it goes."""

    group: str
    signals: ServerSignals | None = None
    at: float | None = None
    """when `signals` were read (epoch s)"""
    scrapes: int = 0
    failures: int = 0
    """reads that failed in a row"""
    failures_total: int = 0
    error: str = ""


class ServerScraper(RoundPoller[ScrapeTarget]):
    """`watch(targets)` starts the scraping task (on the running loop) and says what it
    reads; `load(group, now)` is what autoscaling reads; `aclose` stops it. `now` is the
    controller's clock (freshness is judged on the same clock as the tick's)."""

    name = "scraper"

    def __init__(
        self,
        now: Callable[[], float],
        client: httpx.AsyncClient | None = None,
        poll_s: float = POLL_S,
        timeout_s: float = INSTANCE_TIMEOUT_S,
        max_bytes: int = MAX_BODY_BYTES,
        max_age_s: float = MAX_AGE_S,
    ) -> None:
        super().__init__(client, poll_s, timeout_s)
        self._now = now
        self._max_bytes = max_bytes
        self._max_age_s = max_age_s
        self._seen: dict[str, _Seen] = {}
        self._windows: dict[str, ServerWindow] = {}

    def watch(self, targets: Iterable[ScrapeTarget]) -> None:
        """From now on read `targets` (none: the task idles and closes its connections).
        Returns at once; the reads happen in the scraping task."""
        todo = list(targets)
        live = {t.instance for t in todo}
        for gone in set(self._seen) - live:  # stopped: its last numbers are not the group's
            del self._seen[gone]
        self._set_targets(todo)

    def load(self, group: str, now: float) -> ServerLoad | None:
        """The group's servers' running and waiting requests, summed over those read within
        `MAX_AGE_S` of `now` that report both; None when none does."""
        fresh = [
            s.signals
            for s in self._seen.values()
            if s.group == group
            and s.signals is not None
            and s.at is not None
            and now - s.at <= self._max_age_s
            and s.signals.waiting is not None
        ]
        if not fresh:
            return None
        kv = [s.kv_cache_usage for s in fresh if s.kv_cache_usage is not None]
        return ServerLoad(
            instances=len(fresh),
            running=sum(s.running or 0.0 for s in fresh),
            waiting=sum(s.waiting or 0.0 for s in fresh),
            kv_cache_usage=sum(kv) / len(kv) if kv else None,
        )

    def reset(self, groups: Iterable[str], now: float) -> None:
        """Start new latency windows for `groups` at `now` (a canary step began)."""
        for g in groups:
            self._windows[g] = ServerWindow(since=now)

    def window(self, group: str) -> ServerWindow | None:
        """The group's window since its last `reset` (None: never reset, or none of its
        instances is scraped)."""
        if not any(t.group == group for t in self._targets):
            return None
        return self._windows.get(group)

    def status(self) -> dict[str, Any]:
        """For GET /v1/status: rounds, the last one's length, and per instance its latest
        signals, their age, and its failures (a failing one says why)."""
        now = self._now()
        instances = {}
        for iid, s in sorted(self._seen.items()):
            sig = s.signals
            instances[iid] = {
                "group": s.group,
                "running": sig.running if sig else None,
                "waiting": sig.waiting if sig else None,
                "kv_cache_usage": sig.kv_cache_usage if sig else None,
                "prefix_cache_hit_rate": _hit_rate(sig),
                "metrics": list(sig.found) if sig else [],
                "age_s": round(now - s.at, 3) if s.at is not None else None,
                "scrapes": s.scrapes,
                "failures": s.failures,
                "failures_total": s.failures_total,
                "error": s.error,
            }
        return {
            "targets": len(self._targets),
            "rounds": self.rounds,
            "last_round_s": round(self.last_round_s, 3),
            "instances": instances,
        }

    def prometheus_text(self) -> bytes:
        """`sluice_server_*` gauges (Prometheus text format 0.0.4), labelled by group and
        instance: the servers' own numbers where Sluice's metrics are scraped already."""
        rows: dict[str, list[tuple[_Seen, str, float]]] = {n: [] for n, _ in _EXPORTED}
        for iid, s in sorted(self._seen.items()):
            sig = s.signals
            values = {
                "sluice_server_running": sig.running if sig else None,
                "sluice_server_waiting": sig.waiting if sig else None,
                "sluice_server_kv_cache_usage": sig.kv_cache_usage if sig else None,
                "sluice_server_prefix_cache_queries_total": sig.prefix_queries if sig else None,
                "sluice_server_prefix_cache_hits_total": sig.prefix_hits if sig else None,
                "sluice_server_prefix_cache_hit_rate": sig.prefix_hit_rate if sig else None,
                "sluice_server_scrape_failures_total": float(s.failures_total),
            }
            for name, value in values.items():
                if value is not None:
                    rows[name].append((s, iid, value))
        out = []
        for name, help_text in _EXPORTED:
            if not rows[name]:
                continue
            kind = "counter" if name.endswith("_total") else "gauge"
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            out += [
                f'{name}{{group="{_label(s.group)}",instance="{_label(iid)}"}} {value:g}'
                for s, iid, value in rows[name]
            ]
        return ("\n".join(out) + "\n").encode() if out else b""

    # --- the task --------------------------------------------------------------------------

    async def poll(self, targets: Iterable[ScrapeTarget]) -> None:
        """One round: read every target concurrently, each within the limits."""
        await asyncio.gather(*(self._scrape(t) for t in list(targets)))

    async def _scrape(self, t: ScrapeTarget) -> None:
        seen = self._seen.setdefault(t.instance, _Seen(t.group))
        try:
            async with asyncio.timeout(self._timeout_s):
                body = await self._get(t.url)
            signals = await asyncio.to_thread(parse_server_metrics, body.decode("utf-8", "replace"))
        except (httpx.HTTPError, ValueError, TimeoutError) as exc:
            seen.failures += 1
            seen.failures_total += 1
            seen.error = f"{type(exc).__name__}: {exc}"[:200]
            return
        if self._seen.get(t.instance) is not seen:
            return  # no longer watched while this was read
        self._add_to_window(seen, signals)
        seen.signals, seen.at = signals, self._now()
        seen.scrapes += 1
        seen.failures, seen.error = 0, ""

    async def _get(self, url: str) -> bytes:
        """The body of a 200 answer, at most `max_bytes` of it (ValueError beyond)."""
        async with self._client.stream("GET", url) as r:
            if r.status_code != 200:
                raise ValueError(f"GET {url} answered {r.status_code}")
            declared = r.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self._max_bytes:
                raise ValueError(f"metrics answer of {declared} bytes, over {self._max_bytes}")
            chunks, size = [], 0
            async for chunk in r.aiter_bytes():
                size += len(chunk)
                if size > self._max_bytes:
                    raise ValueError(f"metrics answer over {self._max_bytes} bytes")
                chunks.append(chunk)
        return b"".join(chunks)

    def _add_to_window(self, seen: _Seen, new: ServerSignals) -> None:
        """What the instance's histograms gained since its previous scrape goes into its
        group's window (a first scrape only sets where it starts from)."""
        win = self._windows.get(seen.group)
        if win is None or seen.signals is None:
            return
        old = seen.signals
        for name in ("ttft", "tpot"):
            now_h: Histogram | None = getattr(new, name)
            gained = now_h.since(getattr(old, name)) if now_h is not None else None
            if gained is None:
                continue
            current: Histogram | None = getattr(win, name)
            setattr(win, name, gained if current is None else current.plus(gained))


_EXPORTED = (
    ("sluice_server_running", "Requests the server says it runs now (its own metrics)."),
    ("sluice_server_waiting", "Requests waiting inside the server for a batch slot."),
    ("sluice_server_kv_cache_usage", "The server's KV-cache use, fraction 0..1."),
    (
        "sluice_server_prefix_cache_queries_total",
        "Prompt tokens the server looked up in its prefix cache (its own counter).",
    ),
    (
        "sluice_server_prefix_cache_hits_total",
        "Of those, the tokens it found cached: a group's hit rate is the ratio of the rates.",
    ),
    (
        "sluice_server_prefix_cache_hit_rate",
        "The server's prefix-cache hit rate, 0..1, where it gives only a rate (older vLLM, "
        "SGLang).",
    ),
    ("sluice_server_scrape_failures_total", "Reads of the server's metrics that failed."),
)


def _hit_rate(sig: ServerSignals | None) -> float | None:
    """The instance's prefix-cache hit rate over its lifetime: its counters where it has
    them, else the rate it gives."""
    if sig is None:
        return None
    if sig.prefix_queries:
        return round((sig.prefix_hits or 0.0) / sig.prefix_queries, 4)
    return sig.prefix_hit_rate


def _label(value: str) -> str:
    return value.replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")
