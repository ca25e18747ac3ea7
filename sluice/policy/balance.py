"""Pick the instance for one request: fewest outstanding requests, random among ties."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from sluice.policy.routing import Endpoint

__all__ = ["pick_least_outstanding"]


def pick_least_outstanding(
    candidates: Sequence[Endpoint],
    outstanding: Mapping[str, int],
    rng: random.Random,
    exclude: str | None = None,
) -> Endpoint | None:
    """The endpoint with the fewest in-flight requests (by instance id); ties broken by `rng`.

    `exclude` skips one instance (a retry goes elsewhere when it can). None if no candidate.
    """
    best: list[Endpoint] = []
    best_load = -1
    for ep in candidates:
        if ep.instance_id == exclude:
            continue
        load = outstanding.get(ep.instance_id, 0)
        if not best or load < best_load:
            best, best_load = [ep], load
        elif load == best_load:
            best.append(ep)
    if not best:
        return None if exclude is None or not candidates else candidates[0]
    return best[0] if len(best) == 1 else rng.choice(best)
