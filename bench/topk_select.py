"""Top-k selection time: sampled threshold (fast_topk_select) vs torch.topk (issue 14).

Times both on random normal vectors (1M and 6.5M elements, ratio 0.01 unless given) and
prints the median of REPEATS runs with the min-max range, and their ratio. Usage:
    .venv/bin/python bench/topk_select.py [RATIO] [REPEATS]
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable

import torch

from kplan.runtime.compression.kernels import fast_topk_select


def _time(fn: Callable[[], torch.Tensor], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ratio = float(sys.argv[1]) if len(sys.argv) > 1 else 0.01
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, ratio {ratio}")
    print(f"{'numel':>9} {'torch.topk ms':>22} {'sampled ms':>22} {'speed-up':>8} same set")
    for n in (1 << 20, 6_500_000):
        a = torch.randn(n)
        k = math.ceil(ratio * n)

        def ref(a: torch.Tensor = a, k: int = k) -> torch.Tensor:
            return torch.sort(torch.topk(a.abs(), k, sorted=False).indices).values

        def fast(a: torch.Tensor = a, k: int = k) -> torch.Tensor:
            return fast_topk_select(a, k, seed=1)

        same = torch.equal(ref(), fast())  # also a warm-up of both
        tr, tf = _time(ref, repeats), _time(fast, repeats)
        mr, mf = statistics.median(tr), statistics.median(tf)
        print(
            f"{n:>9} {mr * 1e3:8.1f} ({min(tr) * 1e3:.1f}-{max(tr) * 1e3:.1f}) "
            f"{mf * 1e3:8.1f} ({min(tf) * 1e3:.1f}-{max(tf) * 1e3:.1f}) {mr / mf:7.1f}x {same}"
        )
    print(f"median of {repeats} runs (min-max), wall time by time.perf_counter")


if __name__ == "__main__":
    main()
