"""`sluice/policy` is pure (DESIGN: "no asyncio, I/O, time.* or global random: time and a
seeded Random come in as arguments"). import-linter keeps asyncio, HTTP and SQL out; this
AST check catches what an import list cannot: a clock read (`time.*`, `datetime.now`), the
environment (`os.environ`, `os.getenv`), file I/O (`open(`, `Path.read_text` ...) and the
module-level random generators (`random.random()`, `np.random.choice(...)`), however the
names were imported. A seeded generator passed in is fine: `random.Random(seed)`,
`np.random.default_rng(seed)`, `np.random.Generator` as a type.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sluice.policy

POLICY = Path(sluice.policy.__file__).parent

CLOCK = {
    "datetime.datetime.now",
    "datetime.datetime.utcnow",
    "datetime.datetime.today",
    "datetime.date.today",
}
ENVIRONMENT = {"os.environ", "os.environb", "os.getenv", "os.getenvb", "os.putenv", "os.urandom"}
OPEN_CALLS = {"open", "io.open", "os.open", "os.fdopen", "codecs.open"}
FILE_METHODS = {"read_text", "write_text", "read_bytes", "write_bytes", "open"}
RANDOM_OK = {"random.Random"}
NUMPY_RANDOM_OK = {
    "numpy.random.default_rng",
    "numpy.random.Generator",
    "numpy.random.SeedSequence",
    "numpy.random.BitGenerator",
    "numpy.random.PCG64",
    "numpy.random.PCG64DXSM",
    "numpy.random.Philox",
    "numpy.random.SFC64",
    "numpy.random.MT19937",
}
SEEDED = {"random.Random", "numpy.random.default_rng"}
"""Constructors that take their seed from the OS when called without one."""
OS_RANDOM = {"uuid.uuid1", "uuid.uuid4", "secrets"}


def _chain(node: ast.expr) -> list[str] | None:
    """`a.b.c` as ["a", "b", "c"]; None when the chain does not end in a plain name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


class _Checker(ast.NodeVisitor):
    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}
        """local name -> the dotted name it stands for (`np` -> `numpy`)."""
        self.found: list[tuple[int, str]] = []

    def run(self, tree: ast.Module) -> list[tuple[int, str]]:
        for node in ast.walk(tree):  # imports anywhere (function-level too) bind names
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.aliases[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        self.aliases[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        self.visit(tree)
        return sorted(set(self.found))

    def _flag(self, node: ast.AST, message: str) -> None:
        self.found.append((getattr(node, "lineno", 0), message))

    def _resolve(self, parts: list[str]) -> str | None:
        base = self.aliases.get(parts[0])
        return None if base is None else ".".join([base, *parts[1:]])

    def _check_name(self, node: ast.AST, dotted: str) -> None:
        if dotted == "time" or dotted.startswith("time."):
            self._flag(node, f"reads the clock or sleeps: {dotted} (take `now` as an argument)")
        elif dotted in CLOCK:
            self._flag(node, f"reads the clock: {dotted} (take `now` as an argument)")
        elif any(dotted == e or dotted.startswith(e + ".") for e in ENVIRONMENT):
            self._flag(node, f"reads the environment: {dotted} (take settings as arguments)")
        elif dotted == "random" or (dotted.startswith("random.") and dotted not in RANDOM_OK):
            self._flag(node, f"module-level random: {dotted} (take a seeded random.Random)")
        elif dotted == "numpy.random" or (
            dotted.startswith("numpy.random.") and dotted not in NUMPY_RANDOM_OK
        ):
            self._flag(node, f"module-level numpy random: {dotted} (take a Generator)")
        elif any(dotted == r or dotted.startswith(r + ".") for r in OS_RANDOM):
            self._flag(node, f"randomness from the OS: {dotted} (take a seeded generator)")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == "time" or alias.name.startswith("time."):
                self._flag(node, "imports time: a clock read waits here (take `now` instead)")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            return
        for alias in node.names:
            self._check_name(node, f"{node.module}.{alias.name}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        parts = _chain(node)
        if parts is None:
            self.generic_visit(node)
            return
        dotted = self._resolve(parts)
        if dotted is not None:
            self._check_name(node, dotted)
        # the whole chain is judged at once: `np.random.default_rng` is fine although
        # `np.random` alone (the module-level generator handed around) is not

    def visit_Name(self, node: ast.Name) -> None:
        dotted = self.aliases.get(node.id)
        if dotted is not None and isinstance(node.ctx, ast.Load):
            self._check_name(node, dotted)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        parts = _chain(func)
        dotted = None if parts is None else (self._resolve(parts) or ".".join(parts))
        if dotted in OPEN_CALLS:
            self._flag(node, f"file I/O: {dotted}(...)")
        elif isinstance(func, ast.Attribute) and func.attr in FILE_METHODS:
            self._flag(node, f"file I/O: .{func.attr}(...)")
        if dotted in SEEDED and not node.args and not node.keywords:
            self._flag(node, f"unseeded generator: {dotted}() (pass the seed in)")
        self.generic_visit(node)


def check_source(source: str, filename: str = "<string>") -> list[str]:
    """Every impurity in one module's source, as "FILE:LINE: what"."""
    tree = ast.parse(source, filename)
    return [f"{filename}:{line}: {message}" for line, message in _Checker().run(tree)]


def test_policy_reads_no_clock_environment_files_or_global_random() -> None:
    modules = sorted(POLICY.rglob("*.py"))
    assert len(modules) > 20  # the walk found the package
    found = [
        hit
        for path in modules
        for hit in check_source(path.read_text(encoding="utf-8"), str(path.relative_to(POLICY)))
    ]
    assert not found, "sluice/policy must stay pure:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "import time\n",
        "import time as t\nx = t.monotonic()\n",
        "from time import perf_counter\n",
        "from time import sleep as nap\nnap(1)\n",
        "from datetime import datetime\nx = datetime.now()\n",
        "from datetime import datetime as D\nx = D.utcnow()\n",
        "import datetime\nx = datetime.date.today()\n",
        "import datetime as dt\nx = dt.datetime.now(dt.UTC)\n",
        "from datetime import date\nx = date.today()\n",
        "import os\nx = os.environ['HOME']\n",
        "import os\nx = os.environ.get('HOME')\n",
        "import os\nx = os.getenv('HOME')\n",
        "from os import environ\n",
        "x = open('f').read()\n",
        "def f(p):\n    return p.read_text()\n",
        "from pathlib import Path\nx = Path('f').write_bytes(b'')\n",
        "import random\nx = random.random()\n",
        "import random\nx = random.choice([1, 2])\n",
        "import random as r\nr.shuffle([1])\n",
        "import random\ndef f(rng=random):\n    return rng\n",
        "from random import choice\n",
        "from random import Random\nrng = Random()\n",
        "import numpy as np\nx = np.random.random()\n",
        "import numpy as np\nx = np.random.choice([1, 2])\n",
        "import numpy\nnumpy.random.seed(1)\n",
        "from numpy import random as npr\nx = npr.normal()\n",
        "import numpy.random as npr\nx = npr.normal()\n",
        "from numpy.random import choice\n",
        "import numpy as np\nrng = np.random.default_rng()\n",
        "import uuid\nx = uuid.uuid4()\n",
    ],
)
def test_the_check_catches(source: str) -> None:
    assert check_source(source), f"not caught:\n{source}"


@pytest.mark.parametrize(
    "source",
    [
        "from random import Random\ndef f(seed):\n    return Random(seed).random()\n",
        "import random\ndef f(rng: random.Random):\n    return rng.choice([1])\n",
        "import random\nrng = random.Random(7)\n",
        "import numpy as np\nrng = np.random.default_rng(7)\nx = rng.normal()\n",
        "import numpy as np\ndef f(rng: np.random.Generator):\n    return rng.random()\n",
        "from datetime import UTC, datetime\nx = datetime.fromtimestamp(0.0, tz=UTC)\n",
        "def f(now: float, time: float):\n    return now - time\n",
        "import math\nx = math.sqrt(2.0)\n",
    ],
)
def test_the_check_lets_pure_code_through(source: str) -> None:
    assert check_source(source) == []


def test_a_violation_names_file_and_line() -> None:
    found = check_source("import math\n\nimport time\n", "policy/x.py")
    assert found and found[0].startswith("policy/x.py:3: ")
