"""Emulated multi-host clusters on one machine: network namespaces, veth pairs, a bridge, ``tc``.

Each emulated host is a network namespace with one veth interface on a shared bridge in the root
namespace and an address in a private /24. Its link is shaped in both directions with ``tc tbf``
at the given rate (the namespace side shapes what the host sends, the bridge side what it
receives) with a 5 ms queue (``_tbf``), so a host behaves like a machine with a full-duplex NIC
of that speed. ``netem`` is
not in this kernel, so no latency is added: the link latency is the veth's (tens of us).

    with netbed(2, gbps=1.0) as bed:
        bed.run(0, ["ping", "-c1", bed.hosts[1].ip])

Everything the bed creates carries its owner's pid in its name (``kpb<pid36>-<tag>``): on exit
(normal, exception, KeyboardInterrupt) the bed kills the processes it started and the processes
left inside its namespaces, deletes the namespaces (which deletes their veth ends, so the pairs
go) and the bridge. A bed whose owner died without cleaning up (SIGKILL) is swept by the next
``netbed()`` call on the machine (``sweep_stale``).

Needs root and iproute2 (``ip``, ``tc``): ``unavailable()`` says why not, for a test skip.
DDP across the hosts needs ``GLOO_SOCKET_IFNAME`` set to the host's interface (``Host.ifname``)
and torchrun ``--local-addr=<host ip>`` (``torchrun_args``), ``is_host=1`` on the rendezvous host.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "kpb"  # every namespace, bridge and veth of a bed starts with this
_NAME = re.compile(rf"^{PREFIX}([0-9a-z]+)-")


def unavailable() -> str | None:
    """Why a bed cannot be made here (a skip reason), or None."""
    if sys.platform != "linux":
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "network namespaces and tc need root (run the test as root)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"`ip netns` does not work here: {probe.stderr.strip()}"
    return None


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), capture_output=True, text=True, check=False, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed: {proc.stderr.strip() or proc.stdout}")
    return proc


def _b36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


@dataclass(frozen=True)
class Host:
    """One emulated host: a namespace, its interface on the bridge and its address."""

    index: int
    netns: str
    ifname: str  # inside the namespace
    peer: str  # the bridge-side end, in the root namespace
    ip: str


@dataclass
class NetBed:
    """A running bed (made by ``netbed``); ``gbps`` None: unshaped."""

    tag: str
    bridge: str
    subnet: str  # "10.213.X"
    gbps: float | None
    hosts: list[Host]
    _procs: list[subprocess.Popen[str]] = field(default_factory=list)

    def command(self, host: int, args: Sequence[str]) -> list[str]:
        """``args`` run inside host ``host``'s namespace."""
        return ["ip", "netns", "exec", self.hosts[host].netns, *args]

    def popen(
        self,
        host: int,
        args: Sequence[str],
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> subprocess.Popen[str]:
        """Start ``args`` in host ``host`` (own process group, output captured); the bed kills
        it on exit if it still runs."""
        proc = subprocess.Popen(
            self.command(host, args),
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._procs.append(proc)
        return proc

    def run(
        self,
        host: int,
        args: Sequence[str],
        env: dict[str, str] | None = None,
        timeout: float = 60.0,
        cwd: str | Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``args`` in host ``host`` to the end (killed with its group after ``timeout``)."""
        proc = self.popen(host, args, env, cwd)
        return wait(proc, timeout)

    def torchrun_args(self, host: int, port: int, nproc: int = 1) -> list[str]:
        """torchrun's multi-node arguments for ``host`` with host 0 serving the rendezvous."""
        conf = ["--rdzv-conf=is_host=1"] if host == 0 else []
        return [
            f"--nnodes={len(self.hosts)}",
            f"--nproc_per_node={nproc}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={self.hosts[0].ip}:{port}",
            f"--local-addr={self.hosts[host].ip}",
            *conf,
        ]

    def torchrun(self, host: int, port: int, script: Sequence[str]) -> list[str]:
        """The command that runs ``script`` (a path and its arguments) under torchrun on
        ``host``: one bed-wide job, no restarts, its agent polling every 0.2 s."""
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            *self.torchrun_args(host, port),
            "--max-restarts=0",
            "--monitor-interval=0.2",
            *script,
        ]

    def env(self, host: int, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with gloo bound to the host's NIC."""
        out = dict(os.environ if base is None else base)
        out["GLOO_SOCKET_IFNAME"] = self.hosts[host].ifname
        out.pop("MASTER_ADDR", None)
        return out

    def kill_all(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                proc.communicate(timeout=5)
        self._procs.clear()


def wait(proc: subprocess.Popen[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Wait for ``proc``; on timeout (or interrupt) kill its process group and re-raise."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode or 0, out, None)


QUEUE_S = 0.005  # egress queue of a shaped link, seconds at the rate (``_tbf``)


def _tbf(dev: str, gbps: float, netns: str | None = None) -> None:
    """Shape ``dev``'s egress to ``gbps`` with a short queue.

    The queue holds about ``QUEUE_S`` at the rate, the standing queue fq_codel (Linux's usual
    default qdisc, not built into this kernel) keeps a real host's NIC to. A deeper one (50 ms
    before 2026-11-27) made the bed half-duplex-like: with both directions of a link full, the
    ACKs of one direction wait behind the other's data and that side's TCP fell to 0.72-0.96
    of the rate at 0.1 Gbit/s (bench/netbed_duplex.py). GSO segments are capped at a quarter of
    the queue (at most 64 KiB), so the bucket (>= 2 ms at the rate, >= two segments) and the
    queue still hold whole segments at low rates."""
    rate_bytes = gbps * 1e9 / 8
    segment = int(min(65536, max(4096, rate_bytes * QUEUE_S / 4)))
    burst = int(max(2 * segment + 1514, rate_bytes * 0.002))
    limit = int(max(2 * burst, rate_bytes * QUEUE_S))
    pre = ["ip", "netns", "exec", netns] if netns else []
    if segment < 65536:
        _sh(*pre, "ip", "link", "set", "dev", dev, "gso_max_size", str(segment))
    _sh(
        *pre,
        "tc",
        "qdisc",
        "replace",
        "dev",
        dev,
        "root",
        "tbf",
        "rate",
        f"{int(gbps * 1e6)}kbit",
        "burst",
        str(burst),
        "limit",
        str(limit),
    )


def _names() -> tuple[set[str], set[str]]:
    ns = {line.split()[0] for line in _sh("ip", "netns", "list").stdout.splitlines() if line}
    links = set()
    for line in _sh("ip", "-o", "link", "show").stdout.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            links.add(parts[1].strip().split("@")[0])
    return ns, links


def _owner_alive(name: str) -> bool:
    m = _NAME.match(name)
    if not m:
        return True  # not ours to judge
    pid = int(m.group(1), 36)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_netns_procs(netns: str) -> None:
    out = _sh("ip", "netns", "pids", netns, check=False).stdout.split()
    for pid in out:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _remove(netns: Sequence[str], links: Sequence[str]) -> list[str]:
    """Delete namespaces (killing what runs in them) and links; returns what could not go."""
    left = []
    for ns in netns:
        _kill_netns_procs(ns)
        for _ in range(50):
            if _sh("ip", "netns", "del", ns, check=False).returncode == 0:
                break
            time.sleep(0.1)
        else:
            left.append(f"netns {ns}")
    for link in links:
        _sh("ip", "link", "del", link, check=False)
    now_ns, now_links = _names()
    left += [f"link {x}" for x in links if x in now_links]
    left += [f"netns {x}" for x in netns if x in now_ns and f"netns {x}" not in left]
    return left


def sweep_stale() -> list[str]:
    """Remove the beds of owners that died without cleaning up; returns what was removed."""
    ns, links = _names()
    dead_ns = sorted(x for x in ns if x.startswith(PREFIX) and not _owner_alive(x))
    dead_links = sorted(x for x in links if x.startswith(PREFIX) and not _owner_alive(x))
    _remove(dead_ns, dead_links)
    return dead_ns + dead_links


def leftovers(tag: str) -> list[str]:
    """Namespaces and links of bed ``tag`` that still exist (empty after a clean exit)."""
    ns, links = _names()
    return sorted(x for x in ns | links if x.startswith(tag))


@contextlib.contextmanager
def netbed(hosts: int = 2, gbps: float | None = 1.0) -> Iterator[NetBed]:
    """``hosts`` (2-4) emulated hosts on one bridge, each link shaped to ``gbps`` (None: not)."""
    if not 2 <= hosts <= 4:
        raise ValueError(f"hosts={hosts} must be in 2..4")
    if gbps is not None and not 0.001 <= gbps <= 100:
        raise ValueError(f"gbps={gbps} must be in 0.001..100")
    reason = unavailable()
    if reason:
        raise RuntimeError(f"no network bed: {reason}")
    sweep_stale()
    rnd = random.SystemRandom()
    tag = f"{PREFIX}{_b36(os.getpid())}-{_b36(rnd.randrange(36**3)).rjust(3, '0')}"
    subnet = f"10.{rnd.randrange(200, 250)}.{rnd.randrange(1, 255)}"
    bed = NetBed(tag, f"{tag}b", subnet, gbps, [])
    made_ns: list[str] = []
    made_links: list[str] = []
    try:
        _sh("ip", "link", "add", bed.bridge, "type", "bridge")
        made_links.append(bed.bridge)
        _sh("ip", "link", "set", bed.bridge, "up")
        for i in range(hosts):
            host = Host(i, f"{tag}n{i}", f"{tag}h{i}", f"{tag}v{i}", f"{subnet}.{i + 1}")
            _sh("ip", "netns", "add", host.netns)
            made_ns.append(host.netns)
            _sh("ip", "link", "add", host.peer, "type", "veth", "peer", "name", host.ifname)
            made_links.append(host.peer)
            _sh("ip", "link", "set", host.ifname, "netns", host.netns)
            _sh("ip", "link", "set", host.peer, "master", bed.bridge)
            _sh("ip", "link", "set", host.peer, "up")
            inside = ["ip", "netns", "exec", host.netns]
            _sh(*inside, "ip", "addr", "add", f"{host.ip}/24", "dev", host.ifname)
            _sh(*inside, "ip", "link", "set", host.ifname, "up")
            _sh(*inside, "ip", "link", "set", "lo", "up")
            if gbps is not None:
                _tbf(host.ifname, gbps, host.netns)  # what the host sends
                _tbf(host.peer, gbps)  # what it receives
            bed.hosts.append(host)
        yield bed
    finally:
        bed.kill_all()
        left = _remove(made_ns, made_links)
        if left:
            raise RuntimeError(
                f"the network bed left {', '.join(left)}; remove with `ip netns del NAME` / "
                "`ip link del NAME`"
            )


_RECEIVER = """
import socket, sys, time, json
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); buf = bytearray(1 << 20); n = 0; t0 = None
while True:
    k = c.recv_into(buf)
    if not k: break
    if t0 is None: t0 = time.perf_counter()
    n += k
print(json.dumps({"bytes": n, "seconds": time.perf_counter() - t0}), flush=True)
"""
_SENDER = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
left = int(sys.argv[3]); chunk = b"\\0" * (1 << 20)
while left > 0:
    c.sendall(chunk[: min(left, len(chunk))]); left -= len(chunk)
c.close()
"""


def tcp_gbps(bed: NetBed, src: int, dst: int, nbytes: int, port: int = 29411) -> float:
    """Measured TCP goodput (Gbit/s) of ``nbytes`` sent from host ``src`` to host ``dst``,
    timed at the receiver from the first byte to the last."""
    import json

    rx = bed.popen(dst, [sys.executable, "-c", _RECEIVER, bed.hosts[dst].ip, str(port)])
    assert rx.stdout is not None
    if rx.stdout.readline().strip() != "ready":
        raise RuntimeError(f"the receiver did not start: {wait(rx, 10).stdout}")
    sent = bed.run(src, [sys.executable, "-c", _SENDER, bed.hosts[dst].ip, str(port), str(nbytes)])
    if sent.returncode != 0:
        raise RuntimeError(f"the sender failed: {sent.stdout}")
    doc = json.loads(wait(rx, 60).stdout.strip().splitlines()[-1])
    if doc["bytes"] != nbytes:
        raise RuntimeError(f"received {doc['bytes']} of {nbytes} bytes")
    return float(doc["bytes"] * 8 / doc["seconds"] / 1e9)


_ALLREDUCE = """
import json, os, sys, time, torch, torch.distributed as dist
rank, world, addr, port, numel, reps = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                         sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world)
x = torch.ones(numel)
dist.all_reduce(x)  # warm-up: connections, buffers
times = []
for _ in range(reps):
    dist.barrier(); t0 = time.perf_counter(); dist.all_reduce(x)
    times.append(time.perf_counter() - t0)
ok = bool(torch.all(x == world ** (reps + 1)))
print(json.dumps({"seconds": sorted(times)[len(times) // 2], "correct": ok}), flush=True)
dist.destroy_process_group()
"""


def allreduce_seconds(
    bed: NetBed, nbytes: int, reps: int = 3, port: int = 29412, timeout: float = 120.0
) -> float:
    """Median seconds of a gloo all-reduce of ``nbytes`` (fp32) over every host of the bed, one
    process per host (checked for the right sum)."""
    import json

    n = len(bed.hosts)
    args = [str(n), bed.hosts[0].ip, str(port), str(nbytes // 4), str(reps)]
    procs = [
        bed.popen(i, [sys.executable, "-c", _ALLREDUCE, str(i), *args], env=bed.env(i))
        for i in range(n)
    ]
    outs = [wait(p, timeout) for p in procs]
    for i, out in enumerate(outs):
        if out.returncode != 0:
            raise RuntimeError(f"all-reduce on host {i} failed: {out.stdout[-2000:]}")
    docs = [json.loads(o.stdout.strip().splitlines()[-1]) for o in outs]
    if not all(d["correct"] for d in docs):
        raise RuntimeError(f"all-reduce returned a wrong sum: {docs}")
    return max(float(d["seconds"]) for d in docs)
