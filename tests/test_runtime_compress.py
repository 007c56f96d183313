"""Gradient compression (core/compression_spec.py, runtime/compression/): parsing, the cost model,
top-k with error feedback, and real 2-worker gloo runs of every option (training, bytes,
exact resume). The torchrun scenario is this file's ``__main__`` (also used by
tests/test_runtime_selsync.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from kplan.core.compression_spec import (
    Compression,
    parse_compression,
    topk_collective,
    topk_count,
    wire_bytes,
)
from kplan.core.errors import InputError
from kplan.runtime import env

# --- parsing -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("none", Compression()),
        ("FP16", Compression("fp16")),
        ("bf16", Compression("bf16")),
        ("powersgd:4", Compression("powersgd", rank=4)),
        ("topk:0.01", Compression("topk", ratio=0.01)),
        ("topk:0.01:ar", Compression("topk", ratio=0.01, collective="ar")),
        ("adaptive", Compression("adaptive", ratio=0.1)),
        (
            "adaptive:0.002:0.05:ag",
            Compression("adaptive", ratio=0.05, collective="ag", min_ratio=0.002, max_ratio=0.05),
        ),
    ],
)
def test_parse_compression_round_trips(text: str, want: Compression) -> None:
    got = parse_compression(text)
    assert got == want
    assert parse_compression(got.spec()) == got


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("zip", "'zip' is not a compression"),
        ("topk", "expected topk:RATIO"),
        ("topk:0", "not a number in"),
        ("topk:1.5", "not a number in"),
        ("topk:nan", "not a number in"),
        ("topk:0.1:ring", "expected topk:RATIO"),
        ("powersgd", "rank must be an integer"),
        ("powersgd:0", "rank must be an integer"),
        ("fp16:2", "takes no parameters"),
        ("adaptive:0.1:0.01", "above MAX"),
        ("adaptive:0.1", "expected adaptive"),
    ],
)
def test_bad_compression_names_the_variable_and_hints(text: str, match: str) -> None:
    with pytest.raises(InputError, match=match) as err:
        env.compression({env.COMPRESSION: text})
    assert str(err.value).startswith("KPLAN_COMPRESSION=")
    assert "\n" not in str(err.value) and "topk:RATIO" in (err.value.hint or "")


def test_runtime_config_parses_and_env_overrides() -> None:
    import kplan.runtime as kr

    cfg = kr.RuntimeConfig(compression="topk:0.01:ag")
    assert cfg.compression == Compression("topk", ratio=0.01, collective="ag")
    over = kr.RuntimeConfig.from_env(cfg, {env.COMPRESSION: "powersgd:2"})
    assert over.compression == Compression("powersgd", rank=2)
    with pytest.raises(InputError, match="compression='topk:2'"):
        kr.RuntimeConfig(compression="topk:2")
    built = env.kplan_environ(compression=Compression("topk", ratio=0.01), sync_policy="every")
    assert built[env.COMPRESSION] == "topk:0.01:auto" and built[env.SYNC_POLICY] == "every"


def test_launcher_passes_the_plans_options_to_the_workers(tmp_path: Path) -> None:
    import dataclasses

    from kplan.launcher.bootstrap import worker_env
    from kplan.launcher.jobspec import JobSpec

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    spec = JobSpec.local(str(script), job_id="kp-compress", rdzv_port=29500)
    plain = worker_env(spec, str(tmp_path))
    assert env.COMPRESSION not in plain and env.SYNC_POLICY not in plain  # the script decides
    chosen = dataclasses.replace(
        spec,
        training=dataclasses.replace(
            spec.training, compression="topk:0.01:ar", sync_policy="selective:0.1"
        ),
    )
    got = worker_env(chosen, str(tmp_path))
    assert env.compression(got) == Compression("topk", ratio=0.01, collective="ar")
    assert got[env.SYNC_POLICY] == "selective:0.1"
    with pytest.raises(InputError, match="the plan's compression='topk:7'"):
        dataclasses.replace(spec, training=dataclasses.replace(spec.training, compression="topk:7"))


# --- the cost model ----------------------------------------------------------------------------


def test_topk_collective_cost_model() -> None:
    # 2 workers: AG sends 8k bytes in two all-gathers (values, indices: 2 latencies); AR sends
    # 4k (broadcast) + 4k (all-reduce) with 3 latencies: AG is never slower.
    two = topk_collective(10**7, 0.01, 2, 125e6, 1e-4)
    assert two.choice == "ag" and two.k == 10**5
    assert two.ag_s == pytest.approx(2e-4 + 8 * 1e5 / 125e6)
    assert two.ar_s == pytest.approx((1e-4 + 4e5 / 125e6) + 2e-4 + 4e5 / 125e6)
    # 8 workers, bandwidth-bound: AG's (n-1) x 8k bytes lose to AR's ~2 x 4k.
    eight = topk_collective(10**7, 0.01, 8, 125e6, 1e-4)
    assert eight.choice == "ar" and eight.ar_s < eight.ag_s
    # 8 workers, tiny k on a high-latency link: AG's 2 x 7 latencies beat AR's 14 + 3.
    assert topk_collective(10**4, 0.001, 8, 125e6, 5e-3).choice == "ag"
    assert topk_collective(10**4, 0.5, 1, 1e9, 1e-3).ar_s == 0.0


def test_wire_bytes_per_option() -> None:
    shapes = [(64, 16), (64,), (1, 64)]
    n = 2
    assert wire_bytes(Compression(), shapes, n) == 4 * (1024 + 64 + 64)
    assert wire_bytes(Compression("bf16"), shapes, n) == 2 * (1024 + 64 + 64)
    k = topk_count(1024, 0.05) + topk_count(64, 0.05) + topk_count(64, 0.05)
    assert k == 52 + 4 + 4
    assert wire_bytes(Compression("topk", ratio=0.05), shapes, n, "ag") == 8 * k
    assert wire_bytes(Compression("topk", ratio=0.05), shapes, n, "ar") == 2 * k + 4 * k
    # powersgd rank 1: the 64x16 matrix sends P (64) and Q (16); the others go dense
    assert wire_bytes(Compression("powersgd", rank=1), shapes, n) == 4 * (64 + 16 + 64 + 64)


# --- top-k with error feedback (pure pieces, no process group) ---------------------------------


def test_topk_error_feedback_bookkeeping_is_exact() -> None:
    import torch

    from kplan.runtime.compression.kernels import split_sent, topk_select

    gen = torch.Generator().manual_seed(1)
    residual = torch.zeros(1000)
    inputs = torch.zeros(1000, dtype=torch.float64)
    sent_total = torch.zeros(1000, dtype=torch.float64)
    for _ in range(30):
        g = torch.randn(1000, generator=gen)
        a = g + residual
        idx = topk_select(a, topk_count(1000, 0.03))
        assert idx.numel() == 30 and bool((idx[1:] > idx[:-1]).all())
        values, new_residual = split_sent(a, idx)
        # sent + residual = a, bit for bit; the residual is zero exactly where sent
        sent = torch.zeros(1000)
        sent[idx] = values
        assert torch.equal(sent + new_residual, a)
        assert bool((new_residual[idx] == 0).all())
        # the kept entries are the largest: none left behind is bigger than any sent
        assert float(new_residual.abs().max()) <= float(values.abs().min())
        residual = new_residual
        inputs += g.double()
        sent_total += sent.double()
    # nothing is lost: everything ever computed was sent or is still in the residual
    assert torch.allclose(sent_total + residual.double(), inputs, atol=1e-5, rtol=0)


def test_ar_and_ag_agree_when_workers_share_the_index_set() -> None:
    import torch

    from kplan.runtime.compression.kernels import combine_gathered, split_sent, topk_select

    gen = torch.Generator().manual_seed(2)
    support = torch.randperm(500, generator=gen)[:25]
    workers = []
    for _ in range(3):
        a = 0.01 * torch.randn(500, generator=gen)
        a[support] += 5.0 + torch.rand(25, generator=gen)  # the same dominant entries
        workers.append(a)
    k = 25
    ag = combine_gathered(
        500, [(topk_select(a, k), split_sent(a, topk_select(a, k))[0]) for a in workers], workers[0]
    )
    root_idx = topk_select(workers[1], k)  # AR: the designated worker's indices for all
    ar = torch.zeros(500)
    ar[root_idx] = sum(split_sent(a, root_idx)[0] for a in workers)
    assert torch.equal(torch.sort(root_idx).values, torch.sort(support).values)
    assert torch.allclose(ar, ag, atol=1e-6, rtol=0)
    # where the sets differ, AR sends the root's set of everyone's values: exactly those
    other = workers[0].clone()
    other[torch.arange(0, 500, 20)] = 50.0  # worker 0 now prefers other entries
    ar2 = torch.zeros(500)
    ar2[root_idx] = other[root_idx] + workers[1][root_idx] + workers[2][root_idx]
    dense = other + workers[1] + workers[2]
    assert torch.allclose(ar2[root_idx], dense[root_idx])


def test_adaptive_ratio_rule() -> None:
    from kplan.runtime.compression.adaptive import AdaptiveRatio

    rule = AdaptiveRatio(0.01, 0.1, window=4)
    ratios = []
    for _ in range(5):  # compression loses little: halve per window down to MIN
        closed = [rule.observe(1.0, 0.9) for _ in range(4)]
        assert closed[:3] == [None] * 3 and closed[3] == pytest.approx(0.9)  # the window's G
        ratios.append(rule.ratio)
    assert ratios == [0.05, 0.025, 0.0125, 0.01, 0.01]
    closed = [rule.observe(1.0, 0.5) for _ in range(4)]  # in the dead band: keep
    assert rule.ratio == 0.01 and closed[-1] == pytest.approx(0.5)
    for _ in range(3 * 4):  # compression loses much: double, up to MAX
        rule.observe(1.0, 0.1)
    assert rule.ratio == 0.08
    state = rule.state_dict()
    rule.observe(1.0, 0.1)
    again = AdaptiveRatio(0.01, 0.1, window=4)
    again.load_state_dict(state)
    again.observe(1.0, 0.1)
    assert again.state_dict() == rule.state_dict()


# --- real 2-worker gloo runs -------------------------------------------------------------------

OPTIONS = [
    "none",
    "fp16",
    "bf16",
    "powersgd:1",
    "topk:0.05:ag",
    "topk:0.05:ar",
    "topk:0.05:auto",
    "adaptive:0.01:1",
    "topk:1:ag",
    "topk:1:ar",
    "topk:0.05:ar@every@manual",  # after backward (the profile sweep's path)
    "powersgd:1@every@manual",
]


def run_phases(
    tmp: Path, options: list[str], phases: list[tuple[str, int, Path | None]], nproc: int = 2
) -> dict[str, list[Any]]:
    """Run the scenario's ``(tag, max_steps, checkpoint root)`` phases one after the other in
    one torchrun (``nproc`` gloo workers); per tag, each rank's results per option."""
    from bench.runtime_common import clean_env, torchrun

    spec = ",".join(f"{tag}|{steps}|{ckpt or '-'}" for tag, steps, ckpt in phases)
    args = ["train", str(tmp), ",".join(options), spec]
    proc = torchrun(args, clean_env(), nproc=nproc, script=Path(__file__), timeout=170)
    assert proc.returncode == 0, proc.stdout[-4000:]
    import torch

    ranks = range(nproc)
    return {tag: [torch.load(tmp / f"{tag}.rank{r}.pt") for r in ranks] for tag, _, _ in phases}


def run_scenario(tmp: Path, options: list[str], steps: int, tag: str, ckpt: Path | None) -> Any:
    """One phase (:func:`run_phases`)."""
    return run_phases(tmp, options, [(tag, steps, ckpt)])[tag]


@pytest.mark.slow
def test_every_option_trains_like_dense_and_counts_its_bytes(tmp_path: Path) -> None:
    import torch

    res = run_scenario(tmp_path, OPTIONS, 96, "train", None)
    dense = res[0]["none"]["eval_loss"]
    assert dense < 0.5 * res[0]["none"]["initial_loss"]  # it trained
    for name in OPTIONS:
        r0, r1 = res[0][name], res[1][name]
        # replicas stay identical (every rank sums in the same order)
        assert torch.equal(r0["params"], r1["params"]), name
        assert r0["eval_loss"] <= 1.1 * dense + 0.02, (name, r0["eval_loss"], dense)
    for name in ("topk:1:ag", "topk:1:ar"):  # k = numel: exactly the weighted dense average
        diff = (res[0][name]["params"] - res[0]["none"]["params"]).abs().max()
        assert float(diff) < 1e-6, name
    # bytes_sent counted on compressed steps = compress.wire_bytes for the model's shapes
    shapes = res[0]["none"]["shapes"]
    for name, collective in [("topk:0.05:ag", "ag"), ("topk:0.05:ar", "ar"), ("none", "ag")]:
        recs = [r for r in res[0][name]["records"] if r["compression"] != "none" or name == "none"]
        assert recs, name
        want = wire_bytes(parse_compression(name), shapes, 2, collective)  # type: ignore[arg-type]
        assert all(r["bytes_sent"] == pytest.approx(want) for r in recs), name
    auto = {c for r in res[0]["topk:0.05:auto"]["records"] for c in (r["collective"] or [])}
    assert auto <= {"ar", "ag"} and auto
    # lossy options: a dense step (the GNS sample) every 10 steps, compressed otherwise
    recs = res[0]["powersgd:1"]["records"]
    assert [r["compression"] for r in recs[:11]] == ["none"] + ["powersgd:1"] * 9 + ["none"]
    assert all(r["compress_ratio"] > 5 for r in recs[1:10])
    # the P round is waited for inside the hook (timed on CPU); AG-Topk waits for nothing
    assert all(r["blocked_s"] > 0 for r in recs[1:10])
    assert "blocked_s" not in recs[0]  # a dense step
    ag = [r for r in res[0]["topk:0.05:ag"]["records"] if r["compression"] != "none"]
    assert ag and all(r["blocked_s"] == 0.0 for r in ag)
    assert res[0]["powersgd:1"]["gns"] is not None
    # the adaptive ratio moves on the measured gain. At MAX = 1 the first window's gain is 1
    # exactly (nothing dropped), so it halves; at 0.5 this job's gain is 0.94 (measured), far
    # above the 0.7 that halves again. (At 0.2 the gain is 0.62-0.71: too close to 0.7 to test.)
    ratios = [r["topk_ratio"] for r in res[0]["adaptive:0.01:1"]["records"]]
    seen = [r for i, r in enumerate(ratios) if i == 0 or r != ratios[i - 1]]
    assert seen[:3] == [1.0, 0.5, 0.25], seen
    # each closed window is reported on its step: its gain and the ratio the next step uses
    recs = res[0]["adaptive:0.01:1"]["records"]
    closes = [i for i, r in enumerate(recs) if "compress_gain" in r]
    assert len(closes) >= 3 and recs[closes[0]]["compress_gain"] == pytest.approx(1.0)
    assert [recs[i]["next_topk_ratio"] for i in closes[:2]] == [0.5, 0.25]
    assert all(recs[i + 1]["topk_ratio"] == recs[i]["next_topk_ratio"] for i in closes[:-1])
    # a window is 20 compressed steps (every 10th step is a dense GNS sample)
    compressed = [i for i, r in enumerate(recs) if r["compression"] != "none"]
    assert closes[:2] == [compressed[19], compressed[39]]


@pytest.mark.slow
def test_three_workers_rotate_the_ar_root_and_stay_identical(tmp_path: Path) -> None:
    import torch

    options = ["none", "topk:1:ar", "topk:1:ag", "topk:0.05:ar", "topk:0.05:ag", "powersgd:1"]
    res = run_phases(tmp_path, options, [("three", 24, None)], nproc=3)["three"]
    for name in options:
        for rank in (1, 2):
            assert torch.equal(res[0][name]["params"], res[rank][name]["params"]), (name, rank)
        assert res[0][name]["eval_loss"] < 0.7 * res[0][name]["initial_loss"], name
    for name in ("topk:1:ar", "topk:1:ag"):  # split (16, 24, 24): the weighted dense average
        diff = (res[0][name]["params"] - res[0]["none"]["params"]).abs().max()
        assert float(diff) < 1e-6, name
    # AR's designated worker rotates (step mod 3), so AR and AG differ at a ratio < 1
    assert not torch.equal(res[0]["topk:0.05:ar"]["params"], res[0]["topk:0.05:ag"]["params"])


@pytest.mark.slow
def test_exact_resume_with_error_feedback(tmp_path: Path) -> None:

    options = ["topk:0.05:ar", "topk:0.05:ag", "powersgd:1", "adaptive:0.01:0.2:auto"]
    # the uninterrupted run, and a run that stops at 17 with a checkpoint; then a new process
    # resumes it
    first = run_phases(tmp_path, options, [("ref", 34, tmp_path / "r"), ("a", 17, tmp_path / "c")])
    ref = first["ref"]
    got = run_scenario(tmp_path, options, 34, "part2", tmp_path / "c")  # resumes at 17
    auto = "adaptive:0.01:0.2:auto"
    for rank in (0, 1):
        # auto's exchange, measured at the start of each run, is restored from the checkpoint,
        # not measured again by the resumed process
        assert got[rank][auto]["exchange_pairs"] == first["a"][rank][auto]["exchange_pairs"]
    for name in options:
        assert got[0][name]["resumed_at"] == 17, name
        if name == auto and ref[0][name]["exchange"] != first["a"][0][name]["exchange"]:
            # the reference run measured the other collective faster at its start: a run
            # that differs from the resumed one by its own choice, not by the resume
            continue
        for rank in (0, 1):
            diff = (got[rank][name]["params"] - ref[rank][name]["params"]).abs().max()
            assert float(diff) <= 1e-6, (name, rank, float(diff))
            # the residuals are really there (the test is not vacuous)
            assert got[rank][name]["residual_norm"] > 0, name


def test_a_failed_round_fails_its_own_future_and_a_new_step_drops_leftovers(
    tmp_path: Path,
) -> None:
    """A round decoded by the caller whose collective failed hands the error to that round's
    future (where DDP waits), not to the hook that found it; a step that failed part-way
    leaves no rounds for the next one to decode."""
    import torch
    import torch.distributed as dist

    from kplan.runtime.compression.compressor import Compressor
    from kplan.runtime.distributed import Context

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        ctx = Context(
            rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo"
        )
        comp = Compressor(parse_compression("fp16"), [torch.zeros(10)], ctx)
        assert comp.decodes_on_caller
        comp.begin_step(1, dense=False)
        failed: torch.futures.Future[Any] = torch.futures.Future()
        failed.set_exception(RuntimeError("connection reset by peer"))

        class Work:
            def get_future(self) -> torch.futures.Future[Any]:
                return failed

        first = comp._launch([Work()], lambda _: torch.ones(1))
        assert not first.done()  # waits for the caller
        second = comp.reduce(torch.full((10,), 3.0), [0], final=True)
        with pytest.raises(RuntimeError, match="connection reset"):
            first.wait()
        assert torch.equal(second.wait(), torch.full((10,), 3.0))  # its own round is fine
        comp.reduce(torch.ones(10), [0], final=False)
        comp.begin_step(2, dense=False)
        assert not comp._pending
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_cpu_rounds_are_decoded_by_the_caller_with_the_callbacks_results(tmp_path: Path) -> None:
    """On CPU each round's decode runs on the thread that calls reduce (the next bucket's hook,
    or the step's last one), not as a callback on gloo's thread (Compressor.decodes_on_caller):
    with buckets of ~500 bytes (two a step) the rounds are really deferred, every decode runs
    on the main thread, and the parameters equal those of the callback path bit for bit."""
    import torch

    from bench.runtime_common import clean_env, torchrun

    options = ["powersgd:1", "topk:0.05:ag", "topk:0.05:ar", "fp16"]
    args = ["decode", str(tmp_path), ",".join(options)]
    proc = torchrun(args, clean_env(), nproc=2, script=Path(__file__), timeout=170)
    assert proc.returncode == 0, proc.stdout[-4000:]
    for rank in (0, 1):
        res = torch.load(tmp_path / f"decode.rank{rank}.pt")
        for name in options:
            caller, callback = res[name]["caller"], res[name]["callback"]
            assert caller["deferred"] > 0, name  # a later hook decoded an earlier bucket
            assert caller["decoded_on_main"] == caller["decodes"] > 0, name
            assert callback["decoded_on_main"] < callback["decodes"], name  # gloo's threads
            assert torch.equal(caller["params"], callback["params"]), (name, rank)


# --- scenario run by torchrun (not by pytest) ---------------------------------------------------


def _decode(folder: Path, options: list[str]) -> None:
    """Train each option with small DDP buckets (two a step), its rounds decoded by the caller
    (the CPU default) and as callbacks; count where the decodes ran."""
    import threading

    import torch
    import torch.nn.functional as F

    import kplan.runtime as kr
    from bench.runtime_worker import make_data, make_model
    from kplan.runtime.compression import compressor as rc

    ctx = kr.init()
    data = make_data(512, 16, 0, 0.5)
    main = threading.get_ident()
    seen = {"decodes": 0, "decoded_on_main": 0, "deferred": 0}
    launch, reduce = rc.Compressor._launch, rc.Compressor.reduce

    def counted_launch(self: Any, works: Any, then: Any) -> Any:
        def decode(x: Any) -> Any:
            seen["decodes"] += 1
            seen["decoded_on_main"] += threading.get_ident() == main
            return then(x)

        return launch(self, works, decode)

    def counted_reduce(self: Any, *a: Any, **kw: Any) -> Any:
        seen["deferred"] += len(self._pending)
        return reduce(self, *a, **kw)

    rc.Compressor._launch = counted_launch  # type: ignore[method-assign]
    rc.Compressor.reduce = counted_reduce  # type: ignore[method-assign]
    result: dict[str, Any] = {}
    for name in options:
        result[name] = {}
        for mode in ("caller", "callback"):
            rc.Compressor.decodes_on_caller = property(  # type: ignore[method-assign]
                lambda self, on=mode == "caller": on
            )
            seen.update(decodes=0, decoded_on_main=0, deferred=0)
            torch.manual_seed(0)
            model = make_model("mlp", 16, 32)
            cfg = kr.RuntimeConfig(compression=name, pid=None, lr_scaling="none", max_steps=8)
            job = kr.Job(
                model,
                torch.optim.SGD(model.parameters(), lr=0.02),
                data,
                batch_size=64,
                config=cfg,
                ddp_kwargs={"bucket_cap_mb": 0.0005},  # ~500 bytes: the MLP in two buckets
            )
            for _ in job.epochs(1):
                for x, y in job.batches():
                    with job.step():
                        job.backward(F.mse_loss(job.model(x), y))
            params = torch.cat([p.detach().reshape(-1) for p in job.module.parameters()])
            result[name][mode] = {"params": params, **seen}
    torch.save(result, folder / f"decode.rank{ctx.rank}.pt")


def _phases(folder: Path, options: list[str], phases: list[str]) -> None:
    for phase in phases:
        tag, steps, ckpt = phase.split("|")
        _train(folder / f"{tag}.pt", int(steps), options, ckpt)


def _train(out: Path, steps: int, options: list[str], ckpt_root: str) -> None:
    import torch
    import torch.nn.functional as F

    import kplan.runtime as kr
    from bench.runtime_worker import make_data, make_model

    ctx = kr.init()
    data = make_data(3072, 16, 0, 0.5)
    x_all, y_all = data.tensors
    result: dict[str, Any] = {}
    for name in options:
        compression, policy, sync = [*name.split("@"), "", ""][:3]
        torch.manual_seed(0)
        model = make_model("mlp", 16, 32)
        opt = torch.optim.SGD(model.parameters(), lr=0.02)
        folder = None if ckpt_root == "-" else Path(ckpt_root) / name.replace(":", "_")
        metrics = out.with_name(f"{out.stem}-{name.replace(':', '_')}.jsonl")
        metrics.unlink(missing_ok=True)
        cfg = kr.RuntimeConfig(
            compression=compression,
            sync_policy=policy or "every",
            sync=sync or "overlap",  # type: ignore[arg-type]
            max_local_batch=16 if ctx.rank == 0 else None,  # unequal split (16, 48)
            pid=None,
            lr_scaling="none",
            max_steps=steps,
            checkpoint_dir=folder,
            checkpoint_steps=10 if folder else 0,
            metrics_path=metrics,
        )
        with torch.no_grad():
            initial = float(F.mse_loss(model(x_all), y_all))
        job = kr.Job(model, opt, data, batch_size=64, config=cfg)
        resumed = job.step_count if job.step_count else None
        for _ in job.epochs(3):
            for x, y in job.batches():
                with job.step():
                    job.backward(F.mse_loss(job.model(x), y))
        with torch.no_grad():
            final = float(F.mse_loss(job.module(x_all), y_all))
        comp = job._state.compressor
        residual = 0.0
        if comp is not None:
            residual = sum(float(t.norm()) for t in [*comp.residual.values(), *comp.error.values()])
        records = [
            r
            # whole lines only: the other ranks may be writing their last records to this file
            for r in (json.loads(line) for line in metrics.read_text().split("\n")[:-1])
            if "event" not in r and r["rank"] == ctx.rank
        ]
        result[name] = {
            "params": torch.cat([p.detach().reshape(-1) for p in job.module.parameters()]),
            "shapes": [tuple(p.shape) for p in job.module.parameters()],
            "eval_loss": final,
            "initial_loss": initial,
            "resumed_at": resumed,
            "residual_norm": residual,
            "gns": job.gns,
            "records": records,
            "exchange": None if comp is None or comp.exchange is None else comp.exchange.choice,
            "exchange_pairs": None if comp is None or comp.exchange is None else (
                comp.exchange.ar_s, comp.exchange.ag_s, comp.exchange.ar_wins
            ),
        }  # fmt: skip
    torch.save(result, out.with_name(f"{out.stem}.rank{ctx.rank}.pt"))


if __name__ == "__main__":
    if sys.argv[1] == "train":
        _phases(Path(sys.argv[2]), sys.argv[3].split(","), sys.argv[4].split(","))
    elif sys.argv[1] == "decode":
        _decode(Path(sys.argv[2]), sys.argv[3].split(","))
    else:
        raise SystemExit(f"unknown scenario {sys.argv[1]!r}")
