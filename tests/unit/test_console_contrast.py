"""The console's text colours against their backgrounds meet WCAG AA (4.5:1 for body text),
read from the stylesheet itself so a colour change that breaks contrast fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import sluice.control.console

CSS = (Path(sluice.control.console.__file__).parent / "static" / "console.css").read_text()
COLOURS = dict(re.findall(r"--([a-z]+): (#[0-9a-f]{6})", CSS))


def luminance(hex_colour: str) -> float:
    def channel(c: int) -> float:
        s = c / 255
        return s / 12.92 if s <= 0.03928 else ((s + 0.055) / 1.055) ** 2.4

    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def contrast(a: str, b: str) -> float:
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


@pytest.mark.parametrize(
    ("text", "background"),
    [
        (COLOURS["ink"], COLOURS["bg"]),
        (COLOURS["ink"], COLOURS["panel"]),
        (COLOURS["dim"], COLOURS["bg"]),
        (COLOURS["dim"], COLOURS["panel"]),
        (COLOURS["accent"], COLOURS["bg"]),
        (COLOURS["accent"], "#ddf4ff"),  # tags, the current rollout step
        (COLOURS["ok"], COLOURS["bg"]),
        (COLOURS["warn"], COLOURS["bg"]),
        (COLOURS["bad"], COLOURS["bg"]),
        (COLOURS["bad"], "#ffebe9"),  # error box
        ("#ffffff", COLOURS["accent"]),  # buttons
        ("#ffffff", COLOURS["bad"]),
        ("#ffffff", "#24292f"),  # the header bar
        ("#d0d7de", "#24292f"),  # its live stamp
        ("#ffffff", "#424a53"),  # the current page's tab
    ],
)
def test_text_contrast_is_at_least_aa(text: str, background: str) -> None:
    assert contrast(text, background) >= 4.5, (text, background)
