"""Pure decisions shared by live and simulated runs: no I/O, no clock reads, no global random."""

from sluice.policy.admission import AdmissionStats, GroupAdmission, Offer
from sluice.policy.analysis import Analysis, Criterion, Prior, RequestSample, ResourceUse, analyze
from sluice.policy.backoff import CrashBackoff
from sluice.policy.balance import pick_affinity, pick_endpoint, slow_start_weight
from sluice.policy.canary_plan import RolloutPlan, StepPlan, plan_rollout
from sluice.policy.devices import DeviceGrant, DeviceHold, assign_devices
from sluice.policy.failover import failover_problem, stranded_failovers
from sluice.policy.health import ProbeRecord, record_probe
from sluice.policy.impact import Impact, LoggedRequest, Move, route_impact
from sluice.policy.latency import LatencyOutliers
from sluice.policy.outlier import Ejection, OutlierDetector
from sluice.policy.plan import Action, Drain, GroupTarget, Launch, Remove, plan_group
from sluice.policy.quota import (
    Allocation,
    Grant,
    GroupClaim,
    PoolState,
    QuotaState,
    Reclaim,
    RunningInstance,
    allocate,
    ledger_changes,
    underused_groups,
)
from sluice.policy.ratelimit import TokenBucket
from sluice.policy.reachability import Reachability
from sluice.policy.rollouts import (
    CanarySplit,
    RolloutPhase,
    RolloutState,
    StepRecord,
    Transition,
    split_for,
)
from sluice.policy.routing import (
    PRIORITIES,
    Endpoint,
    GroupTraffic,
    RequestMeta,
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
    "PRIORITIES",
    "Action",
    "AdmissionStats",
    "Allocation",
    "Analysis",
    "CanarySplit",
    "CrashBackoff",
    "Criterion",
    "DeviceGrant",
    "DeviceHold",
    "Drain",
    "Ejection",
    "Endpoint",
    "Grant",
    "GroupAdmission",
    "GroupClaim",
    "GroupTarget",
    "GroupTraffic",
    "Impact",
    "LatencyOutliers",
    "Launch",
    "LoggedRequest",
    "Move",
    "Offer",
    "OutlierDetector",
    "PoolState",
    "Prior",
    "ProbeRecord",
    "QuotaState",
    "Reachability",
    "Reclaim",
    "Remove",
    "RequestMeta",
    "RequestSample",
    "ResourceUse",
    "RolloutPhase",
    "RolloutPlan",
    "RolloutState",
    "Route",
    "RouteRule",
    "RouteTable",
    "RoutingSnapshot",
    "RunningInstance",
    "StepPlan",
    "StepRecord",
    "TenantAccess",
    "TokenBucket",
    "Transition",
    "allocate",
    "analyze",
    "api_key_digest",
    "assign_devices",
    "build_routing_snapshot",
    "failover_problem",
    "first_match",
    "ledger_changes",
    "pick_affinity",
    "pick_endpoint",
    "plan_group",
    "plan_rollout",
    "record_probe",
    "route_impact",
    "route_rules",
    "slow_start_weight",
    "split_for",
    "stranded_failovers",
    "underused_groups",
]
