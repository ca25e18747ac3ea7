"""Argv and environment templates of servers Sluice did not write: `{port}` and friends.

The spec checks a template when it is written (`placeholders_in`: a typo is a located error
at `validate`), the runtime fills it at launch (`render`). Braces follow `str.format`: `{{`
and `}}` are literal braces; a placeholder takes no conversion or format spec, so a template
means the same to the operator and to the code.
"""

from __future__ import annotations

import string
from collections.abc import Mapping

__all__ = ["PLACEHOLDERS", "placeholders_in", "render"]

PLACEHOLDERS: Mapping[str, str] = {
    "port": "the TCP port the runtime gave this instance",
    "host": "the address to listen on (the runtime's host, 127.0.0.1 locally)",
    "model": "the model id callers send (e.g. for vLLM's --served-model-name)",
    "model_path": "the model's `model_path` (a directory, a file or a hub id)",
    "gpu_ids": "the instance's device ids, comma-separated ('' when its pool pins none)",
}
"""Every name a template may use, and what it becomes."""

_FORMATTER = string.Formatter()


def placeholders_in(template: str) -> set[str]:
    """The placeholder names `template` uses; ValueError (with the fix) when one is unknown,
    malformed, or carries a conversion or format spec."""
    try:
        parsed = list(_FORMATTER.parse(template))
    except ValueError as exc:
        raise ValueError(
            f"{exc} in {template!r}; write a literal brace as '{{{{' or '}}}}'"
        ) from None
    names: set[str] = set()
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in PLACEHOLDERS:
            known = ", ".join("{" + k + "}" for k in PLACEHOLDERS)
            raise ValueError(f"unknown placeholder {{{name}}} in {template!r}; known: {known}")
        if spec or conversion:
            raise ValueError(
                f"placeholder {{{name}}} in {template!r} takes no conversion or format spec"
            )
        names.add(name)
    return names


def render(template: str, values: Mapping[str, str]) -> str:
    """`template` with each placeholder replaced by its value (pre: `placeholders_in` passed
    and `values` holds every name it found; KeyError otherwise)."""
    out: list[str] = []
    for literal, name, _, _ in _FORMATTER.parse(template):
        out.append(literal)
        if name is not None:
            out.append(values[name])
    return "".join(out)
