"""The CLI's Rich consoles, sized for where the output goes: a terminal's own width when
the stream is one, and no width limit when it is a pipe, a file or a CI log, so a table
there is never cut to 80 columns nor its cells ellipsized (`sluice get groups | cat` shows
whole rows). An explicit `$COLUMNS` wins either way."""

from __future__ import annotations

from rich.console import Console, ConsoleDimensions

__all__ = ["UNBOUNDED", "FittedConsole"]

UNBOUNDED = 100_000
"""The width of a console that is not a terminal: wider than any row a command prints
(a table takes only its content's width unless it expands; none here does)."""


class FittedConsole(Console):
    """A `Console` whose width is the terminal's when its stream is a terminal (not
    stdin's or stderr's when only those are: `sluice get groups | cat` in a terminal is a
    pipe), else unbounded; `$COLUMNS` or an explicit width win."""

    @property
    def size(self) -> ConsoleDimensions:
        dims = super().size
        columns = self._environ.get("COLUMNS")
        if self._width is None and not self.is_terminal and not (columns or "").isdigit():
            return ConsoleDimensions(UNBOUNDED, dims.height)
        return dims

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size
