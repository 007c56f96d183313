"""The emulated multi-host bed (scripts/netbed.py): it cleans up, it shapes, and DDP runs across it.

Skipped, with the reason, where namespaces cannot be made (not root, no iproute2). The
bandwidth checks assert that the shaping is right (the measured rate within a band around the
configured one), not how fast anything is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.runtime_common import WORKER, clean_env, free_port, torchrun
from scripts import netbed

pytestmark = pytest.mark.skipif(netbed.unavailable() is not None, reason=str(netbed.unavailable()))


def test_bed_up_and_down_leaves_nothing_behind() -> None:
    with netbed.netbed(3, gbps=1.0) as bed:
        tag = bed.tag
        assert len(netbed.leftovers(tag)) == 3 + 3 + 1  # namespaces, bridge-side veths, bridge
        assert netbed.tcp_gbps(bed, 0, 2, 1_000_000) > 0  # host 0 reaches host 2 over TCP
        sleeper = bed.popen(1, [sys.executable, "-c", "import time; time.sleep(600)"])
    assert sleeper.poll() is not None  # killed with the bed
    assert netbed.leftovers(tag) == []


def test_bed_is_removed_on_an_exception_in_the_block() -> None:
    with pytest.raises(KeyboardInterrupt), netbed.netbed(2, gbps=None) as bed:
        tag = bed.tag
        bed.popen(0, [sys.executable, "-c", "import time; time.sleep(600)"])
        raise KeyboardInterrupt
    assert netbed.leftovers(tag) == []


def test_a_dead_owners_bed_is_swept(tmp_path: Path) -> None:
    """A bed whose owner was SIGKILLed is removed by the next bed's sweep."""
    script = (
        "import os, sys, time; sys.path.insert(0, sys.argv[1]); from scripts import netbed\n"
        "with netbed.netbed(2, gbps=None) as bed:\n"
        "    print(bed.tag, flush=True); os.kill(os.getpid(), 9)\n"
    )
    repo = str(Path(__file__).resolve().parents[1])
    out = subprocess.run(
        [sys.executable, "-c", script, repo], capture_output=True, text=True, check=False
    )
    tag = out.stdout.strip()
    assert tag.startswith(netbed.PREFIX) and netbed.leftovers(tag), out
    assert any(x.startswith(tag) for x in netbed.sweep_stale())
    assert netbed.leftovers(tag) == []


def test_bad_bed_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="hosts=5"), netbed.netbed(5):
        pass
    with pytest.raises(ValueError, match="gbps=0"), netbed.netbed(2, gbps=0.0):
        pass


@pytest.mark.slow
def test_tcp_and_gloo_all_reduce_run_at_the_shaped_rate() -> None:
    """At 1 Gbit/s: TCP goodput at most the shaped rate and not far below it (0.7-1.0 Gbit/s:
    tbf's rate less TCP/IP headers, ~0.95 measured; the floor leaves room for a loaded
    machine); a 2-host gloo all-reduce of S bytes moves S bytes each way per host (ring,
    2(k-1)/k * S), so its S/t is 0.6-1.0 Gbit/s; unshaped, the same all-reduce is at least 2x
    faster (~6x measured)."""
    with netbed.netbed(2, gbps=1.0) as bed:
        tcp = netbed.tcp_gbps(bed, 0, 1, 40_000_000)
        shaped = netbed.allreduce_seconds(bed, 20_000_000)
    assert 0.7 <= tcp <= 1.0, tcp
    assert 0.6 <= 20e6 * 8 / shaped / 1e9 <= 1.0, shaped
    with netbed.netbed(2, gbps=None) as bed:
        free = netbed.allreduce_seconds(bed, 20_000_000)
    assert free * 2 < shaped, (free, shaped)


@pytest.mark.slow
def test_two_host_torchrun_ddp_through_the_runtime(tmp_path: Path) -> None:
    """A 2-host torchrun job of the kplan runtime (gloo over the bed's veths, 100 Mbit/s)
    finishes and ends with the same parameters as the same 2-worker job on one host."""
    args = ["--model", "mlp", "--samples", "512", "--batch", "64", "--epochs", "1"]
    ref = tmp_path / "ref.pt"
    one = torchrun([*args, "--dump", str(ref)], clean_env())
    assert one.returncode == 0, one.stdout[-3000:]
    out = tmp_path / "bed.pt"
    port = free_port()
    with netbed.netbed(2, gbps=0.1) as bed:
        procs = []
        for i in range(2):
            cmd = bed.torchrun(i, port, [str(WORKER), *args, "--dump", str(out)])
            procs.append(bed.popen(i, cmd, env=bed.env(i, clean_env()), cwd=os.getcwd()))
        results = [netbed.wait(p, 120) for p in procs]
    for r in results:
        assert r.returncode == 0, r.stdout[-3000:]
    a, b = torch.load(ref), torch.load(out)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
