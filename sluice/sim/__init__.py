"""Trace-driven simulator: the real policy code against simulated instances and a virtual clock."""

from sluice.sim.engine import EPOCH, SimOptions, SimResult, Workload, make_policy, prepare, run
from sluice.sim.families import FAMILIES, Family, generate
from sluice.sim.model import SERVICE_MAX_S, SERVICE_MIN_S, InstanceModel, pick_group
from sluice.sim.oracle import OracleResult, PlanPolicy, best_fixed, oracle, work_floor
from sluice.sim.report import write_report
from sluice.sim.study import simulate_spec
from sluice.sim.trace import REQUIRED_COLUMNS, Trace, load_trace, trace_from_rows

__all__ = [
    "EPOCH",
    "FAMILIES",
    "REQUIRED_COLUMNS",
    "SERVICE_MAX_S",
    "SERVICE_MIN_S",
    "Family",
    "InstanceModel",
    "OracleResult",
    "PlanPolicy",
    "SimOptions",
    "SimResult",
    "Trace",
    "Workload",
    "best_fixed",
    "generate",
    "load_trace",
    "make_policy",
    "oracle",
    "pick_group",
    "prepare",
    "run",
    "simulate_spec",
    "trace_from_rows",
    "work_floor",
    "write_report",
]
