"""A routing snapshot as JSON, for gateways that run apart from the controller
(`sluice gateway`): the controller sends what it publishes to its own gateway, and a remote
gateway rebuilds the same `RoutingSnapshot` (its route table compiled again from the rules).

pydantic's TypeAdapter does the (de)serialization of the snapshot's dataclasses, checking
every field on the way in, so a gateway never swaps in a half-understood table. Tenants
travel as key digests, as they are held; no key is in a snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter

from sluice.policy.autoscale.base import TrafficSample
from sluice.policy.routing import (
    CanarySplit,
    Endpoint,
    GroupTraffic,
    RouteRule,
    RouteTable,
    RoutingSnapshot,
    TenantAccess,
)
from sluice.spec.models import GatewayLimits

__all__ = ["sample_from_json", "sample_to_json", "snapshot_from_json", "snapshot_to_json"]


@dataclass(frozen=True, slots=True)
class _Wire:
    version: int
    rules: tuple[RouteRule, ...]
    tenants_by_key: dict[str, TenantAccess]
    endpoints: dict[str, tuple[Endpoint, ...]]
    group_models: dict[str, frozenset[str]]
    all_models: frozenset[str]
    redirects: dict[str, str]
    traffic: dict[str, GroupTraffic]
    canaries: dict[str, CanarySplit]
    limits: GatewayLimits | None
    epoch: int = 0
    """the publishing leader's lease epoch (absent from an older controller's: 0)"""
    standby: dict[str, tuple[Endpoint, ...]] = field(default_factory=dict)
    """warm standby out of rotation (absent from an older controller's: none)"""
    sleeping: dict[str, tuple[Endpoint, ...]] = field(default_factory=dict)
    """sleeping standby a gateway may wake (absent from an older controller's: none)"""


_WIRE = TypeAdapter(_Wire)
_SAMPLE = TypeAdapter(TrafficSample)


def snapshot_to_json(snapshot: RoutingSnapshot) -> Any:
    wire = _Wire(
        version=snapshot.version,
        rules=snapshot.routes.rules,
        tenants_by_key=dict(snapshot.tenants_by_key),
        endpoints=dict(snapshot.endpoints),
        group_models=dict(snapshot.group_models),
        all_models=snapshot.all_models,
        redirects=dict(snapshot.redirects),
        traffic=dict(snapshot.traffic),
        canaries=dict(snapshot.canaries),
        limits=snapshot.limits,
        epoch=snapshot.epoch,
        standby=dict(snapshot.standby),
        sleeping=dict(snapshot.sleeping),
    )
    return _WIRE.dump_python(wire, mode="json")


def snapshot_from_json(doc: Any) -> RoutingSnapshot:
    """Raises pydantic's ValidationError on anything that is not a snapshot."""
    wire = _WIRE.validate_python(doc)
    return RoutingSnapshot(
        version=wire.version,
        routes=RouteTable(wire.rules),
        tenants_by_key=wire.tenants_by_key,
        endpoints=wire.endpoints,
        group_models=wire.group_models,
        all_models=wire.all_models,
        redirects=wire.redirects,
        traffic=wire.traffic,
        canaries=wire.canaries,
        limits=wire.limits,
        epoch=wire.epoch,
        standby=wire.standby,
        sleeping=wire.sleeping,
    )


def sample_to_json(sample: TrafficSample) -> Any:
    return _SAMPLE.dump_python(sample, mode="json")


def sample_from_json(doc: Any) -> TrafficSample:
    return _SAMPLE.validate_python(doc)
