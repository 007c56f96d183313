"""Trace one training step at the dispatcher into an ``OpGraph`` (kplan/planner/opgraph.py).

A ``TorchDispatchMode`` sees every aten call of the step after autocast has chosen its dtype,
whatever the device: real CPU or CUDA tensors, or fake ones (``FakeTensorMode``: shapes and
dtypes only, backed by the ``meta`` device, so a ResNet-50 step at batch 256 traces in a second
without memory or a GPU). Each call becomes an ``OpCall`` (kplan/profiler/opgraph_ops.py says
how calls are classified and counted); identical calls are folded.

The phase of a call is where in the step it ran: ``forward`` until the autograd engine runs its
first node, ``backward`` from then (the work after the engine and before the optimizer, such as
gradient unscaling or norms, included), ``optimizer`` from the optimizer's ``step()`` on (global
optimizer hooks mark it).

- ``trace_step(run_step, ...)``: trace a step the caller runs (any model, any device).
- ``trace_model(build, batch, loss, optimizer, ...)``: build the model on fake (meta) tensors and
  trace forward, loss, backward and the optimizer under the precision's autocast.
- ``JobTracer``: what ``kplan profile``'s workers hand the runtime (``set_step_tracer``): it
  traces one step of the user's own job and writes the graph where the profiler reads it.

torch is imported only inside the functions (it is an optional extra).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kplan.core.errors import DataFileError
from kplan.planner.opgraph import MAX_OPS, OpCall, OpGraph, fold, opgraph_from_dict
from kplan.planner.profile import Profile

OPGRAPH_PATH_ENV = "KPLAN_PROFILE_OPGRAPH"  # where a profile's rank 0 writes the traced graph
_AUTOCAST = {"bf16": "bfloat16", "fp16": "float16"}


@contextlib.contextmanager
def recording(precision: str) -> Iterator[list[OpCall]]:
    """Record the aten calls made inside the block (this thread and the autograd engine's) into
    the yielded list; the optimizer phase is marked by a global optimizer step pre-hook."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from kplan.profiler.opgraph_ops import Recorder

    recorder = Recorder(tf32=precision == "tf32")
    handle = register_optimizer_step_pre_hook(recorder.optimizer_starts)
    try:
        with recorder:
            yield recorder.calls
    finally:
        handle.remove()


def graph_of(calls: list[OpCall], local_batch: int, precision: str, how: str) -> OpGraph:
    """The folded graph; past ``MAX_OPS`` distinct calls the smallest are summed into one
    ``other`` call per phase (said in ``how``)."""
    ops = sorted(fold(calls), key=lambda o: (-(o.flops + o.bytes) * o.count, o.key()))
    if len(ops) > MAX_OPS:
        kept, rest = list(ops[: MAX_OPS - 3]), ops[MAX_OPS - 3 :]
        for phase in ("forward", "backward", "optimizer"):
            part = [o for o in rest if o.phase == phase]
            if part:
                elements = sum(o.dims[0] * o.count if o.kind == "other" else o.count for o in part)
                kept.append(OpCall("other", "summed", phase, "fp32", (min(elements, 2**40),),
                                   sum(o.flops * o.count for o in part),
                                   sum(o.bytes * o.count for o in part)))  # fmt: skip
        how += f"; {len(rest)} smallest distinct calls summed into 'other'"
        ops = kept
    return OpGraph(ops=tuple(ops), local_batch=local_batch, precision=precision, how=how[:512])


def trace_step(
    run_step: Callable[[], Any], *, local_batch: int, precision: str, how: str
) -> OpGraph:
    """Run ``run_step`` (forward, loss, backward, optimizer step) once under the recorder."""
    with recording(precision) as calls:
        run_step()
    return graph_of(calls, local_batch, precision, how)


def trace_model(
    build: Callable[[], Any],
    make_batch: Callable[[int], Any],
    loss_of: Callable[[Any, Any], Any],
    make_optimizer: Callable[[Any], Any],
    *,
    local_batch: int,
    precision: str = "fp32",
    device: str = "meta",
) -> OpGraph:
    """Trace one step of ``build()`` at ``local_batch``: ``loss_of(model, batch)`` under the
    precision's autocast, its backward, then ``make_optimizer(parameters).step()``; the traced
    step is the second (the first creates the optimizer's state, which later steps do not).

    ``device="meta"``: parameters and data are fake tensors (no memory; CPU autocast rules);
    ``"cpu"`` or ``"cuda"``: real tensors on that device."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake = FakeTensorMode(allow_non_fake_inputs=True) if device == "meta" else None
    where = "cpu" if device == "meta" else device
    with fake if fake is not None else contextlib.nullcontext():
        model = build() if fake is not None else build().to(where)
        model.train()
        batch = _to(make_batch(local_batch), where)
        optimizer = make_optimizer(model.parameters())
        cast_type = "cuda" if where.startswith("cuda") else "cpu"
        cast = _AUTOCAST.get(precision)

        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(cast_type, dtype=getattr(torch, cast or "float32"),
                                enabled=cast is not None):  # fmt: skip
                loss = loss_of(model, batch)
            loss.backward()
            optimizer.step()

        step()  # one untraced step first: the optimizer's state exists, as in training
        tool = "FakeTensorMode (meta storage, CPU autocast rules)" if fake else device
        how = (
            f"traced on {tool} with a TorchDispatchMode: one step (forward, loss, backward, "
            f"{type(optimizer).__name__} step) at local batch {local_batch}, {precision}"
        )
        return trace_step(step, local_batch=local_batch, precision=precision, how=how)


def _to(batch: Any, device: str) -> Any:
    if hasattr(batch, "to"):
        return batch.to(device)
    if isinstance(batch, list | tuple):
        return type(batch)(_to(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to(v, device) for k, v in batch.items()}
    return batch


class JobTracer:
    """The factory ``kplan.profiler.worker`` registers with the runtime
    (``kplan.runtime.profile_steps.set_step_tracer``): the runtime calls it with the step's local
    batch at the first step of the profile's GNS phase (the base local batch; with ``--gns-steps
    0``, the first step at that batch in the sweep) on rank 0 and runs that step inside the
    returned context; on leaving, the graph is written to ``path``."""

    def __init__(self, path: Path, precision: str) -> None:
        self.path = path
        self.precision = precision

    @contextlib.contextmanager
    def __call__(self, local_batch: int) -> Iterator[None]:
        import torch

        with recording(self.precision) as calls:
            yield
        device = "cuda" if torch.cuda.is_available() else "cpu"
        how = (
            f"traced on {device} with a TorchDispatchMode inside kplan profile: one step of "
            f"the job (forward, backward, optimizer) at local batch {local_batch} on rank 0"
        )
        if not calls:
            return
        doc = graph_of(calls, local_batch, self.precision, how).to_dict()
        tmp = self.path.with_name(f".{self.path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.path)


def opgraph_path(workdir: Path) -> Path:
    """Where a profile's rank 0 writes the graph it traced."""
    return workdir / "opgraph.json"


def install_job_tracer() -> None:
    """In a profile's worker, before the script runs: register the step tracer with the
    runtime when the profiler asked for a graph (``KPLAN_PROFILE_OPGRAPH``)."""
    path = os.environ.get(OPGRAPH_PATH_ENV)
    if not path:
        return
    from kplan.runtime import env as runtime_env
    from kplan.runtime.profile_steps import set_step_tracer

    set_step_tracer(JobTracer(Path(path), runtime_env.precision() or "fp32"))


def read_traced(path: Path) -> OpGraph | None:
    """The graph a profile's worker wrote, or None when it wrote none."""
    if not path.is_file():
        return None
    return opgraph_from_dict(json.loads(path.read_text()), str(path))


def with_opgraph(profile: Profile, workdir: Path) -> Profile:
    """The profile with the graph its job's rank 0 traced, said in the provenance; unchanged
    (and said so) when none was traced or it cannot be read."""
    try:
        graph = read_traced(opgraph_path(workdir))
    except (OSError, ValueError, DataFileError) as err:
        note = f"; operator graph not recorded ({str(err)[:120]})"
        return dataclasses.replace(profile, provenance=profile.provenance + note)
    if graph is None:
        note = "; operator graph not traced (the step to trace, at the GNS batch, never ran)"
        return dataclasses.replace(profile, provenance=profile.provenance + note)
    note = (
        f"; operator graph of one step at local batch {graph.local_batch}: "
        f"{len(graph.ops)} distinct calls, {graph.total('flops') / 1e9:.3g} GFLOP"
    )
    return dataclasses.replace(profile, opgraph=graph, provenance=profile.provenance + note)
