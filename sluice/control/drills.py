"""Scheduled drills (O5): the spec's `drills:` run on their crons, each as a `sluice drill`.

Every few seconds the scheduler asks `policy.drills.due_firing` whether a drill is
due. A due firing runs as its own `python -m sluice drill ...` process: the peak's load and
its per-second readings stay off the control plane's event loop, and the run is the same
code, judged the same way and stored through the same API as one an operator starts. The
process gets a token minted for that run alone (role operator, scoped to the one group,
expiring soon after the drill's planned end, deleted when it ends) and the tenant key the
entry names, read on this machine when it fires; neither is stored or logged. Each firing
is a `drill_fires` row: running, then passed/failed/error, or missed/skipped with why. A
firing found running at start (the control plane stopped mid-drill) is closed as an error
and its token deleted.

The token goes once the firing's row is finished (the run's report is stored by then, and
the row keeps the token's name): deleted rather than revoked, so that a drill on a minute's
cron leaves no token behind in `sluice token list`. Retention deletes the token of any
finished firing that a stop kept from it (`RetentionStore.prune_tokens`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import orjson

from sluice.control.auth import Role
from sluice.control.events import EventLog
from sluice.control.keysources import read_secret_file
from sluice.control.tokens import DRILL_PREFIX, TokenAdmin
from sluice.core import Clock, Conflict, NotFound
from sluice.policy.drills import due_firing, next_firing
from sluice.spec import PlatformSpec
from sluice.spec.drills import DrillSchedule
from sluice.spec.keys import key_digest
from sluice.store import DrillFire
from sluice.store.ports import DrillRecords

__all__ = ["DrillScheduler", "drill_named"]

log = logging.getLogger(__name__)

Audit = Callable[[str, str, str, str, dict[str, Any]], Awaitable[None]]

TICK_S = 5.0
"""How often due firings are looked for: a drill starts within this of its minute."""
SLACK_S = 180.0
"""Beyond the load's own length, what a drill's process may take (planning, reading the
decisions afterwards, storing the report) before it is stopped as an error."""
MAX_REPORT_BYTES = 16 * 1024 * 1024
STDERR_TAIL = 2000


def drill_named(spec: PlatformSpec, name: str) -> DrillSchedule:
    """The spec's scheduled drill `name`; NotFound naming the ones there are."""
    d = next((x for x in spec.drills if x.name == name), None)
    if d is None:
        known = ", ".join(x.name for x in spec.drills) or "none defined"
        raise NotFound(f"no scheduled drill named {name!r} (drills: {known})", drill=name)
    return d


class DrillScheduler:
    def __init__(
        self,
        store: DrillRecords,
        tokens: TokenAdmin,
        events: EventLog,
        audit: Audit,
        clock: Clock,
        *,
        home: Path,
        control_url: str,
        endpoint: str,
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        self._store = store
        self._tokens = tokens
        self._events = events
        self._audit = audit
        self._clock = clock
        self._home = home
        self._urls = (control_url, endpoint)
        self._environ = environ
        self._since: dict[str, float] = {}
        self._started_at = clock.now()
        self._running: dict[int, tuple[DrillSchedule, asyncio.Task[None]]] = {}
        self._claimed: dict[str, str] = {}
        """group -> the drill starting or running on it (one at a time per group)"""

    async def load(self) -> None:
        """Where each schedule's next look starts, and close what a stop left running."""
        self._since = await asyncio.to_thread(self._store.last_cron_firings)
        stale = await asyncio.to_thread(self._store.list_drill_fires, status="running", limit=1000)
        for fire in stale:
            why = "the control plane stopped while the drill ran; its report, if any, is stored"
            await self._close(fire.id, fire.token, "error", None, {"error": why}, "sluice up")

    async def run(self, spec: Callable[[], PlatformSpec]) -> None:
        while True:
            await self.tick(spec(), self._clock.now())
            await asyncio.sleep(TICK_S)

    async def tick(self, spec: PlatformSpec, now: float) -> None:
        """Fire (or record as missed) every drill whose cron came due."""
        for d in spec.drills:
            if not d.enabled:
                continue
            since = self._since.get(d.name, self._started_at)
            due = due_firing(
                d.cron,
                d.timezone,
                since=since,
                now=now,
                starting_deadline_s=d.starting_deadline_s,
            )
            if due is None:
                continue
            self._since[d.name] = due.at
            actor = f"schedule/{d.name}"
            if due.missed:
                why = (
                    f"found {due.late_s:.0f} s after its time, past starting_deadline_s "
                    f"({d.starting_deadline_s:g} s): not run late"
                )
                await self._record(d, "cron", actor, due.at, "missed", {"reason": why})
                continue
            with contextlib.suppress(Conflict):  # skipped: recorded by fire
                await self.fire(spec, d.name, "cron", actor, due.at)

    async def fire(
        self, spec: PlatformSpec, name: str, trigger: str, actor: str, due_at: float
    ) -> dict[str, Any]:
        """Start drill `name` now; its firing row. Conflict when a drill on the group still
        runs (the firing is recorded as skipped), NotFound for an unknown schedule."""
        d = drill_named(spec, name)
        busy = self._claimed.get(d.group)
        if busy is not None:
            why = f"drill {busy!r} still runs on group {d.group!r}: one drill at a time"
            await self._record(d, trigger, actor, due_at, "skipped", {"reason": why})
            raise Conflict(why, drill=name)
        self._claimed[d.group] = d.name  # before any await: a second firing sees it
        try:
            return await self._start(spec, d, trigger, actor, due_at)
        finally:
            if not any(s.group == d.group for s, _ in self._running.values()):
                self._claimed.pop(d.group, None)

    async def _start(
        self, spec: PlatformSpec, d: DrillSchedule, trigger: str, actor: str, due_at: float
    ) -> dict[str, Any]:
        key, problem = self._tenant_key(spec, d)
        if key is None:
            fire_id = await self._record(d, trigger, actor, due_at, "error", {"error": problem})
            return (await self._fire_row(fire_id)).to_json()
        now = self._clock.now()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        token_name = f"{DRILL_PREFIX}{d.name}.{stamp}.{secrets.token_hex(2)}"
        token, _ = await self._tokens.create(
            token_name, Role.OPERATOR, [d.group], d.duration_s + SLACK_S + 60.0, by=actor
        )
        fire_id = await self._record(
            d, trigger, actor, due_at, "running", {"args": d.drill_args()}, token=token_name
        )
        await self._audit(
            actor,
            "drill-start",
            f"group/{d.group}",
            f"scheduled drill {d.name} ({trigger})",
            {"fire": fire_id, "token": token_name},
        )
        await self._events.emit(
            d.group, None, "drill", f"scheduled drill {d.name} started ({trigger}, by {actor})"
        )
        task = asyncio.create_task(self._drive(fire_id, d, token_name, token, key))
        self._running[fire_id] = (d, task)

        def done(_: asyncio.Task[None]) -> None:
            self._running.pop(fire_id, None)
            self._claimed.pop(d.group, None)

        task.add_done_callback(done)
        return (await self._fire_row(fire_id)).to_json()

    async def close(self) -> None:
        """Stop running drills (their firings close as errors, their tokens deleted)."""
        tasks = [task for _, task in self._running.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def schedules(self, spec: PlatformSpec, now: float) -> list[dict[str, Any]]:
        """Each schedule with its next firing and whether it runs now."""
        running = {d.name: fire_id for fire_id, (d, _) in self._running.items()}
        return [
            {
                "name": d.name,
                "group": d.group,
                "cron": d.cron,
                "timezone": d.timezone,
                "enabled": d.enabled,
                "next_at": next_firing(d.cron, d.timezone, now) if d.enabled else None,
                "running_fire": running.get(d.name),
                "duration_s": d.duration_s,
                "args": d.drill_args(),
            }
            for d in spec.drills
        ]

    # -- one firing ------------------------------------------------------------------------

    def _tenant_key(self, spec: PlatformSpec, d: DrillSchedule) -> tuple[str | None, str]:
        """The key the entry names, if it is a tenant's; else None and why (no key text)."""
        where = f"${d.api_key_env}" if d.api_key_env else f"file {d.api_key_file}"
        if d.api_key_env:
            key = self._environ.get(d.api_key_env, "").strip()
        else:
            assert d.api_key_file is not None
            try:  # bounded and non-blocking: this runs on the event loop
                key = read_secret_file(d.api_key_file).strip()
            except UnicodeDecodeError:
                return None, f"the drill's key file {d.api_key_file} is not UTF-8 text"
            except OSError as exc:
                return None, f"cannot read the drill's key from {where}: {exc.strerror}"
        if not key:
            return None, f"no tenant key in {where} on the controller's machine"
        digest = key_digest(key)
        if not any(digest == dg for t in spec.tenants for _, dg in t.key_digests()):
            return None, f"the key in {where} is no tenant's key in the live spec"
        return key, ""

    async def _drive(
        self, fire_id: int, d: DrillSchedule, token_name: str, token: str, key: str
    ) -> None:
        status, run_id, detail = "error", None, dict[str, Any]()
        try:
            status, run_id, detail = await self._spawn(d, token, key)
        except asyncio.CancelledError:
            detail = {"error": "the control plane stopped during the drill"}
            raise
        except Exception as exc:  # recorded; the scheduler goes on with the next drill
            log.exception("scheduled drill %s", d.name)
            detail = {"error": f"the drill could not run: {exc!r}"[:STDERR_TAIL]}
        finally:
            await asyncio.shield(
                self._close(fire_id, token_name, status, run_id, detail, f"schedule/{d.name}")
            )
            verdict = detail.get("verdict", status)
            await self._events.emit(
                d.group, None, "drill", f"scheduled drill {d.name} ended: {verdict}"
            )

    async def _spawn(
        self, d: DrillSchedule, token: str, key: str
    ) -> tuple[str, int | None, dict[str, Any]]:
        control_url, endpoint = self._urls
        env = {k: v for k, v in self._environ.items() if k not in ("SLUICE_TOKEN",)}
        env.update(SLUICE_TOKEN=token, SLUICE_API_KEY=key, SLUICE_HOME=str(self._home))
        argv = [sys.executable, "-m", "sluice", "drill", *d.drill_args()]
        argv += ["--control", control_url, "--endpoint", endpoint, "--json"]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,  # its own process group: a stop takes the whole drill
        )
        limit = d.duration_s + SLACK_S
        try:
            async with asyncio.timeout(limit):
                out, err = await proc.communicate()
        except (TimeoutError, asyncio.CancelledError) as exc:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            if isinstance(exc, asyncio.CancelledError):
                raise
            return "error", None, {"error": f"the drill ran past {limit:.0f} s and was stopped"}
        tail = err.decode(errors="replace")[-STDERR_TAIL:]
        try:
            doc = orjson.loads(out) if len(out) <= MAX_REPORT_BYTES else None
        except orjson.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict):
            why = f"the drill exited {proc.returncode} without a report"
            return "error", None, {"error": why, "exit_code": proc.returncode, "stderr": tail}
        if "error" in doc:
            message = str(doc["error"].get("message", doc["error"]))[:STDERR_TAIL]
            return "error", None, {"error": message, "exit_code": proc.returncode}
        verdict = str(doc.get("judgement", {}).get("verdict", "inconclusive"))
        status = {"pass": "passed", "fail": "failed"}.get(verdict, verdict)
        stored = doc.get("stored") or {}
        detail = {
            "verdict": verdict,
            "reasons": doc.get("judgement", {}).get("reasons", []),
            "milestones": doc.get("judgement", {}).get("milestones", {}),
            "exit_code": proc.returncode,
            "handed_back": doc.get("handed_back"),
        }
        return status, stored.get("id"), detail

    async def _close(
        self,
        fire_id: int,
        token_name: str | None,
        status: str,
        run_id: int | None,
        detail: dict[str, Any],
        actor: str,
    ) -> None:
        """Finish the firing's row (the run is archived), then delete its token: the drill
        is over either way, and a kept token would pile up (one a minute on a minute's
        cron)."""
        now = self._clock.now()
        await asyncio.to_thread(
            self._store.finish_drill_fire,
            fire_id,
            status=status,
            run_id=run_id,
            detail=detail,
            now=now,
        )
        if token_name is not None:
            why = f"drill firing {fire_id} is over ({status}): its token has no use left"
            await self._tokens.delete(token_name, by=actor, reason=why)

    async def _record(
        self,
        d: DrillSchedule,
        trigger: str,
        actor: str,
        due_at: float,
        status: str,
        detail: dict[str, Any],
        token: str | None = None,
    ) -> int:
        """A firing's row; one that will not run (missed, skipped, error) is an event too."""
        fire_id = await asyncio.to_thread(
            self._store.add_drill_fire,
            schedule=d.name,
            group=d.group,
            trigger=trigger,
            actor=actor,
            due_at=due_at,
            status=status,
            now=self._clock.now(),
            detail=detail,
            token=token,
        )
        if status != "running":
            why = detail.get("reason") or detail.get("error") or ""
            message = f"scheduled drill {d.name} {status}: {why}"
            await self._events.emit(d.group, None, "drill", message)
        return fire_id

    async def _fire_row(self, fire_id: int) -> DrillFire:
        return await asyncio.to_thread(self._store.get_drill_fire, fire_id)
