"""The compiled build of the decision kernel (pyproject.toml holds everything else).

`SLUICE_COMPILE=1 pip install --no-build-isolation .` (mypy, which brings mypyc, and a C
compiler installed) compiles the modules `[tool.sluice] compiled` names with mypyc: the
autoscaler, the tick, quota and the kernel, ~1.5x faster a tick with the same decisions
(bench/decide.py, `make native`). Without the variable the package is pure Python, as an
editable install for development always is (a compiled module beside its source would
shadow every edit of it).
"""

from __future__ import annotations

import os
import tomllib
from typing import Any

from setuptools import setup

ext_modules: list[Any] = []
if os.environ.get("SLUICE_COMPILE") == "1":
    from mypyc.build import mypycify

    with open("pyproject.toml", "rb") as f:
        compiled = tomllib.load(f)["tool"]["sluice"]["compiled"]
    ext_modules = mypycify(compiled, opt_level="3")

setup(ext_modules=ext_modules)
