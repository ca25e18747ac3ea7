"""The alerts' edge (O2): runs `sluice.policy.alerts` on the observer's values, turns each
transition into an event and an outbox row, and delivers the outbox to each group's
`alert_channel` (a webhook, else a log line), with retries and a dead-letter record.

The channel is read from the spec in force at delivery time and never stored: a webhook
URL may carry a token. Logs name a webhook by scheme://host only.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sluice.control.events import EventLog, store_outage
from sluice.core import Clock
from sluice.core.urls import redact_channel, redact_url
from sluice.policy.alerts import (
    AlertState,
    Key,
    Transition,
    channel_kind,
    evaluate,
    rules_for,
    states_from_json,
    states_to_json,
)
from sluice.policy.startup import StartupState
from sluice.spec import GroupSpec, PlatformSpec
from sluice.spec.observability import AlertRule, AlertsSpec
from sluice.store import AlertDelivery
from sluice.store.ports import DeliveryRecords, StateRecords

__all__ = ["STATE_KEY", "Alerting", "redact_url", "retry_delay_s"]


class _AlertStore(DeliveryRecords, StateRecords, Protocol):
    """The records this module reads and writes."""


log = logging.getLogger("sluice.alerts")

STATE_KEY = "alerts"
"""The `controller_state` document holding the pending and firing alerts."""

RECENT = 200
"""Transitions kept in memory for `report` (the events keep every one)."""

RETRY_BASE_S = 2.0
RETRY_CAP_S = 300.0


def retry_delay_s(attempts: int) -> float:
    """Wait after the `attempts`-th failed attempt: 2 s, 4 s, 8 s ... at most 5 minutes."""
    return min(RETRY_CAP_S, RETRY_BASE_S * 2.0 ** max(0, attempts - 1))


def _scrub(text: str, url: str) -> str:
    """`text` with every trace of `url` past its host replaced (an HTTP library's message
    may quote the URL)."""
    parts = urlsplit(url.strip())
    for secret in (url.strip(), parts.path, parts.query, parts.username, parts.password):
        if secret and secret != "/":
            text = text.replace(secret, "<redacted>")
    return text


def _is_url(channel: str) -> bool:
    return channel_kind(channel) == "webhook"


class Alerting:
    """The alert states, their outbox and its delivery. `links(group)` is the text that
    points an on-call person at the group's explanation (CLI and API)."""

    def __init__(self, store: _AlertStore, events: EventLog, links: Callable[[str], str]) -> None:
        self._store = store
        self._events = events
        self._links = links
        self._states: dict[Key, AlertState] = {}
        self._saved: dict[Key, AlertState] | None = None
        """the states the store holds (None: unknown, write them)"""
        self._unsent: list[tuple[str, str, str, dict[str, Any], float]] = []
        """outbox rows the store refused, to add once it takes writes"""
        self._recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self._rules_of: tuple[PlatformSpec, dict[str, list[AlertRule]]] | None = None
        self._last_spec: PlatformSpec | None = None
        self._starting: dict[str, StartupState] = {}

    async def load(self) -> None:
        """Take up the states stored before a restart (firing alerts stay firing)."""
        doc = await asyncio.to_thread(self._store.get_state, STATE_KEY)
        self._states = states_from_json(doc)
        self._saved = dict(self._states)

    def _rules(self, spec: PlatformSpec) -> dict[str, list[AlertRule]]:
        if self._rules_of is None or self._rules_of[0] is not spec:
            names = [g.name for g in spec.groups]
            self._rules_of = (spec, rules_for(spec.observability.alerts, names))
        return self._rules_of[1]

    async def evaluate(
        self,
        spec: PlatformSpec,
        values_by_group: Mapping[str, Mapping[str, float | None]],
        now: float,
        starting: Mapping[str, StartupState] | None = None,
    ) -> list[Transition]:
        """One evaluation (the observer's, about once a second): events and outbox rows
        for what fired or resolved, and the states stored when they changed. Nothing is
        written when nothing changed. A store that refuses writes loses nothing: rows
        and states wait in memory until it takes them. `starting`: the groups in their
        start-up grace (`sluice.policy.startup`), shown by `report`."""
        self._starting = dict(starting or {})
        new, transitions = evaluate(self._rules(spec), self._states, values_by_group, now)
        for t in transitions:
            group = spec.group(t.group) or self._group_before(t.group)
            payload = self._payload(group, t, t.group)
            self._recent.append(payload)
            kind = "alert_firing" if t.state == "firing" else "alert_resolved"
            detail = {k: payload[k] for k in ("rule", "severity", "value", "threshold", "op")}
            await self._events.emit(t.group, None, kind, payload["text"], **detail)
            self._unsent.append((t.group, t.rule, t.state, payload, now))
        self._states = new
        self._last_spec = spec
        await self._write(now)
        return transitions

    async def notice(
        self,
        g: GroupSpec,
        rule: str,
        severity: str,
        text: str,
        detail: Mapping[str, Any],
        now: float,
    ) -> None:
        """A one-off alert that is no rule's state (a capacity test that made the group's
        targets stale): an `alert_notice` event and a message to the group's channel,
        delivered and retried as any alert's (state `firing`; nothing resolves it)."""
        explain = self._links(g.name)
        payload = {
            "group": g.name,
            "owner": g.owner,
            "business": g.business,
            "channel": channel_kind(g.alert_channel),
            "rule": rule,
            "severity": severity,
            "state": "firing",
            "at": now,
            "detail": dict(detail),
            "explain": explain,
            "text": f"{text}. Why: {explain}",
        }
        self._recent.append(payload)
        await self._events.emit(g.name, None, "alert_notice", text, rule=rule, severity=severity)
        self._unsent.append((g.name, rule, "firing", payload, now))
        await self._write(now)

    def _group_before(self, name: str) -> GroupSpec | None:
        return self._last_spec.group(name) if self._last_spec is not None else None

    async def _write(self, now: float) -> None:
        """Outbox rows first, then the states: a crash between them repeats a message at
        worst, never loses one."""
        try:
            while self._unsent:
                group, rule, state, payload, at = self._unsent[0]
                await asyncio.to_thread(
                    self._store.add_delivery,
                    group=group,
                    rule=rule,
                    state=state,
                    payload=payload,
                    now=at,
                )
                self._unsent.pop(0)
            if self._saved != self._states:
                doc = states_to_json(self._states)
                await asyncio.to_thread(self._store.put_state, STATE_KEY, doc, now)
                self._saved = dict(self._states)
        except Exception as exc:
            problem = store_outage(exc)
            if problem is None:
                raise
            log.warning("%s: %d alert message(s) wait in memory", problem, len(self._unsent))

    def _payload(self, g: GroupSpec | None, t: Transition, name: str) -> dict[str, Any]:
        owner = g.owner if g else "unknown"
        value = "no data" if t.value is None else f"{t.value:.4g}"
        if t.state == "firing":
            text = (
                f"[{t.severity}] {t.rule} FIRING on {name} (owner {owner}): {t.series} = "
                f"{value} {t.op} {t.threshold:g}"
            )
        else:
            text = f"[{t.severity}] {t.rule} resolved on {name} (owner {owner}): {t.reason}"
        explain = self._links(name)
        return {
            "group": name,
            "owner": owner,
            "business": g.business if g else "unknown",
            "channel": channel_kind(g.alert_channel) if g else "unknown",
            "rule": t.rule,
            "severity": t.severity,
            "state": t.state,
            "value": t.value,
            "threshold": t.threshold,
            "op": t.op,
            "series": t.series,
            "since": t.since,
            "at": t.at,
            "reason": t.reason,
            "explain": explain,
            "text": f"{text}. Why: {explain}",
        }

    # --- delivery ----------------------------------------------------------------------

    async def deliver_due(self, spec: PlatformSpec, now: float) -> dict[str, int]:
        """One pass over the due outbox rows: each goes to its group's current channel.
        Returns counts by outcome (delivered, logged, retry, dead)."""
        due = await asyncio.to_thread(self._store.due_deliveries, now)
        counts = {"delivered": 0, "logged": 0, "retry": 0, "dead": 0}
        if not due:
            return counts
        alerts = spec.observability.alerts
        transport: httpx.AsyncHTTPTransport | None = None
        try:
            for row in due:
                g = spec.group(row.group)
                if g is None:
                    why = f"group {row.group!r} is no longer in the spec: no channel to use"
                    await self._dead(row, now, why)
                    counts["dead"] += 1
                    continue
                if not _is_url(g.alert_channel):
                    self._log_message(row, g)
                    note = f"logged: channel {g.alert_channel!r} is not a webhook URL"
                    await self._record(row.id, now, True, note)
                    counts["logged"] += 1
                    continue
                if transport is None:
                    # The transport, not httpx.AsyncClient: the client logs every request's
                    # full URL at INFO, and a webhook URL carries its token.
                    transport = httpx.AsyncHTTPTransport(trust_env=False, retries=0)
                error = await _post(transport, g.alert_channel, row.payload, alerts)
                if error is None:
                    await self._record(row.id, now, True, "")
                    counts["delivered"] += 1
                    continue
                attempts = row.attempts + 1
                where = redact_url(g.alert_channel)
                if attempts >= alerts.webhook_attempts:
                    await self._dead(row, now, f"{where}: {error} (after {attempts} attempts)")
                    counts["dead"] += 1
                else:
                    retry = now + retry_delay_s(attempts)
                    log.warning(
                        "alert %s/%s to %s failed (attempt %d of %d): %s; retry in %.0fs",
                        *(row.group, row.rule, where, attempts, alerts.webhook_attempts),
                        *(error, retry - now),
                    )
                    await self._record(row.id, now, False, f"{where}: {error}", retry)
                    counts["retry"] += 1
        finally:
            if transport is not None:
                await transport.aclose()
        return counts

    async def _record(
        self, delivery_id: int, now: float, ok: bool, note: str, retry_at: float | None = None
    ) -> None:
        await asyncio.to_thread(
            self._store.record_attempt,
            delivery_id,
            now=now,
            delivered=ok,
            error=note,
            retry_at=retry_at,
        )

    async def _dead(self, row: AlertDelivery, now: float, why: str) -> None:
        await self._record(row.id, now, False, why)
        text = f"alert {row.rule} ({row.state}) for {row.group} was not delivered: {why}"
        await self._events.emit(
            row.group, None, "alert_undelivered", text, rule=row.rule, delivery=row.id
        )

    def _log_message(self, row: AlertDelivery, g: GroupSpec) -> None:
        p = row.payload
        level = logging.WARNING if row.state == "firing" else logging.INFO
        log.log(
            level,
            "%s | group=%s owner=%s rule=%s channel=%s",
            p.get("text", row.rule),
            row.group,
            g.owner,
            row.rule,
            redact_channel(g.alert_channel),
            extra={"alert": {"group": row.group, "owner": g.owner, "rule": row.rule}},
        )

    async def run_delivery(
        self, spec: Callable[[], PlatformSpec], clock: Clock, interval_s: float = 1.0
    ) -> None:
        """Deliver due messages every `interval_s` until cancelled; a failed pass is
        logged and the loop goes on."""
        while True:
            try:
                await self.deliver_due(spec(), clock.now())
            except Exception as exc:
                log.warning("alert delivery pass failed: %s: %s", type(exc).__name__, exc)
            await asyncio.sleep(interval_s)

    # --- reading -----------------------------------------------------------------------

    def firing(self, group: str | None = None) -> list[dict[str, Any]]:
        """The pending and firing alerts, firing first, oldest first."""
        spec = self._last_spec
        out = []
        for s in sorted(self._states.values(), key=lambda s: (s.phase != "firing", s.since)):
            if group is not None and s.group != group:
                continue
            g = spec.group(s.group) if spec is not None else None
            out.append({**s.to_json(), "owner": g.owner if g else "unknown"})
        return out

    def knows(self, group: str) -> bool:
        return any(s.group == group for s in self._states.values()) or any(
            p["group"] == group for p in self._recent
        )

    async def report(self, spec: PlatformSpec, group: str | None = None) -> dict[str, Any]:
        """What `GET /v1/alerts` answers: firing and pending alerts, the latest
        transitions, and the messages not delivered yet (waiting or dead-lettered)."""
        rows = await asyncio.to_thread(
            self._store.list_deliveries, group=group, undelivered=True, limit=100
        )
        current = self.firing(group)
        recent = [p for p in self._recent if group is None or p["group"] == group]
        return {
            "firing": [a for a in current if a["phase"] == "firing"],
            "pending": [a for a in current if a["phase"] == "pending"],
            "recent": list(reversed(recent))[:50],
            "undelivered": [{**r.to_json(), "dead": r.dead_at is not None} for r in rows],
            "starting": [
                {
                    "group": name,
                    "since": s.since,
                    "until": s.until,
                    "held": "no-ready-instance: its first instances are still starting",
                }
                for name, s in sorted(self._starting.items())
                if group is None or name == group
            ],
        }

    def prometheus_text(self) -> bytes:
        """`sluice_alert_firing{group,rule,severity}`: 1 per firing alert."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_AlertCollector(self._states))
        return generate_latest(registry)


class _AlertCollector(Collector):
    def __init__(self, states: Mapping[Key, AlertState]) -> None:
        self._states = states

    def collect(self) -> Iterator[GaugeMetricFamily]:
        firing = GaugeMetricFamily(
            "sluice_alert_firing",
            "1 for each firing Sluice alert, by group, rule and severity.",
            labels=["group", "rule", "severity"],
        )
        for (group, rule), s in sorted(self._states.items()):
            if s.phase == "firing":
                firing.add_metric([group, rule, s.severity], 1)
        yield firing


async def _post(
    transport: httpx.AsyncHTTPTransport, url: str, payload: dict[str, Any], alerts: AlertsSpec
) -> str | None:
    """POST `payload` as JSON; None if a 2xx answered, else what went wrong (no URL in
    it). Redirects are not followed: a 3xx is a failure."""
    body = json.dumps(payload).encode()
    try:
        request = httpx.Request(
            "POST",
            url,
            content=body,
            headers={"content-type": "application/json", "user-agent": "sluice-alerts"},
            extensions={"timeout": httpx.Timeout(alerts.webhook_timeout_s).as_dict()},
        )
        response = await transport.handle_async_request(request)
        try:
            await response.aread()
        finally:
            await response.aclose()
    except (httpx.HTTPError, httpx.InvalidURL, ValueError, OSError) as exc:
        return _scrub(f"{type(exc).__name__}: {exc}", url)
    if 200 <= response.status_code < 300:
        return None
    return f"HTTP {response.status_code}"
