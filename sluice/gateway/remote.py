"""A gateway that runs apart from the controller (`sluice gateway`, issue 21): once a second
it syncs with the control API (`POST /v1/gateways/{id}/sync`), pushing its per-group
counters and status, and swaps in the routing snapshot when the controller has a newer one
or gives it a new share of the slots.

For the groups under canary analysis whose servers keep no samples, the controller names
the groups to record in its answer; the gateway records their answers and sends the new
ones with each sync (status, latency, time to the first byte, size: never the text).

Until its first sync brings routes, the gateway is unready (`sluice.gateway.readiness`):
`/readyz` and every request answer 503 with `Retry-After`, never 401 (issue 33). When no
controller answers later (it is down, restarting, or a standby is taking over), the
gateway keeps serving the last good snapshot: the instances it routes to outlive the
controller, so requests keep flowing. It says so once per outage in its log, and again
when a controller answers; `/readyz`, `/healthz` and `/metrics` say the routes are stale
and how long since the last sync.

Rate limits hold fleet-wide (issue 31, `sluice.policy.rate_shares`): each sync pushes the
gateway's arrivals per limited tenant and its answer sets the gateway's share of each
tenant's rate. Without a controller the gateway keeps its last shares for `RATE_HOLD_S`
(the whole fleet usually lost it at once, and the shares still add up to each limit), then
enforces limit / n, n the number of gateways it last heard of: never the whole limit. An
answer without shares (a controller of before) gets limit / n too.

A gateway token names its gateway (issue 31): before it syncs, `sluice gateway` asks the
control API whose token it holds (`whoami`, while it already listens, unready), names
itself after it and checks an `--id` it was given against the rule, so a wrong id stops
it at start rather than at every sync.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import ValidationError

from sluice.core import Unauthorized, Unavailable
from sluice.gateway.server import Gateway, StaleRouting
from sluice.policy.rate_shares import RATE_HOLD_S, RateShare
from sluice.policy.snapshot_wire import sample_to_json, snapshot_from_json

__all__ = ["ControlSync", "Identity", "whoami"]

log = logging.getLogger("sluice.gateway.sync")

SYNC_PERIOD_S = 1.0
SYNC_TIMEOUT_S = 2.0
"""A controller that does not answer a sync within this is skipped for the next URL."""
MAX_SYNC_ROWS = 20_000
"""Recorded answers one sync carries at most (the controller refuses more); the rest go
with the next one."""
_ROW_FIELDS = (
    "at",
    "status",
    "latency_s",
    "ttft_s",
    "output_bytes",
    "output_tokens",
    "finish_reason",
    "tpot_s",
    "text",
)
WHOAMI_RETRY_S = 1.0
"""How often a gateway that does not know its name yet asks again: each second without it
is a second of 503s once a controller is back."""


@dataclass(frozen=True, slots=True)
class Identity:
    """The token's name and role, as the control API knows them (`GET /v1/whoami`)."""

    name: str
    role: str


async def whoami(
    controls: Sequence[str],
    token: str,
    *,
    verify: bool | str = True,
    timeout_s: float = SYNC_TIMEOUT_S,
    retry_s: float = WHOAMI_RETRY_S,
    wait_s: float | None = None,
    waiting: Callable[[str], None] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Identity:
    """Who the token is, from the first controller that answers; while none does (it is
    starting, a standby is taking over), ask again every `retry_s` (for ever, or `wait_s`),
    telling `waiting` why each round got no answer (the gateway listens meanwhile, unready:
    its readiness says why). A token the controller refuses raises `Unauthorized` at once.
    `transport`: httpx's (tests pass a `MockTransport`); None: the network."""
    headers = {"authorization": f"Bearer {token}"}
    started = time.monotonic()
    said = False
    async with httpx.AsyncClient(timeout=timeout_s, verify=verify, transport=transport) as client:
        while True:
            problems = []
            for control in controls:
                url = f"{control.rstrip('/')}/v1/whoami"
                try:
                    r = await client.get(url, headers=headers)
                except httpx.HTTPError as exc:
                    problems.append(f"{control}: {type(exc).__name__}")
                    continue
                if r.status_code in (401, 403):
                    raise Unauthorized(
                        f"the control API at {control} refused this gateway's token "
                        f"(HTTP {r.status_code}): {_message(r)}"
                    )
                try:
                    doc = r.json() if r.status_code == 200 else None
                    if isinstance(doc, dict):
                        return Identity(str(doc["name"]), str(doc["role"]))
                except (ValueError, KeyError):
                    pass
                problems.append(f"{control}: HTTP {r.status_code} {r.text[:200]}")
            why = "; ".join(problems)
            if waiting is not None:
                waiting(why)
            if wait_s is not None and time.monotonic() - started >= wait_s:
                raise Unavailable("no control API answered: " + why)
            if not said:
                log.warning(
                    "no controller answers yet (%s): asking again every %g s to learn this "
                    "gateway's name (unready until it syncs)",
                    why,
                    retry_s,
                )
                said = True
            await asyncio.sleep(retry_s)


def _message(r: httpx.Response) -> str:
    try:
        return str(r.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return r.text[:300]


class ControlSync:
    """The sync loop of one gateway process with the controllers at `controls` (the leader
    answers; a standby serves no API, so the next URL is tried)."""

    def __init__(
        self,
        gateway: Gateway,
        controls: Sequence[str],
        token: str,
        gateway_id: str,
        *,
        period_s: float = SYNC_PERIOD_S,
        timeout_s: float = SYNC_TIMEOUT_S,
        verify: bool | str = True,
    ) -> None:
        if not controls:
            raise ValueError("a remote gateway needs at least one control URL")
        self._gateway = gateway
        self._controls = [c.rstrip("/") for c in controls]
        self._headers = {"authorization": f"Bearer {token}"}
        self.gateway_id = gateway_id
        self._boot = secrets.token_hex(8)
        """counts start from zero in each process: a new boot id tells the controller"""
        self._period_s = period_s
        self._timeout_s = timeout_s
        self._verify = verify
        self._have: int | None = None
        self._share: tuple[int, int] | None = None
        self._current = 0
        self.last_ok: float | None = None
        self.synced = asyncio.Event()
        """set once the first snapshot is in: the gateway has something to route"""
        self._down_since: float | None = None
        self._sent: dict[str, int] = {}
        """per instance: the cursor of the last recorded answer a controller took"""
        self._refused: str | None = None
        """the last refusal logged (a refusal is logged once, not at every sync)"""
        self._rates_held = False
        """the controller's rate shares were given up for limit / n (`RATE_HOLD_S`)"""

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=self._timeout_s, verify=self._verify) as client:
            while True:
                started = time.monotonic()
                await self.sync_once(client)
                await asyncio.sleep(max(0.0, self._period_s - (time.monotonic() - started)))

    async def sync_once(self, client: httpx.AsyncClient) -> bool:
        """One sync with the first controller that answers; False: none did."""
        body, cursors = self._body()
        problems = []
        for k in range(len(self._controls)):
            i = (self._current + k) % len(self._controls)
            url = f"{self._controls[i]}/v1/gateways/{self.gateway_id}/sync"
            try:
                r = await client.post(url, json=body, headers=self._headers)
            except httpx.HTTPError as exc:
                problems.append(f"{self._controls[i]}: {type(exc).__name__}")
                continue
            if r.status_code != 200:
                problems.append(f"{self._controls[i]}: HTTP {r.status_code} {r.text[:200]}")
                if r.status_code in (401, 403, 503) and r.text != self._refused:
                    self._refused = r.text
                    log.error(
                        "the controller refused gateway %s's sync (HTTP %d): %s",
                        self.gateway_id,
                        r.status_code,
                        _message(r),
                    )
                continue
            try:
                self._take(r.json())
            except (ValueError, ValidationError, KeyError, TypeError) as exc:
                problems.append(f"{self._controls[i]}: a sync answer it cannot read ({exc})")
                continue
            self._current = i
            self._refused = None
            self._sent.update(cursors)
            self._gateway.readiness.synced(time.monotonic())
            self._recovered()
            return True
        why = "; ".join(problems)
        self._gateway.readiness.failed(why)
        self._lost(why)
        return False

    def _body(self) -> tuple[dict[str, Any], dict[str, int]]:
        """The sync's body, and the answer cursors that hold once a controller takes it."""
        samples, cursors = self._new_answers()
        body = {
            "boot": self._boot,
            "have": self._have,
            "have_epoch": self._gateway.snapshot_epoch if self._have is not None else None,
            "have_share": list(self._share) if self._share else None,
            "counters": {g: sample_to_json(s) for g, s in self._gateway.traffic().items()},
            "status": self._gateway.status(),
            "samples": samples,
            "arrivals": self._gateway.tenant_arrivals(),
        }
        return body, cursors

    def _new_answers(self) -> tuple[dict[str, list[dict[str, Any]]], dict[str, int]]:
        out: dict[str, list[dict[str, Any]]] = {}
        cursors: dict[str, int] = {}
        room = MAX_SYNC_ROWS
        for instance in self._gateway.sampled_instances():
            if room <= 0:
                break
            rows, cursor = self._gateway.samples(instance, self._sent.get(instance, 0), room)
            if rows:
                out[instance] = [{k: r[k] for k in _ROW_FIELDS} for r in rows]
                cursors[instance] = cursor
                room -= len(rows)
        return out, cursors

    def _take(self, answer: dict[str, Any]) -> None:
        """Take a sync answer; an answer of an older leader epoch than the routes served
        (a deposed controller that still answers) is refused whole (`StaleRouting`): the
        next controller is asked (issue 31)."""
        epoch, serving = answer.get("epoch"), self._gateway.snapshot_epoch
        if epoch is not None and int(epoch) < serving:
            raise StaleRouting(f"an answer of leader epoch {epoch}, older than {serving}")
        share = (int(answer["share"]["index"]), int(answer["share"]["count"]))
        self._gateway.sample_groups(str(g) for g in answer.get("sample_groups") or ())
        doc = answer.get("snapshot")
        if doc is not None:
            snapshot = snapshot_from_json(doc)
            self._gateway.update(snapshot)
            if self._have is None or share != self._share:
                log.info(
                    "routing snapshot v%d, share %d of %d gateways",
                    snapshot.version,
                    share[0] + 1,
                    share[1],
                )
            self._have, self._share = snapshot.version, share
            self.synced.set()
        if self._have is not None:  # the shares go with the routes they are of
            self._gateway.set_rate_shares(_rates(answer.get("rates")), share[1])
            self._rates_held = False
        self.last_ok = time.monotonic()

    def _lost(self, why: str) -> None:
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
            kept = "nothing yet" if self._have is None else f"snapshot v{self._have}"
            log.warning("no controller answers (%s): serving the last good one, %s", why, kept)
        last = self.last_ok if self.last_ok is not None else self._down_since
        if self._share is not None and not self._rates_held and now - last >= RATE_HOLD_S:
            count = self._share[1]
            self._gateway.set_rate_shares({}, count)
            self._rates_held = True
            log.warning(
                "no controller for %.0f s: each tenant's rate limit is now shared evenly "
                "among the %d gateway(s) last heard of, until one answers",
                now - last,
                count,
            )

    def _recovered(self) -> None:
        if self._down_since is not None:
            log.warning(
                "controller %s answers again after %.1f s",
                self._controls[self._current],
                time.monotonic() - self._down_since,
            )
            self._down_since = None


def _rates(doc: Any) -> dict[str, RateShare]:
    """The shares of a sync answer (`{tenant: {"rps", "burst"}}`); what is not a positive
    finite rate and a burst of at least one token is left out (that tenant: limit / n)."""
    out: dict[str, RateShare] = {}
    if not isinstance(doc, dict):
        return out
    for tenant, v in doc.items():
        try:
            rps, burst = float(v["rps"]), float(v["burst"])
        except (KeyError, TypeError, ValueError):
            continue
        if math.isfinite(rps) and math.isfinite(burst) and rps > 0.0 and burst >= 1.0:
            out[str(tenant)] = RateShare(rps, burst)
    return out
