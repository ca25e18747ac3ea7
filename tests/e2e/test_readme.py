"""The README's commands, read from the README itself and run as a newcomer runs them: its
first command starts `sluice up` on the quickstart, then every command of the quickstart
block runs against it and must succeed. The README cannot drift from the code."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import kill_workers_of

pytestmark = pytest.mark.embedding

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DEFAULT_ENDPOINT = "http://127.0.0.1:8080"


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)


def commands(block: str) -> list[str]:
    """One command per logical line: continuations joined, comments and blanks dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [c for c in (without_comment(line) for line in joined.splitlines()) if c]


def without_comment(line: str) -> str:
    """`line` up to a `#` that starts a shell comment (outside quotes, after a blank)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].strip()
    return line.strip()


def quickstart_block() -> str:
    marker = README.index("<!-- quickstart:")
    return bash_blocks(README[marker:])[0]


def test_the_top_commands_are_the_ones_ci_runs() -> None:
    install, tests = commands(bash_blocks(README)[0])
    assert (
        install == "pip install -e '.[embedding,dev,ray]' && sluice up -f examples/quickstart.yaml"
    )
    assert tests == "make test"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -q -e '.[embedding,dev,ray]'" in ci and "\nmake test\n" in ci


class Up:
    """The README's `sluice up -f examples/quickstart.yaml`, on a free port (8080 may be
    taken here), until its `ready:` line."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        install_and_up = commands(bash_blocks(README)[0])[0]
        up = install_and_up.split(" && ", 1)[1]
        self.proc = subprocess.Popen(
            ["bash", "-c", f"exec {up} --port 0"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self.endpoint = ""
        self._ready = threading.Event()
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("endpoint: "):
                self.endpoint = line.split(" ", 1)[1].strip()
            if line.startswith("ready: "):
                self._ready.set()

    def wait_ready(self, timeout: float) -> None:
        if not self._ready.wait(timeout):
            raise AssertionError("no `ready:` line:\n" + "".join(self.lines))

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)  # Ctrl-C, as the README says
        return self.proc.wait(60)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._pump_thread.join(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture
def quickstart(tmp_path: Path) -> Iterator[tuple[Up, dict[str, str]]]:
    home = tmp_path / "home"
    bin_dir = str(Path(sys.executable).parent)  # where `pip install` put `sluice`
    env = {
        **os.environ,
        "SLUICE_HOME": str(home),
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
    }
    up = Up(home, env)
    try:
        yield up, env
    finally:
        up.close()
        kill_workers_of(home)


def test_every_quickstart_command_works_as_shown(
    quickstart: tuple[Up, dict[str, str]], tmp_path: Path
) -> None:
    up, env = quickstart
    started = time.monotonic()
    up.wait_ready(240)
    assert up.lines[0].startswith("endpoint: ")
    ready = next(x for x in up.lines if x.startswith("ready: "))
    assert re.fullmatch(r"ready: chat 2/2, embed 1/1 in \d+\.\d s\n", ready), ready
    assert time.monotonic() - started < 240

    shown = commands(quickstart_block())
    assert len(shown) >= 10
    for command in shown:
        command = command.replace(DEFAULT_ENDPOINT, up.endpoint)
        r = subprocess.run(
            ["bash", "-c", command],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, f"{command}\n-> {r.returncode}\n{r.stdout}{r.stderr}"
        if command.startswith("curl"):
            assert '"error"' not in r.stdout, f"{command}\n{r.stdout}"
            if " -i" in command:
                assert r.stdout.startswith("HTTP/1.1 200"), r.stdout
    assert up.stop() == 0


def marked_block(name: str) -> str:
    """The bash block after the README's `<!-- NAME: ... -->` marker."""
    return bash_blocks(README[README.index(f"<!-- {name}:") :])[0]


def comment_of(line: str) -> str:
    return line[len(without_comment(line)) :].strip().lstrip("#").strip()


EXPORT = re.compile(r"export ([A-Z_][A-Z0-9_]*)=(\S+)$")


def test_the_capacity_block_runs_as_shown_on_its_own_state_directory(tmp_path: Path) -> None:
    """The capacity block as a newcomer runs it: its first line gives the fleet a state
    directory of its own (here a fresh one in place of ~/.sluice-capacity, as the quickstart
    test puts a free port in place of 8080), its `sluice up` runs as the other terminal,
    and every other command succeeds, except the one its comment says fails: that one
    exits 8, a failed verdict."""
    block = marked_block("capacity")
    lines = [ln for ln in re.sub(r"\\\n\s*", " ", block).splitlines() if without_comment(ln)]
    first = EXPORT.match(without_comment(lines[0]))
    assert first is not None and first.group(1) == "SLUICE_HOME", lines[0]
    assert "own state directory" in comment_of(lines[0])
    up_line = without_comment(lines[1])
    assert "sluice up -f examples/capacity.yaml" in up_line
    assert "other terminal" in comment_of(lines[1])
    home = tmp_path / "capacity-home"
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "SLUICE_HOME": str(home),
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
    }
    env.pop("SLUICE_API_KEY", None)
    up = subprocess.Popen(
        ["bash", "-c", f"exec env {up_line} --port 0"],  # env: the line starts VAR=value
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert up.stdout is not None
        for line in up.stdout:
            output.append(line)
            if line.startswith("ready: "):
                ready.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 180
        while not ready.wait(1) and up.poll() is None and time.monotonic() < deadline:
            pass
        assert ready.is_set(), "no `ready:` line:\n" + "".join(output)
        for line in lines[2:]:
            command, comment = without_comment(line), comment_of(line)
            export = EXPORT.match(command)
            if export is not None:
                env[export.group(1)] = export.group(2)
                continue
            r = subprocess.run(
                ["bash", "-c", command],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            shown = f"{command}\n-> {r.returncode}\n{r.stdout}{r.stderr}"
            if comment.startswith("fails"):
                assert r.returncode == 8, shown  # a failed verdict, not an error
            else:
                assert r.returncode == 0, shown
        up.send_signal(signal.SIGINT)
        assert up.wait(60) == 0, "".join(output)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait(10)
        reader.join(10)
        assert up.stdout is not None
        up.stdout.close()
        kill_workers_of(home)


def test_the_simulate_examples_say_why_they_miss_their_slo(tmp_path: Path) -> None:
    """The README's reason for the reference runs' SLO misses is measured: each run's SLO
    attainment, and the oracle's and fixed:7's on the same traces, are the numbers it gives."""
    runs = [c for c in commands(quickstart_block()) if "examples/reference-sim.yaml" in c]
    assert len(runs) == 2
    assert all("/tmp/sim" not in c for c in runs)  # a fresh `mktemp -d`, not a shared folder
    env = {**os.environ, "SLUICE_HOME": str(tmp_path / "home")}
    marker = README.index("runs miss their 0.99 SLO target")
    why = " ".join(README[marker : README.index("\n\n", marker)].split())

    def slo(command: str) -> str:
        r = subprocess.run(
            ["bash", "-c", command],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        found = re.search(r"SLO (\d\.\d+) \(target 0\.99\)", r.stdout)
        assert found is not None, r.stdout
        return f"{float(found.group(1)):.3f}"

    missed = [slo(c) for c in runs]
    assert all(float(m) < 0.99 for m in missed)
    oracle = [slo(f"{c} --policy oracle") for c in runs]
    assert all(float(o) >= 0.99 for o in oracle)
    fixed = slo(f"{runs[0]} --policy fixed:7")
    assert f"({missed[0]} and {missed[1]})" in why, why
    assert f"({oracle[0]} and {oracle[1]})" in why, why
    assert f"({fixed}," in why, why
