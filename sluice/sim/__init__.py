"""Trace-driven simulator: the live controller's kernel and admission code against simulated
instances on a virtual clock; one loop (`sluice.sim.fleet`), a one-group study being a fleet
of one (`sluice.sim.single`)."""

from sluice.sim.batching import (
    LLAMA3_8B_H100,
    BatchingInstance,
    BatchingParams,
    simulate_instance,
)
from sluice.sim.causal import CausalCandidate, CausalResult, WindowPlanPolicy, causal
from sluice.sim.families import FAMILIES, Family, generate
from sluice.sim.fleet import FleetOptions, run_fleet
from sluice.sim.fleet_inputs import with_pool_counts
from sluice.sim.fleet_report import FleetGroup, FleetResult, write_fleet_report
from sluice.sim.model import SERVICE_MAX_S, SERVICE_MIN_S, InstanceModel, pick_group
from sluice.sim.oracle import OracleResult, PlanPolicy, best_fixed, oracle, work_floor
from sluice.sim.report import write_report
from sluice.sim.result import SimResult
from sluice.sim.single import SimOptions, make_policy, run
from sluice.sim.study import simulate_fleet_spec, simulate_spec
from sluice.sim.trace import (
    GROUP_COLUMN,
    REQUIRED_COLUMNS,
    Trace,
    load_group_traces,
    load_trace,
    trace_from_rows,
)
from sluice.sim.warm import WarmStart, warm_start, warm_start_count
from sluice.sim.workload import EPOCH, Workload, prepare

__all__ = [
    "EPOCH",
    "FAMILIES",
    "GROUP_COLUMN",
    "LLAMA3_8B_H100",
    "REQUIRED_COLUMNS",
    "SERVICE_MAX_S",
    "SERVICE_MIN_S",
    "BatchingInstance",
    "BatchingParams",
    "CausalCandidate",
    "CausalResult",
    "Family",
    "FleetGroup",
    "FleetOptions",
    "FleetResult",
    "InstanceModel",
    "OracleResult",
    "PlanPolicy",
    "SimOptions",
    "SimResult",
    "Trace",
    "WarmStart",
    "WindowPlanPolicy",
    "Workload",
    "best_fixed",
    "causal",
    "generate",
    "load_group_traces",
    "load_trace",
    "make_policy",
    "oracle",
    "pick_group",
    "prepare",
    "run",
    "run_fleet",
    "simulate_fleet_spec",
    "simulate_instance",
    "simulate_spec",
    "trace_from_rows",
    "warm_start",
    "warm_start_count",
    "with_pool_counts",
    "work_floor",
    "write_fleet_report",
    "write_report",
]
