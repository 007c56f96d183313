"""Trace the built-in examples' operator graphs into kplan/planner/examples/*.json (profile 1.4).

Re-runnable: ``python scripts/trace_examples.py [NAME ...]`` (all examples with a model in
``kplan.examples.models`` when no name is given). Run it after scripts/build_examples.py, which
writes the files without a graph.

Each example's real architecture (kplan/examples/models/) is traced on the meta device
(FakeTensorMode: no memory, no GPU) for one training step (forward, loss, backward, optimizer)
at the example's base global batch on one GPU, in fp32 (the precision its measurements ran
in), and the folded graph is written as the profile's ``opgraph``. Needs torch; the planner
reads the graphs without it. DeepSpeech2 takes minutes: its GRUs run step by step.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kplan.planner.opgraph import OpGraph  # noqa: E402
from kplan.planner.profile import profile_from_dict  # noqa: E402

EXAMPLES = ROOT / "kplan" / "planner" / "examples"
SCHEMA = "kplan.profile/1.4"


def trace_example(name: str, local_batch: int) -> OpGraph:
    """The graph of ``name``'s model at ``local_batch`` (kplan.examples.models.MODELS)."""
    from kplan.examples.models import MODELS
    from kplan.profiler.opgraph_trace import trace_model

    m = MODELS[name]
    graph = trace_model(
        m.build, m.batch, m.loss, m.optimizer, local_batch=local_batch, precision="fp32"
    )
    how = f"{graph.how}; scripts/trace_examples.py, kplan/examples/models ({m.what})"
    return OpGraph(graph.ops, graph.local_batch, graph.precision, how[:512])


def dumps(doc: dict[str, object]) -> str:
    """The document as build_examples.py writes it, one line per operator call."""
    doc = dict(doc)
    graph = doc.pop("opgraph", None)
    text = json.dumps(doc, indent=1)
    if not isinstance(graph, dict):
        return text + "\n"
    ops = ",\n".join("   " + json.dumps(o) for o in graph["ops"])
    head = json.dumps({k: v for k, v in graph.items() if k != "ops"}, indent=1)[:-2]
    head = head.replace("\n", "\n ")
    section = f' "opgraph": {head},\n  "ops": [\n{ops}\n  ]\n }}'
    return text[:-2] + ",\n" + section + "\n}\n"


def main(argv: list[str] | None = None) -> int:
    from kplan.examples.models import MODELS

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="examples to trace (default: all with a model)")
    args = parser.parse_args(argv)
    names = args.names or sorted(p.stem for p in EXAMPLES.glob("*.json") if p.stem in MODELS)
    for name in names:
        path = EXAMPLES / f"{name}.json"
        doc = json.loads(path.read_text())
        batch = int(doc["batch"]["base_global_batch"])
        start = time.monotonic()
        doc["opgraph"] = trace_example(name, batch).to_dict()
        doc["schema"] = SCHEMA
        text = dumps(doc)
        profile_from_dict(json.loads(text), str(path))  # what the planner will read
        path.write_text(text)
        print(f"{name}: {len(doc['opgraph']['ops'])} distinct calls at local batch {batch}, "
              f"{len(text) / 1024:.0f} KiB, {time.monotonic() - start:.0f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
