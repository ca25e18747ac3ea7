"""Instances whose port refused a connection (or did not take one in time), for one group.

Outlier ejection (`outlier`) is for instances that answer badly: it waits for several
failures in a row, ejects at most a share of the group and, with everything ejected, uses
everything anyway (panic mode). An instance that cannot be connected to can serve nobody,
and the gateway learns that before anything was sent, so it is taken out of rotation at the
first refusal, with no cap and no panic: with every instance of a group unreachable the
group has nowhere to send a request, and its requests wait in its queue rather than fail
(what `sluice up` sees for the ~0.2-1 s between `kill -9` of every instance and the
controller publishing a table without them).

A mark lasts `retry_s`; then the instance is a candidate again, and the next connection
tells: a success clears the mark, a refusal renews it. Until a success it stays `suspect`,
so that a group whose every candidate is suspect is still known to be down.
"""

from __future__ import annotations

__all__ = ["RETRY_S", "Reachability"]

RETRY_S = 1.0
"""Seconds an instance that refused a connection stays out of rotation before it is tried
again: a retry costs one refused connect (well under a millisecond on a LAN), and a
controller notices a dead local instance within about a second anyway."""


class Reachability:
    """Connect failures per instance id. Times are the caller's monotonic seconds."""

    __slots__ = ("_failed", "retry_s")

    def __init__(self, retry_s: float = RETRY_S) -> None:
        self.retry_s = retry_s
        self._failed: dict[str, float] = {}  # instance id -> end of its mark, seconds

    def failed(self, instance_id: str, now: float) -> bool:
        """A connection to it failed at `now`; True if that changes which are unreachable
        (it was not marked, or its mark had run out)."""
        until = self._failed.get(instance_id)
        self._failed[instance_id] = now + self.retry_s
        return until is None or until <= now

    def connected(self, instance_id: str) -> bool:
        """A connection to it succeeded; True if it was marked or suspect."""
        return self._failed.pop(instance_id, None) is not None

    def unreachable(self, now: float) -> dict[str, float]:
        """Instances out of rotation at `now`, with the time their mark ends."""
        failed = self._failed
        if not failed:
            return {}
        return {iid: until for iid, until in failed.items() if until > now}

    def suspect(self, instance_id: str) -> bool:
        """Refused a connection, and none has succeeded since (marked or not any more)."""
        return instance_id in self._failed

    def forget(self, keep: set[str]) -> None:
        """Drop instances no longer in the group."""
        for iid in [i for i in self._failed if i not in keep]:
            del self._failed[iid]
