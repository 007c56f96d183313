"""The code packer's ignore matcher on a pathological ``.gitignore`` (issue 24).

Twelve rules, the k-th with k ``**`` (``**/a/**/a/.../**/zzK``), over a folder 25 levels deep
whose every level is named ``a``: a matcher that tries each split of the path for each ``**``
explores about C(25, 12) ~ 5 million splits per rule and path; kplan's is linear in
(path parts x pattern segments). Prints the wall time of one ``pack_code`` over that folder.

    python -m bench.packing_ignore
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from kplan.launcher.packing import pack_code

DEPTH = 25
RULES = 12


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "train.py").write_text("print(1)\n")
        deep = root.joinpath(*["a"] * DEPTH)
        deep.mkdir(parents=True)
        (deep / "f.txt").write_text("x\n")
        lines = ["**/a/" * k + f"**/zz{k}" for k in range(1, RULES + 1)]
        (root / ".gitignore").write_text("\n".join(lines) + "\n")
        times = []
        for _ in range(5):
            start = time.perf_counter()
            packed = pack_code(root / "train.py")
            times.append(time.perf_counter() - start)
        times.sort()
        print(
            f"pack_code: {RULES} rules up to {RULES} '**', {DEPTH} folders deep: "
            f"median {times[2] * 1000:.1f} ms over 5 runs ({len(packed.files)} files shipped)"
        )


if __name__ == "__main__":
    main()
