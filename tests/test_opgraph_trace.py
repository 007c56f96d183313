"""The dispatcher tracer (kplan/profiler/opgraph_trace.py): classes, counts, phases, dtypes."""

from __future__ import annotations

import resource
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kplan.planner.opgraph import opgraph_from_dict  # noqa: E402
from kplan.profiler.opgraph_trace import JobTracer, read_traced, trace_model  # noqa: E402

B, D_IN, HIDDEN, D_OUT = 8, 16, 32, 4


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(D_IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, D_OUT)
    )


def _batch(b: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(b, D_IN), torch.randint(0, D_OUT, (b,))


def _loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])


def _sgd(params: object) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=True)  # type: ignore[arg-type]


def _trace(precision: str = "fp32", device: str = "meta"):  # type: ignore[no-untyped-def]
    return trace_model(_mlp, _batch, _loss, _sgd, local_batch=B, precision=precision, device=device)


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_two_layer_mlp_exact_matmuls_and_optimizer(device: str) -> None:
    g = _trace(device=device)
    mats = Counter(
        (o.phase, o.op, o.dims) for o in g.ops for _ in range(o.count) if o.kind == "matmul"
    )
    assert mats == Counter(
        {
            ("forward", "aten.addmm", (1, B, HIDDEN, D_IN)): 1,
            ("forward", "aten.addmm", (1, B, D_OUT, HIDDEN)): 1,
            ("backward", "aten.mm", (1, D_OUT, HIDDEN, B)): 1,  # weight gradient, layer 2
            ("backward", "aten.mm", (1, B, HIDDEN, D_OUT)): 1,  # input gradient of layer 2
            ("backward", "aten.mm", (1, HIDDEN, D_IN, B)): 1,  # weight gradient, layer 1
        }
    )
    forward = next(o for o in g.ops if o.op == "aten.addmm" and o.dims[2] == HIDDEN)
    assert forward.flops == 2 * B * HIDDEN * D_IN
    assert forward.bytes == 4 * (HIDDEN + B * D_IN + D_IN * HIDDEN + B * HIDDEN)
    params = D_IN * HIDDEN + HIDDEN + HIDDEN * D_OUT + D_OUT
    opt = [o for o in g.ops if o.phase == "optimizer"]
    assert opt and all(o.kind == "optimizer" for o in opt)
    # steady-state SGD with momentum: buf = m*buf + g, then p -= lr*buf, each over every tensor
    assert {o.dims for o in opt} == {(params,)}
    assert sum(o.count for o in opt if o.op.startswith("aten._foreach_add_")) == 2
    kinds = {(o.phase, o.kind) for o in g.ops}
    assert {("forward", "elementwise"), ("backward", "elementwise")} <= kinds  # relu and its grad
    assert ("forward", "softmax") in kinds and ("backward", "reduction") in kinds  # bias grads
    assert not any(o.op in ("aten.t", "aten.view", "aten.detach") for o in g.ops)


def test_bf16_autocast_gives_the_real_dtypes() -> None:
    g = _trace("bf16")
    assert {o.dtype for o in g.ops if o.kind == "matmul"} == {"bf16"}
    assert {o.dtype for o in g.ops if o.kind == "softmax"} == {"fp32"}  # autocast keeps fp32
    assert {o.dtype for o in g.ops if o.kind == "optimizer"} == {"fp32"}  # fp32 master weights
    mm = next(o for o in g.ops if o.op == "aten.addmm" and o.dims[2] == HIDDEN)
    assert mm.bytes == 2 * (HIDDEN + B * D_IN + D_IN * HIDDEN + B * HIDDEN)
    assert {o.dtype for o in _trace("tf32").ops if o.kind == "matmul"} == {"tf32"}


def test_meta_tracing_allocates_nothing() -> None:
    width = 40_000  # 6.4 GB of weights, as much again of gradients and of momentum
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    g = trace_model(
        lambda: torch.nn.Linear(width, width),
        lambda b: (torch.randn(b, width), torch.randn(b, width)),
        lambda m, batch: torch.nn.functional.mse_loss(m(batch[0]), batch[1]),
        _sgd,
        local_batch=64,
    )
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 500_000
    fwd = next(o for o in g.ops if o.phase == "forward" and o.kind == "matmul")
    assert fwd.flops == 2 * 64 * width * width


def test_folded_record_round_trips() -> None:
    g = _trace()
    again = opgraph_from_dict(g.to_dict(), "test")
    assert again == g
    assert len({o.key() for o in g.ops}) == len(g.ops)  # folded: each key once


def test_job_tracer_writes_the_step_it_wraps(tmp_path: Path) -> None:
    model = _mlp()
    opt = _sgd(model.parameters())
    path = tmp_path / "opgraph.json"
    with JobTracer(path, "fp32")(B):
        _loss(model, _batch(B)).backward()
        opt.step()
    g = read_traced(path)
    assert g is not None and g.local_batch == B
    assert {o.phase for o in g.ops} == {"forward", "backward", "optimizer"}
    assert read_traced(tmp_path / "missing.json") is None


@pytest.mark.slow
def test_kplan_profile_records_the_jobs_graph() -> None:
    from kplan.profiler.run import resolve, run_profile

    req = resolve(
        None,
        "mlp-regression",
        workers=1,
        max_local_batch=8,
        warmup_steps=0,
        steps_per_batch=1,
        gns_steps=1,
        allreduce_bench=False,
        measure_device=False,
    )
    profile = run_profile(req).profile
    g = profile.opgraph
    assert (
        g is not None
        and g.local_batch == 8
        and "operator graph of one step" in (profile.provenance)
    )
    assert {o.phase for o in g.ops} == {"forward", "backward", "optimizer"}
    assert any(o.kind == "matmul" and o.dims[1] == 8 for o in g.ops if o.phase == "forward")


def test_the_traced_step_is_the_gns_batchs_first_even_without_a_gns_phase() -> None:
    """``--gns-steps 0`` (no GNS phase) traces the first sweep step at the GNS batch (a warm-up
    step); with a GNS phase, its first step, as before. Before: no graph without a GNS phase."""
    from kplan.runtime.env import ProfileSchedule
    from kplan.runtime.profile_mode import ProfileRun

    def traced(schedule: ProfileSchedule) -> list[tuple[str, int, bool]]:
        run, out = ProfileRun(schedule), []
        while not run.done:
            if run.trace_now():
                out.append((run.phase.name, run.phase.local_batch, run.warmup))
            run.step_done()
        return out

    assert traced(ProfileSchedule((1, 2, 4, 8), 2, 3, 4, 0)) == [("sweep", 4, True)]
    assert traced(ProfileSchedule((1, 2, 4, 8), 2, 3, 6, 0)) == [("sweep", 4, True)]
    assert traced(ProfileSchedule((1, 2, 4, 8), 2, 3, 4, 5)) == [("gns", 4, False)]


@pytest.mark.slow
def test_kplan_profile_with_no_gns_steps_still_records_the_graph() -> None:
    from kplan.profiler.run import resolve, run_profile

    req = resolve(
        None, "mlp-regression", workers=1, max_local_batch=8, warmup_steps=1,
        steps_per_batch=1, gns_steps=0, allreduce_bench=False, measure_device=False,
    )  # fmt: skip
    profile = run_profile(req).profile
    g = profile.opgraph
    assert g is not None and g.local_batch == 8, profile.provenance
    assert {o.phase for o in g.ops} == {"forward", "backward", "optimizer"}


def test_causal_attention_counts_the_pairs_it_computes() -> None:
    """A causal mask keeps L(L+1)/2 of the L^2 (query, key) pairs, forward and backward."""
    from kplan.profiler.opgraph_ops import causal_pairs
    from kplan.profiler.opgraph_trace import recording

    bh, length, hd = 4, 64, 16
    flops: dict[tuple[bool, str], float] = {}
    for causal in (False, True):
        q, k, v = (torch.randn(1, bh, length, hd, requires_grad=True) for _ in range(3))
        with recording("fp32") as calls:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            out.sum().backward()
        att = [c for c in calls if c.kind == "attention"]
        if not att:
            pytest.skip("no fused attention kernel on the CPU in this torch")
        for c in att:
            assert c.dims == (bh, length, length, hd)
            flops[(causal, c.phase)] = flops.get((causal, c.phase), 0.0) + c.flops
    dense = 4.0 * bh * length * length * hd
    assert flops[(False, "forward")] == dense
    assert flops[(False, "backward")] == 2 * dense
    assert flops[(True, "forward")] == dense * causal_pairs(length, length) / length**2
    assert flops[(True, "backward")] == 2 * flops[(True, "forward")]
    assert causal_pairs(4, 4) == 10 and causal_pairs(2, 5) == 3 and causal_pairs(5, 2) == 9
