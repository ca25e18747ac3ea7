"""How the Sluice policy words a decision (S11): the sentence that opens each journaled
reason, naming the signal that set the count, its value and what it asked for."""

from __future__ import annotations

__all__ = ["lead_sentence"]


def lead_sentence(
    winner: str | None,
    signals: dict[str, float],
    proposals: dict[str, int],
    fallback: str,
) -> str:
    """The reason's opening sentence: what the signal that set the count saw and asked
    for (`fallback` when no load signal did)."""
    g = signals.get
    target = g("target_per_instance", 0.0)
    over = f"over target {target:.1f}/instance"
    if winner == "concurrency":
        return f"concurrency {g('concurrency', 0):.1f} {over} -> {proposals['concurrency']}"
    if winner == "steady":
        return (
            f"steady: rate {g('rate_steady', 0):.2f}/s (projected "
            f"{g('rate_projected', 0):.2f}/s in {g('lead_s', 0):.0f}s) x "
            f"{g('service_s', 0):.2f}s service = "
            f"{g('offered_load', 0):.1f} busy slots; {g('steady_slots', 0):.0f} slots keep "
            f"waits under {g('wait_allowance_s', 0):.1f}s -> {proposals['steady']}"
        )
    if winner == "queue":
        per = g("queue_per_instance", 0)
        return f"queue {g('queue', 0):.1f} ({per:.2f}/ready instance) -> {proposals['queue']}"
    if winner == "panic":
        return f"burst {g('burst', 0):.1f} {over} -> {proposals['panic']}"
    if winner == "envelope":
        return (
            f"burst envelope: the last {g('envelope_window_s', 0):.0f}s of arrivals need "
            f"{g('envelope_slots', 0):.1f} slots to wait under "
            f"{g('wait_allowance_s', 0):.1f}s -> {proposals['envelope']}"
        )
    if winner == "latency":
        lat = f"p95 {g('p95_ms', 0):.0f}ms over {g('p95_target_ms', 0):.0f}ms"
        return f"{lat} -> {proposals['latency']}"
    if winner in ("ttft", "tpot"):
        seen, target = g(f"{winner}_p95_ms", 0), g(f"{winner}_target_ms", 0)
        return f"{winner} p95 {seen:.0f}ms over target {target:.0f}ms -> {proposals[winner]}"
    if winner == "kv_cache":
        use, target = g("kv_cache_usage", 0), g("kv_cache_target", 0)
        return f"kv_cache {use:.2f} over target {target:g} -> {proposals['kv_cache']}"
    return fallback
