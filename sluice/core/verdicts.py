"""Exit codes of a command whose verdict is its answer (a drill, a load test against an SLO,
a compare against thresholds): the command ran and printed its report, and the code says
what the report concluded, so a scheduled job or CI step can tell without parsing it.

    0  pass            the verdict held
    8  verdict_failed  the verdict failed (the report says which criterion)
    9  inconclusive    the run could not judge (its own load generator fell behind)

They follow the error codes 1..7 (`sluice.core.errors`): an error means no verdict at all.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["EXIT_FAILED", "EXIT_INCONCLUSIVE", "Verdict", "verdict_exit"]

EXIT_FAILED = 8
EXIT_INCONCLUSIVE = 9

Verdict = Literal["pass", "fail", "inconclusive"]


def verdict_exit(verdict: str) -> int:
    """The exit code of `verdict` ("pass", "fail" or "inconclusive"); anything else is a
    verdict this command does not know, which never reads as a pass."""
    if verdict == "pass":
        return 0
    return EXIT_INCONCLUSIVE if verdict == "inconclusive" else EXIT_FAILED
