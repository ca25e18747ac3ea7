"""RayRuntime on a real two-node Ray cluster on this machine (`ray start` twice), with real
`python -m sluice.worker` processes: placement by accelerator type, a real request, a lost
node, stop, and adoption by a second driver; `sluice up` on the cluster, with
examples/ray.yaml as shipped among others.

Ray missing skips the module, except under CI ($CI), where it is a failure (`.ci/run`
installs the `ray` extra). The cluster's processes are found by its own temp dir and
killed, no others (`ray stop` would kill every cluster on the machine).

Loopback only: every node gets its own address in 127.0.0.0/8 from 127.0.0.2 up (the head
127.0.0.2, each node added the next one). Not 127.0.0.1 nor `localhost`: Ray (2.60 seen)
replaces those, as a node address and in a cluster address, by the machine's routable
address (`ray._private.services.resolve_ip_for_localhost`), and every node, driver and
instance then talks over it. Any other loopback address is kept as given, and a driver
joining at 127.0.0.2 takes that as its own address. `test_the_cluster_talks_only_on_loopback`
checks what Ray advertises and every connection its processes hold. (Ray's gRPC servers
still listen on the wildcard address, which no option of Ray changes; nothing connects to
them but over loopback.)
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from sluice.core import SluiceError
from sluice.runtime import CommandLaunch, InstanceHandle, LaunchRequest, Placement
from sluice.spec import load_spec_file

try:
    import ray
except ImportError:  # pragma: no cover - depends on the machine
    WHY = "Ray is not installed: pip install -e '.[ray]' (.ci/run installs it)"
    if os.environ.get("CI"):
        raise RuntimeError(WHY) from None
    pytest.skip(WHY, allow_module_level=True)

from sluice.runtime.ray import LOST, RayRuntime

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.timeout(600),
    # Ray's own modules warn on import and init (deprecations); they are not ours.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

ROOT = Path(__file__).resolve().parents[2]
HEAD_IP = "127.0.0.2"
"""The head node's address; nodes added later take 127.0.0.3, 127.0.0.4, ... (module doc)."""
START_TIMEOUT_S = 120.0
"""A node joining on a busy 2-core machine: normally ~2 s."""
LOST_WITHIN_S = 60.0
SIGNAL_ECHO = """
import signal, socket, sys
s = socket.socket(); s.bind((sys.argv[1], int(sys.argv[2]))); s.listen()
def bye(sig, _):
    print("got", signal.Signals(sig).name, flush=True); sys.exit(3)
signal.signal(signal.SIGINT, bye)
print("listening", flush=True)
signal.pause()
"""
SIM = {"runtime": "sim", "version": "v1", "sim": {"service_time": {"kind": "fixed", "seconds": 0}}}


_GIVEN: set[int] = set()


def free_port() -> int:
    """A free port, never one this process handed out before: the kernel may give a port
    just closed again at once, and Ray refuses to start a node whose components share one
    (CI saw metrics_export and runtime_env_agent both get 37479)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def worker_ports_low() -> int:
    """The first of 100 ports for a node's workers, below the kernel's ephemeral range:
    every other port of the node comes from `free_port`, which is in that range, so none can
    fall among them (Ray refuses to start then); above Ray's own defaults (10001: its client
    server). Random: parallel test workers' clusters."""
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    first = int(ephemeral.read_text().split()[0]) if ephemeral.exists() else 32768
    return random.randrange(11000, max(11100, first - 100), 100)


@dataclass
class Cluster:
    address: str
    temp_dir: Path
    env: dict[str, str]
    _next_ip: Iterator[str] = field(
        default_factory=lambda: (f"127.0.0.{i}" for i in itertools.count(3)), repr=False
    )

    def node_ports(self) -> list[str]:
        """Every port a node would otherwise take by default (two clusters of parallel test
        workers must not meet on one)."""
        return [
            f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--min-worker-port={(low := worker_ports_low())}",
            f"--max-worker-port={low + 99}",
        ]

    def add_node(self, resources: dict[str, float]) -> str:
        """Start a node with `resources` (and 2 CPUs); its node id once the cluster has it."""
        before = {n["NodeID"] for n in ray.nodes()}
        ray_start(
            self,
            next(self._next_ip),
            f"--address={self.address}",
            "--num-cpus=2",
            f"--resources={json.dumps(resources)}",
            *self.node_ports(),
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            new = [n for n in ray.nodes() if n["Alive"] and n["NodeID"] not in before]
            if new:
                return str(new[0]["NodeID"])
            assert time.monotonic() < deadline, "the new node did not join the cluster"
            time.sleep(0.5)


def client_port() -> list[str]:
    """Ray Client's server port, where `ray[client]` is installed (it is started only then,
    on 10001 by default, which two test workers' clusters would both want)."""
    from ray._private.utils import get_ray_client_dependency_error

    return [] if get_ray_client_dependency_error() else [f"--ray-client-server-port={free_port()}"]


def ray_start(cluster: Cluster, node_ip: str, *args: str) -> None:
    """`ray start` of a node that advertises `node_ip` (a loopback address other than
    127.0.0.1, which Ray would replace: module doc)."""
    assert ipaddress.ip_address(node_ip).is_loopback and node_ip != "127.0.0.1", node_ip
    cmd = [
        str(Path(sys.executable).with_name("ray")),
        "start",
        f"--node-ip-address={node_ip}",
        f"--temp-dir={cluster.temp_dir}",
        "--disable-usage-stats",
        *args,
    ]
    done = subprocess.run(
        cmd, env=cluster.env, capture_output=True, text=True, timeout=START_TIMEOUT_S
    )
    if done.returncode != 0:
        logs = sorted(cluster.temp_dir.glob("session_*/logs/*.err")) + sorted(
            cluster.temp_dir.glob("session_*/logs/raylet*.out")
        )
        tails = {str(p): p.read_text(errors="replace")[-2000:] for p in logs[-4:]}
        pytest.fail(f"ray start failed ({done.returncode}): {done.stderr[-3000:]}\n{tails}")


def cluster_pids(temp_dir: Path) -> set[int]:
    """The processes of the cluster in `temp_dir`: those naming it, and their descendants
    (Ray's workers, and the instances' processes under them)."""
    parents: dict[int, int] = {}
    roots: set[int] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[-1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents[int(proc.name)] = ppid
        if str(temp_dir).encode() in cmdline:
            roots.add(int(proc.name))
    found = roots - {os.getpid()}
    grew = True
    while grew:
        more = {pid for pid, ppid in parents.items() if ppid in found} - found
        found |= more
        grew = bool(more)
    return found


def kill_all(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def raylet_pid(node_id: str) -> int:
    """The raylet of `node_id`, found by its socket name (which names this cluster)."""
    node = next(n for n in ray.nodes() if n["NodeID"] == node_id)
    wanted = f"--raylet_socket_name={node['RayletSocketName']}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if wanted in args:
            return int(proc.name)
    raise AssertionError(f"no raylet process for node {node_id}")


def node_address(node_id: str) -> str:
    return str(next(n for n in ray.nodes() if n["NodeID"] == node_id)["NodeManagerAddress"])


def on_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return (mapped or ip).is_loopback


def off_loopback_nodes() -> list[str]:
    """What Ray advertises of its nodes that is not on loopback (their node manager and
    object manager addresses)."""
    return [
        f"{n['NodeID']}: {key} {n[key]}"
        for n in ray.nodes()
        for key in ("NodeManagerAddress", "ObjectManagerAddress")
        if n.get(key) and not on_loopback(n[key])
    ]


_TCP_LISTEN = "0A"


def tcp_sockets(pids: set[int]) -> list[tuple[int, str, str, str]]:
    """The TCP sockets the processes `pids` hold: (pid, state, local, remote), addresses
    as `ip` strings (state: the kernel's hex code, 0A listening, 01 established)."""
    owner: dict[str, int] = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    if link.startswith("socket:["):
                        owner[link[8:-1]] = pid
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                local, remote, state, inode = cols[1], cols[2], cols[3], cols[9]
                if inode in owner:
                    found.append((owner[inode], state, _ip(local), _ip(remote)))
    return found


def _ip(hex_address: str) -> str:
    """`0100007F:1F90` (or the 32-digit IPv6 form) of /proc/net/tcp* -> the address."""
    raw = bytes.fromhex(hex_address.split(":")[0])
    # the kernel writes each 32-bit word in host (little-endian) order
    ordered = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(ordered)
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return str(mapped or ip)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Cluster, str, str]]:
    """Head (2 CPUs, accelerator_type:A 2, X 1) and a node (2 CPUs, B 2); the node ids."""
    temp_dir = Path(tempfile.mkdtemp(prefix="sr", dir="/tmp"))  # AF_UNIX paths are short
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        # A lost node is declared dead after 3 missed 1 s health checks (default: 5 of 3 s).
        "RAY_health_check_initial_delay_ms": "1000",
        "RAY_health_check_period_ms": "1000",
        "RAY_health_check_timeout_ms": "1000",
        "RAY_health_check_failure_threshold": "3",
        # in every node's environment, hence every actor's: what an instance must not get
        "SLUICE_TOKEN": "token-of-the-cli",
        "RAY_TEST_TENANT_KEY": "sk-secret-746b4ad1ca9129e1",
        "RAY_TEST_PLAIN": "plain",
    }
    port = free_port()
    address = f"{HEAD_IP}:{port}"
    c = Cluster(address, temp_dir, env)
    try:
        ray_start(
            c,
            HEAD_IP,
            "--head",
            f"--port={port}",
            "--num-cpus=2",
            f"--resources={json.dumps({'accelerator_type:A': 2, 'accelerator_type:X': 1})}",
            "--include-dashboard=false",
            *client_port(),
            *c.node_ports(),
        )
        ray.init(address=address, log_to_driver=False, logging_level="WARNING")
        head = next(n["NodeID"] for n in ray.nodes() if n["Alive"])
        other = c.add_node({"accelerator_type:B": 2})
        deadline = time.monotonic() + START_TIMEOUT_S
        while sum(n["Alive"] for n in ray.nodes()) < 2:
            assert time.monotonic() < deadline, "the cluster never showed 2 nodes"
            time.sleep(0.5)
        assert off_loopback_nodes() == [], "Ray advertises a node off loopback"
        yield c, head, other
    finally:
        if ray.is_initialized():
            ray.shutdown()
        kill_all(cluster_pids(temp_dir))
        shutil.rmtree(temp_dir, ignore_errors=True)


def request(instance_id: str, accelerator_type: str | None, n: int = 1) -> LaunchRequest:
    config = {"instance_id": instance_id, "group": "grp", "models": {"m": SIM}}
    return LaunchRequest(
        instance_id, "grp", config, {}, placement=Placement(n, accelerator_type, gpu=False)
    )


def new_id() -> str:
    return f"grp-{uuid.uuid4().hex[:8]}"


def runtime(cluster: Cluster, namespace: str = "sluice-test") -> RayRuntime:
    nodes = str(cluster.temp_dir / "nodes")  # instance logs: removed with the cluster
    return RayRuntime(cluster.address, namespace=namespace, node_dir=nodes, place_timeout_s=60)


async def serves(handle: InstanceHandle) -> dict[str, object]:
    """A completion from the worker behind `handle` (it may still be loading the model)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    async with httpx.AsyncClient(trust_env=False) as client:
        while True:
            try:
                r = await client.post(
                    f"{handle.url}/v1/completions", json={"model": "m", "prompt": "hi"}, timeout=5
                )
                if r.status_code == 200:
                    body: dict[str, object] = r.json()
                    return body
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"{handle.url} never served"
            await asyncio.sleep(0.2)


async def test_instance_lands_on_the_node_with_its_accelerator_type_and_serves(
    cluster: tuple[Cluster, str, str],
) -> None:
    c, _head, node_b = cluster
    rt = runtime(c)
    iid = new_id()
    started = time.monotonic()
    handle = await rt.launch(request(iid, "B"))
    took = time.monotonic() - started
    try:
        assert rt.node_of(iid) == node_b
        assert handle.host == node_address(node_b)
        body = await serves(handle)
        assert body["choices"], body
        assert rt.exit_code(handle) is None
        assert {"A": 2, "B": 2}.items() <= rt.inventory().items()
        log = rt.log_path(iid)
        assert log is not None and f"{iid}.log" in log and handle.host in log
        print(f"launch on Ray took {took:.2f}s")
    finally:
        await rt.stop(handle, grace_s=5)


async def test_the_cluster_talks_only_on_loopback(cluster: tuple[Cluster, str, str]) -> None:
    """Every node advertises a loopback address, an instance listens on its node's, and
    every connection of the cluster's processes (GCS, raylets, workers, instances) and of
    this driver has both ends on 127.0.0.0/8 while a request is served. Listening sockets
    are on loopback or Ray's wildcard (module doc), never on another address."""
    c, _head, node_b = cluster
    rt = runtime(c)
    handle = await rt.launch(request(new_id(), "B"))
    try:
        await serves(handle)
        assert off_loopback_nodes() == []
        assert on_loopback(handle.host) and handle.host == node_address(node_b) != "127.0.0.1"
        sockets = tcp_sockets(cluster_pids(c.temp_dir) | {os.getpid()})
        assert len(sockets) > 10, sockets  # the check found the cluster's sockets
        wildcard = {"0.0.0.0", "::"}
        listening = [s for s in sockets if s[1] == _TCP_LISTEN]
        connected = [s for s in sockets if s[1] != _TCP_LISTEN]
        assert [s for s in listening if s[2] not in wildcard and not on_loopback(s[2])] == []
        assert connected, sockets
        off = [s for s in connected if not (on_loopback(s[2]) and on_loopback(s[3]))]
        assert off == [], off
        assert any(s[3] == HEAD_IP for s in connected), connected  # the GCS, at the head's
    finally:
        await rt.stop(handle, grace_s=5)


async def test_a_command_server_runs_on_its_node_without_the_withheld_environment(
    cluster: tuple[Cluster, str, str],
) -> None:
    """`command` instances too: host and port rendered on the node, its stop signal used;
    its environment is the node's scrubbed to the allow-list (`runtime.environment`): what
    Sluice withholds, SLUICE_TOKEN and any variable not listed are not in it."""
    c, head, _ = cluster
    rt = runtime(c)
    iid = new_id()
    launch = CommandLaunch(
        (sys.executable, "-c", SIGNAL_ECHO, "{host}", "{port}"), {}, {}, "SIGINT", 60.0
    )
    req = LaunchRequest(
        iid,
        "grp",
        {},
        {"GIVEN": "yes"},
        command=launch,
        withheld_env=frozenset({"RAY_TEST_TENANT_KEY"}),
        placement=Placement(1, "A"),
    )
    handle = await rt.launch(req)
    try:
        assert rt.node_of(iid) == head and handle.host == node_address(head)
        assert handle.pid is not None
        raw = Path(f"/proc/{handle.pid}/environ").read_bytes().decode()
        env = dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)
        assert env["GIVEN"] == "yes" and env["SLUICE_INSTANCE_ID"] == iid
        assert str(ROOT) in env["PYTHONPATH"]  # the node's, allow-listed
        assert "RAY_TEST_TENANT_KEY" not in env and "SLUICE_TOKEN" not in env
        assert "RAY_TEST_PLAIN" not in env  # not on the allow-list: a node's variable stays
    finally:
        code = await rt.stop(handle, grace_s=10)
    assert code == 3  # it got SIGINT, its stop signal, and exited on it


async def test_a_group_spreads_across_the_nodes_that_have_its_type(
    cluster: tuple[Cluster, str, str],
) -> None:
    """Two instances of one type that both nodes have: one on each (SPREAD), although
    either node alone could hold both."""
    c, head, node_b = cluster
    rt = runtime(c)
    # every node has CPUs: an untyped group may go anywhere, and spreads
    handles = [await rt.launch(request(new_id(), None, 0)) for _ in range(2)]
    try:
        assert {rt.node_of(h.instance_id) for h in handles} == {head, node_b}
    finally:
        for h in handles:
            await rt.stop(h, grace_s=5)


async def test_an_impossible_placement_fails_the_launch_and_leaves_no_actor(
    cluster: tuple[Cluster, str, str],
) -> None:
    c, _, _ = cluster
    rt = RayRuntime(c.address, namespace="sluice-test", node_dir=str(c.temp_dir), place_timeout_s=3)
    iid = new_id()
    with pytest.raises(SluiceError, match="no node of the Ray cluster took"):
        await rt.launch(request(iid, "Z"))
    assert iid not in rt.instances()


async def test_a_process_that_exits_before_it_listens_fails_the_launch_on_its_node(
    cluster: tuple[Cluster, str, str],
) -> None:
    c, _, _ = cluster
    rt = runtime(c)
    iid = new_id()
    broken = LaunchRequest(iid, "grp", {"instance_id": iid, "group": "grp", "models": {}}, {})
    with pytest.raises(SluiceError, match="exited with code 2 before it listened") as caught:
        await rt.launch(broken)
    assert "on node" in str(caught.value)
    log = rt.log_path(iid)
    assert log is not None and f"{iid}.log" in log
    deadline = time.monotonic() + 30
    while iid in rt.instances():
        assert time.monotonic() < deadline, "the failed instance's actor is still there"
        await asyncio.sleep(0.2)


async def test_stop_drains_returns_the_exit_code_and_leaves_no_actor(
    cluster: tuple[Cluster, str, str],
) -> None:
    c, _, _ = cluster
    rt = runtime(c)
    iid = new_id()
    handle = await rt.launch(request(iid, "A"))
    await serves(handle)
    assert iid in rt.instances()
    code = await rt.stop(handle, grace_s=10)
    assert code == 0  # the worker exits cleanly on SIGTERM
    assert rt.exit_code(handle) == 0
    deadline = time.monotonic() + 30
    while iid in rt.instances():
        assert time.monotonic() < deadline, "the actor is still there after stop"
        await asyncio.sleep(0.2)
    assert not _runs(handle)


async def test_a_lost_node_ends_its_instance_and_the_replacement_lands_elsewhere(
    cluster: tuple[Cluster, str, str],
) -> None:
    """X: one on the head, one on a node added for this test. Its raylet killed, the
    instance there is lost within a bound; a relaunch goes to the head. The cluster's
    inventory (what sizes an `inventory: cluster` pool) grows with the node and shrinks
    when it is lost."""
    c, head, _ = cluster
    rt = runtime(c)
    x_before = rt.inventory().get("X", 0)
    victim = c.add_node({"accelerator_type:X": 1})
    assert rt.inventory()["X"] == x_before + 1
    first = [await rt.launch(request(new_id(), "X")) for _ in range(2)]
    on_victim = next(h for h in first if rt.node_of(h.instance_id) == victim)
    on_head = next(h for h in first if rt.node_of(h.instance_id) == head)
    try:
        await serves(on_victim)
        victim_pids = cluster_pids_of_raylet(raylet_pid(victim))
        killed = time.monotonic()
        os.kill(raylet_pid(victim), signal.SIGKILL)
        while (code := rt.exit_code(on_victim)) is None:
            assert time.monotonic() - killed < LOST_WITHIN_S, "the lost node was never seen"
            await asyncio.sleep(0.2)
        lost_after = time.monotonic() - killed
        assert code == LOST
        assert rt.exit_code(on_head) is None
        while rt.inventory().get("X", 0) != x_before:  # the pool shrinks back
            assert time.monotonic() - killed < LOST_WITHIN_S, rt.inventory()
            await asyncio.sleep(0.2)
        print(f"instance lost {lost_after:.1f}s after its raylet was killed")
        await rt.stop(on_victim, grace_s=1)  # what the supervisor does with a failed one
        await rt.stop(on_head, grace_s=5)  # frees the head's X
        again = await rt.launch(request(new_id(), "X"))
        try:
            assert rt.node_of(again.instance_id) == head
            await serves(again)
        finally:
            await rt.stop(again, grace_s=5)
        # the instance's process died with its actor (the kernel's parent-death signal)
        deadline = time.monotonic() + 10
        while _runs(on_victim):
            assert time.monotonic() < deadline, "the lost instance's process still runs"
            await asyncio.sleep(0.2)
    finally:
        kill_all(victim_pids if "victim_pids" in locals() else set())
        for h in first:
            await rt.stop(h, grace_s=1)


def cluster_pids_of_raylet(pid: int) -> set[int]:
    """A raylet and its descendants, plus the node's other daemons (they name its socket)."""
    node = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    socket_arg = next(a for a in node if a.startswith(b"--raylet_socket_name="))
    name = socket_arg.split(b"=", 1)[1]
    found = {pid}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if name in (proc / "cmdline").read_bytes():
                    found.add(int(proc.name))
            except OSError:
                continue
    return found


async def test_a_second_driver_adopts_a_surviving_instance(
    cluster: tuple[Cluster, str, str],
) -> None:
    """Sluice restarts: the first driver disconnects, a new RayRuntime connects, finds the
    named detached actor and takes the instance over (and can stop it)."""
    c, _, node_b = cluster
    first = runtime(c, namespace="sluice-adopt")
    iid = new_id()
    handle = await first.launch(request(iid, "B"))
    await serves(handle)
    ray.shutdown()  # the driver goes away, as with a crash of Sluice
    second = runtime(c, namespace="sluice-adopt")
    assert second.adopt(handle)
    assert second.node_of(iid) == node_b
    assert second.exit_code(handle) is None
    await serves(handle)
    stranger = InstanceHandle(iid, handle.host, handle.port + 1, handle.pid)
    assert not runtime(c, namespace="sluice-other").adopt(stranger)
    assert not second.adopt(InstanceHandle(new_id(), handle.host, handle.port, handle.pid))
    assert await second.stop(handle, grace_s=5) == 0
    assert iid not in second.instances()


def _runs(handle: InstanceHandle) -> bool:
    """The instance's process still lives (this machine is every node)."""
    from sluice.runtime.local import pid_runs_instance

    return handle.pid is not None and pid_runs_instance(handle.pid, handle.instance_id)


POOL_SPEC = """
gateway: {{host: 127.0.0.1, port: 0}}
instances: {{runtime: ray, ray: {{address: "{address}", namespace: sluice-pool}}}}
pools:
  - {{name: y, accelerator_type: Y, inventory: cluster, count: 0, memory_gb: 8}}
groups:
  - name: chat
    owner: ops@example.com
    business: core
    alert_channel: "#ops"
    models:
      m:
        runtime: sim
        sim: {{startup_s: 0.2, service_time: {{kind: fixed, seconds: 0.01}}, memory_gb: 1}}
    resources: {{pool: y, accelerators: 1, memory_gb: 1}}
    replicas: 2
tenants:
  - {{name: search, api_keys: [sk-search-b095adcc724f4f8a]}}
"""


async def test_sluice_up_sizes_a_pool_by_the_cluster_as_nodes_join_and_leave(
    cluster: tuple[Cluster, str, str], tmp_path: Path
) -> None:
    """`sluice up` on the cluster, with a pool of `inventory: cluster` whose type no node
    has yet: nothing runs. A node with 2 Y joins: the pool has 2 and the group's 2
    instances start on it. The node is lost: the pool has 0 again, and the lost instances
    are not started anywhere else (quota refuses: the pool is empty)."""
    from tests.e2e.conftest import Sluice, kill_workers_of

    c, _, _ = cluster
    spec = tmp_path / "platform.yaml"
    spec.write_text(POOL_SPEC.format(address=c.address))
    s = Sluice(tmp_path / "home", spec, environ={"PYTHONPATH": c.env["PYTHONPATH"]})
    s.start()
    node_pids: set[int] = set()
    try:

        def pool_sizes() -> list[tuple[int | None, int]]:
            events = s.cli("events", "chat", "--limit", "100")
            return [
                (e["detail"]["before"], e["detail"]["after"])
                for e in reversed(events)
                if e["kind"] == "pool-size"
            ]

        s.wait_for("the pool read as empty", lambda: pool_sizes() == [(None, 0)], timeout=60)
        assert s.ready("chat") == []
        node = c.add_node({"accelerator_type:Y": 2})
        s.wait_for("2 ready on the joined node", lambda: len(s.ready("chat")) == 2, timeout=120)
        assert pool_sizes() == [(None, 0), (0, 2)]
        node_pids = cluster_pids_of_raylet(raylet_pid(node))
        os.kill(raylet_pid(node), signal.SIGKILL)
        s.wait_for(
            "the pool shrunk back to 0",
            lambda: pool_sizes() == [(None, 0), (0, 2), (2, 0)],
            timeout=LOST_WITHIN_S,
        )
        s.wait_for("no instance left", lambda: s.ready("chat") == [], timeout=LOST_WITHIN_S)
        time.sleep(6)  # a few ticks: nothing is started on a pool with no accelerators
        alive = [i for i in s.instances("chat") if i["state"] in ("starting", "ready")]
        assert alive == [], alive
    finally:
        s.kill()
        kill_workers_of(s.home)
        kill_all(node_pids)


async def test_the_ray_example_serves_as_shipped(
    cluster: tuple[Cluster, str, str], tmp_path: Path
) -> None:
    """`sluice up -f examples/ray.yaml`, the file as shipped, on the cluster (found by its
    `address: auto` through $RAY_ADDRESS) with a node of its `cpu-a` units: the group's two
    instances start on that node and the example's tenant key gets an answer; a request
    without a key is refused."""
    from tests.e2e.conftest import Sluice, kill_workers_of

    c, _, _ = cluster
    spec = ROOT / "examples" / "ray.yaml"
    [key] = load_spec_file(spec).spec.tenants[0].api_keys
    environ = {"PYTHONPATH": c.env["PYTHONPATH"], "RAY_ADDRESS": c.address}
    node = c.add_node({"accelerator_type:cpu-a": 2})
    node_pids = cluster_pids_of_raylet(raylet_pid(node))
    s = Sluice(tmp_path / "home", spec, environ=environ)
    s.start()
    try:
        s.wait_for("2 ready on the cpu-a node", lambda: len(s.ready("chat")) == 2, timeout=120)
        hosts = {httpx.URL(i["url"]).host for i in s.ready("chat")}
        assert hosts == {node_address(node)}, hosts
        body = {"model": "demo-sim", "messages": [{"role": "user", "content": "hi"}]}
        async with httpx.AsyncClient(base_url=s.endpoint, trust_env=False, timeout=30) as client:
            r = await client.post(
                "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
            assert r.status_code == 200, r.text
            assert r.json()["choices"], r.text
            assert (await client.post("/v1/chat/completions", json=body)).status_code == 401
    finally:
        s.kill()
        kill_workers_of(s.home)
        kill_all(node_pids)
