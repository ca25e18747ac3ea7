"""The compiled build: the decision kernel and the gateway's request path (pyproject.toml
holds everything else).

`SLUICE_COMPILE=1 pip install --no-build-isolation .` compiles the modules
`[tool.sluice] compiled` names with mypyc: the autoscaler, the tick, quota and the kernel
(~0.7x the time of a tick), and the gateway's request path (~0.8x the CPU of a request),
deciding exactly as the pure Python does (bench/decide.py, bench/gateway.py, `make
native`). It needs a C compiler, and the package's dependencies and its `compile` extra
installed first: mypyc type-checks strictly. Without the variable the package is pure
Python, as an editable install for development always is (a compiled module beside its
source would shadow every edit of it).
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
