"""Pure decisions shared by live and simulated runs: no I/O, no clock reads, no global random."""

from sluice.policy.backoff import CrashBackoff
from sluice.policy.balance import pick_least_outstanding
from sluice.policy.health import ProbeRecord, record_probe
from sluice.policy.plan import Action, Drain, GroupTarget, Launch, Remove, plan_group
from sluice.policy.routing import (
    Endpoint,
    Route,
    RouteRule,
    RouteTable,
    RoutingSnapshot,
    TenantAccess,
    api_key_digest,
    first_match,
)
from sluice.policy.snapshot import build_routing_snapshot, route_rules

__all__ = [
    "Action",
    "CrashBackoff",
    "Drain",
    "Endpoint",
    "GroupTarget",
    "Launch",
    "ProbeRecord",
    "Remove",
    "Route",
    "RouteRule",
    "RouteTable",
    "RoutingSnapshot",
    "TenantAccess",
    "api_key_digest",
    "build_routing_snapshot",
    "first_match",
    "pick_least_outstanding",
    "plan_group",
    "record_probe",
    "route_rules",
]
