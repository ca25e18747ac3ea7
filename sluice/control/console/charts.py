"""Line charts of the metrics history as inline SVG, drawn on the server.

Server-side SVG rather than a JavaScript chart library: the charts work with scripts off,
need no vendored bundle to keep patched, and the live refresh just swaps the new markup in.
Presentation attributes only (no `style`), so the console's CSP can forbid inline styles.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from markupsafe import Markup, escape

__all__ = ["line_chart"]

_W, _H = 560, 160
_LEFT, _RIGHT, _TOP, _BOTTOM = 52, 10, 10, 24


def line_chart(
    points: Sequence[tuple[float, float | None]],
    *,
    label: str,
    start: float,
    end: float,
    fmt: Callable[[float], str],
) -> Markup:
    """`points` are (unix time, value or None for no data) in time order; gaps break the
    line. The y axis starts at 0 and ends a little above the largest value."""
    values = [v for _, v in points if v is not None]
    top = max(values) * 1.1 if values and max(values) > 0 else 1.0
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    span = max(end - start, 1.0)

    def xy(t: float, v: float) -> str:
        x = _LEFT + (t - start) / span * plot_w
        y = _TOP + plot_h - v / top * plot_h
        return f"{x:.1f},{y:.1f}"

    lines: list[list[str]] = []
    run: list[str] = []
    for t, v in points:
        if v is None:
            if run:
                lines.append(run)
            run = []
        else:
            run.append(xy(t, v))
    if run:
        lines.append(run)
    parts = [
        f'<svg class="chart" viewBox="0 0 {_W} {_H}" role="img" aria-label="{escape(label)}">',
        f"<title>{escape(label)}</title>",
    ]
    for share in (0.0, 0.5, 1.0):
        y = _TOP + plot_h - share * plot_h
        parts.append(
            f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
            'stroke="#d0d7de" stroke-width="1"/>'
            f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11" '
            f'fill="#424a53">{escape(fmt(top * share))}</text>'
        )
    for t, anchor in ((start, "start"), (end, "end")):
        x = _LEFT if anchor == "start" else _W - _RIGHT
        stamp = time.strftime("%H:%M", time.gmtime(t))
        if end - start > 86_000:
            stamp = time.strftime("%a %H:%M", time.gmtime(t))
        parts.append(
            f'<text x="{x}" y="{_H - 6}" text-anchor="{anchor}" font-size="11" '
            f'fill="#424a53">{stamp} UTC</text>'
        )
    for run in lines:
        if len(run) == 1:
            cx, cy = run[0].split(",")
            parts.append(f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="#0550ae"/>')
        else:
            parts.append(
                f'<polyline points="{" ".join(run)}" fill="none" stroke="#0550ae" '
                'stroke-width="2" stroke-linejoin="round"/>'
            )
    if not values:
        parts.append(
            f'<text x="{_LEFT + plot_w / 2:.0f}" y="{_TOP + plot_h / 2:.0f}" '
            'text-anchor="middle" font-size="13" fill="#424a53">no data in this span</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))
