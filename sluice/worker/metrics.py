"""Prometheus metrics of one worker, in a registry of its own (not the process-global one).

A private registry keeps tests and several apps in one process from colliding, and makes
/metrics show exactly this instance.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["WorkerMetrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "sluice_worker_requests",
            "Inference requests finished, by model and HTTP status ('error': broke off on the "
            "instance's side; 'disconnected': the client went away first).",
            ["model", "status"],
            registry=self.registry,
        )
        self.inflight = Gauge(
            "sluice_worker_inflight",
            "Inference requests inside the worker, queued ones included.",
            registry=self.registry,
        )
        self.queued = Gauge(
            "sluice_worker_queued",
            "Inference requests waiting for a concurrency slot.",
            registry=self.registry,
        )
        self.latency = Histogram(
            "sluice_worker_request_seconds",
            "Inference request latency, queueing and streaming included.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.ready = Gauge(
            "sluice_worker_ready",
            "1 once every model of the instance is loaded.",
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
