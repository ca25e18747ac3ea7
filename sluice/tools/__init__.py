"""Operator tools that drive a running fleet from outside: compare (C5), and later loadtest,
drill and reports. They speak HTTP to gateways and instances and import no server code."""

from sluice.tools.compare import SCHEMA, CompareOptions, Target, compare, load_suite, parse_target
from sluice.tools.compare_report import write_compare_report

__all__ = [
    "SCHEMA",
    "CompareOptions",
    "Target",
    "compare",
    "load_suite",
    "parse_target",
    "write_compare_report",
]
