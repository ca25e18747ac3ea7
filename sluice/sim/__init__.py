"""Trace-driven simulator: the real policy code against simulated instances and a virtual clock."""

from sluice.sim.causal import CausalCandidate, CausalResult, WindowPlanPolicy, causal
from sluice.sim.engine import EPOCH, SimOptions, SimResult, Workload, make_policy, prepare, run
from sluice.sim.families import FAMILIES, Family, generate
from sluice.sim.fleet import FleetOptions, run_fleet
from sluice.sim.fleet_inputs import with_pool_counts
from sluice.sim.fleet_report import FleetGroup, FleetResult, write_fleet_report
from sluice.sim.model import SERVICE_MAX_S, SERVICE_MIN_S, InstanceModel, pick_group
from sluice.sim.oracle import OracleResult, PlanPolicy, best_fixed, oracle, work_floor
from sluice.sim.report import write_report
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

__all__ = [
    "EPOCH",
    "FAMILIES",
    "GROUP_COLUMN",
    "REQUIRED_COLUMNS",
    "SERVICE_MAX_S",
    "SERVICE_MIN_S",
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
    "simulate_spec",
    "trace_from_rows",
    "warm_start",
    "warm_start_count",
    "with_pool_counts",
    "work_floor",
    "write_fleet_report",
    "write_report",
]
