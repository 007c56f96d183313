"""TCP goodput on the emulated hosts one direction at a time against both at once (issue 14).

Both directions of an emulated host's link should run at the rate at once, as on a full-duplex
NIC. With the bed's first 50 ms tbf queue they did not (0.1 Gbit/s: one side fell to 0.072-0.096
of the rate, its ACKs waiting behind the other direction's data), which penalised AG-Topk (both
directions at once) against AR-Topk on bench/comm_bed.py; the bed now keeps a 5 ms queue
(scripts/netbed.py ``_tbf``). This measures plain TCP (``tests/netbed.tcp_gbps``, about one
second of data per transfer) on the bed: host 0 to host 1 alone, then both directions together.

    python bench/netbed_duplex.py            # as root, ~1 minute
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.netbed import netbed, tcp_gbps, unavailable


def measure(gbps: float, tries: int) -> tuple[list[float], list[tuple[float, float]]]:
    """(one direction's goodputs, both directions' pairs) in Gbit/s on a 2-host bed."""
    with netbed(2, gbps=gbps) as bed:
        nbytes = int(gbps * 1e9 / 8)  # about one second at the rate
        one = [tcp_gbps(bed, 0, 1, nbytes, port=29411 + k) for k in range(tries)]
        both: list[tuple[float, float]] = []
        for k in range(tries):
            got: dict[int, float] = {}

            def send(src: int, port: int, got: dict[int, float] = got) -> None:
                got[src] = tcp_gbps(bed, src, 1 - src, nbytes, port=port)

            threads = [threading.Thread(target=send, args=(s, 29421 + 10 * s + k)) for s in (0, 1)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            both.append((got[0], got[1]))
    return one, both


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gbps", type=float, nargs="+", default=[0.1, 1.0])
    ap.add_argument("--tries", type=int, default=3)
    args = ap.parse_args(argv)
    why = unavailable()
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    for gbps in args.gbps:
        one, both = measure(gbps, args.tries)
        pairs = ", ".join(f"({a:.3f}, {b:.3f})" for a, b in both)
        print(f"{gbps:g} Gbit/s: one direction {[round(x, 3) for x in one]}; both at once {pairs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
