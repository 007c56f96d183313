"""The plan of a local job: this machine as an instance type of its own ("local").

``kplan launch SCRIPT --profile p.json`` (local) predicts, before anything starts, the step
time, time to train and cost of the job on this machine with the planner's own model: the
profile's fitted compute and all-reduce terms (``workload_from_profile``), the statistical
efficiency of its GNS at the batch the job runs, and ``planner.costs`` for the time and dollars
(no preemptions; priced at ``--price`` USD/h for the whole machine, default 0). Every worker
group of a local job runs on this one machine, so a job of ``n`` groups of ``w`` workers is
predicted as ``n * w`` workers on one node (the profiler's own workers talk the same way: gloo
over the loopback). The result is a ``Plan`` (chosen row ``cloud: local``,
catalog ``local``), stored with the job so ``kplan report`` compares it with what happened.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from kplan.core.errors import InputError
from kplan.core.threads import oversubscription, threads_per_worker, usable_cores
from kplan.launcher.jobspec import LOCAL_CHECK_INTERVAL_S
from kplan.planner.plan import Group, LocalMachine, Plan, PlanRow, SpotTerms
from kplan.planner.profile import Profile

if TYPE_CHECKING:
    from kplan.planner.catalog import GpuSpec
    from kplan.planner.workload import Workload

# Start of a local job before its first step: the launcher, torchrun, the workers' Python and
# torch imports (NOTES.md: a whole 2-process gloo run takes ~5 s, mostly imports) and the
# elastic rendezvous's last call (JobSpec.local: rdzv_last_call_s 5 s). An assumption, as the
# cloud's provisioning_s is; the report shows the actual start.
LOCAL_START_S = 10.0
# Its log-space sigma: wide, since it is not measured (torch's imports alone take 2-30 s with
# the disk cache and the machine's load; a README launch on a busy 2-core machine started in
# about 35 s). p90 = 10 s x exp(1.28 x 0.9) = 32 s.
LOCAL_START_LOG_SIGMA = 0.9
# A start the profile measured (Profile.startup_s: its torchrun, imports and rendezvous to the
# first step, on this machine) plus the launcher's own part: with several worker groups, the
# others start at the launcher's first tick after the head runs (JobSpec.local's check interval,
# LOCAL_CHECK_INTERVAL_S), and the rendezvous waits for them. Its sigma is narrower than the
# assumption's, but not small: one measurement, on a machine whose load varies (assumed).
MEASURED_START_LOG_SIGMA = 0.35
# The end of a local job after its last step, when the profile did not measure its own
# (Profile.shutdown_s): the workers' and torchrun's exit, assumed (a whole 2-process gloo run's
# imports and exit take ~5 s, NOTES.md); its sigma as the assumed start's.
LOCAL_SHUTDOWN_S = 2.0
# The convention of the scripts kplan ships (kplan/examples/*.py, docs/profile.md): the epochs
# to train are the script's own ``--epochs N`` (argparse: ``--epochs N`` or ``--epochs=N``, the
# last one wins). A script that states none runs its own default, which kplan cannot see.
SCRIPT_EPOCHS_FLAG = "--epochs"
# Uncertainty added per doubling of the worker count past the profile's (the CPU cores and
# memory bandwidth are shared by every worker of a local job: contention the fit never saw).
WORKER_EXTRAPOLATION_LOG_SIGMA = 0.15
# Uncertainty added per doubling of the per-worker batch past the largest the profile swept (the
# compute line is extrapolated: caches, memory bandwidth and thread efficiency change with it).
BATCH_EXTRAPOLATION_LOG_SIGMA = 0.15
# Uncertainty added per doubling of a CPU's oversubscription (threads per core past one): time
# sharing is not the only cost (spinning thread pools, a collective waiting for a descheduled
# worker), and none of it was measured.
OVERSUBSCRIBED_LOG_SIGMA = 0.35


class MachineFacts(TypedDict):
    """This machine, as a local plan describes it."""

    cpu: str
    cores: int
    gpus: list[str]


def machine_facts() -> MachineFacts:
    """This machine: CPU model, logical cores, NVIDIA GPUs (names; empty when none)."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                cpu = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    gpus: list[str] = []
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
            if out.returncode == 0:
                gpus = [g.strip() for g in out.stdout.splitlines() if g.strip()]
        except (OSError, subprocess.SubprocessError):
            gpus = []
    return {"cpu": cpu or "unknown CPU", "cores": usable_cores(), "gpus": gpus}


def _fold(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalnum())


def _check_device(profile: Profile, facts: MachineFacts) -> list[str]:
    """The profile's device must be this machine's kind (the runtime trains on CUDA when a GPU
    is present, else on the CPU); notes for what cannot be checked."""
    on_gpu = bool(facts["gpus"])
    measured_cpu = profile.gpu.lower() == "cpu"
    hint = "profile on this machine: kplan profile SCRIPT (or --example NAME) --out p.json"
    if measured_cpu and on_gpu:
        raise InputError(
            f"profile {profile.name!r} was measured on a CPU; a local job trains on this "
            f"machine's {facts['gpus'][0]}",
            hint=hint,
        )
    if not measured_cpu and not on_gpu:
        raise InputError(
            f"profile {profile.name!r} was measured on {profile.gpu}; a local job trains on "
            "this machine, which has no GPU",
            hint=hint,
        )
    if not measured_cpu and _fold(profile.gpu) not in _fold(facts["gpus"][0]):
        return [
            f"the profile was measured on {profile.gpu}, this machine has {facts['gpus'][0]}: "
            "the prediction assumes the profile's device"
        ]
    return []


def local_plan(
    profile: Profile,
    *,
    nodes: int,
    workers_per_node: int,
    usd_per_hour: float = 0.0,
    epochs: float | None = None,
    dataset_size: int | None = None,
    precision: str | None = None,
    facts: MachineFacts | None = None,
    script_args: Sequence[str] = (),
    tick_s: float = LOCAL_CHECK_INTERVAL_S,
) -> Plan:
    """The plan of a local job of ``nodes`` groups of ``workers_per_node`` workers at
    ``usd_per_hour`` for the machine, trained at the profile's base global batch, for the
    epochs the script will run: its own ``--epochs`` in ``script_args`` (``script_epochs``),
    else ``epochs``, else the profile's with a note that the script's are unknown. ``tick_s``:
    the launcher's check interval (``--check-interval``), which the start and the end wait on."""
    from kplan.planner import costs

    facts = machine_facts() if facts is None else facts
    notes = _check_device(profile, facts)
    if precision is not None and precision != profile.precision:
        raise InputError(
            f"--precision {precision}: the profile was measured in {profile.precision}",
            hint=f"profile in {precision} (kplan profile --precision {precision}) or drop it",
        )
    n_epochs, source = epochs_to_run(profile, epochs, script_args, notes)
    w = _workload(profile, n_epochs, dataset_size)
    start, end = start_of(profile, nodes, tick_s), end_of(profile, tick_s)
    share = cpu_share(profile, nodes * workers_per_node, facts["cores"], notes)
    pred = _predict(w, nodes, workers_per_node, usd_per_hour, notes, (start, end), share)
    work = (
        f"{w.samples_at_base:,.0f} samples at batch {w.base_batch} "
        f"({dataset_size or profile.dataset_size:,} per epoch x {n_epochs:g} "
        + ("epoch" if n_epochs == 1 else "epochs")
        + f"; epochs: {source}; samples per epoch: "
        + ("as given" if dataset_size else "the profile's")
        + ")"
    )
    more = "".join(
        f"; {why}"
        for why, yes in (
            ("more workers than the profile measured", pred.extrapolated),
            ("a larger batch per worker than the profile swept", pred.batch_extrapolated),
            ("more threads than cores", share.oversubscribed > 1),
        )
        if yes
    )
    return Plan(
        chosen=pred.row,
        plans=(),
        frontier=(),
        objective="local",
        reason=(
            f"local: {nodes} worker group(s) x {workers_per_node} worker(s) on this machine "
            f"({facts['cpu']}, {facts['cores']} cores"
            + (f", {', '.join(facts['gpus'])}" if facts["gpus"] else "")
            + f"), {'free' if usd_per_hour == 0 else f'${usd_per_hour:,.2f}/h'}"
        ),
        considered=1,
        feasible=1,
        notes=tuple(notes),
        uncertainty=(
            f"step time p90 is +{math.exp(costs.Z90 * pred.sigma) - 1:.0%} over the expected "
            f"value (fit residuals{more}); the start ({start.seconds:.3g} s: torchrun, imports, "
            f"rendezvous) is {start.basis}: its p90 is {start.p90_s:.3g} s (log sigma "
            f"{start.log_sigma:g}); the end ({end.seconds:.3g} s) is {end.basis}: its p90 is "
            f"{end.p90_s:.3g} s; both added to the time's p90"
        ),
        precision=w.precision,
        precision_basis="measured",
        profile=profile.name,
        catalog="local",
        local=LocalMachine(
            cpu=str(facts["cpu"]),
            cores=int(facts["cores"]),
            gpus=tuple(facts["gpus"]),
            work=work,
            start_s=start.seconds,
            log_sigma=pred.sigma,
        ),
    )


@dataclass(frozen=True)
class Start:
    """A local job's start before its first step, or its end after its last: seconds, their
    log-space sigma, whether they were measured (by the profile) or assumed, in words, and the
    launcher's own wait on top (its tick: uniform, so its p90 is 90% of it, not a log-normal)."""

    seconds: float
    log_sigma: float
    basis: str
    tick_s: float = 0.0  # the launcher's wait, at most this (included in seconds at half)

    @property
    def p90_s(self) -> float:
        from kplan.planner.costs import Z90

        own = self.seconds - self.tick_s / 2
        return own * math.exp(Z90 * self.log_sigma) + 0.9 * self.tick_s


def start_of(profile: Profile, nodes: int = 1, tick_s: float = LOCAL_CHECK_INTERVAL_S) -> Start:
    """The start the profile measured plus the launcher's part (with several worker groups, the
    others start at its first tick after the head runs: one check interval), else the assumed
    ``LOCAL_START_S`` with its wide sigma."""
    if profile.startup_s is not None:
        wait = tick_s if nodes > 1 else 0.0
        later = f" plus the launcher's tick before the other groups start ({wait:g} s)"
        return Start(
            profile.startup_s + wait,
            MEASURED_START_LOG_SIGMA,
            f"measured by the profile ({profile.startup_s:.3g} s)" + (later if wait else ""),
        )
    return Start(LOCAL_START_S, LOCAL_START_LOG_SIGMA, "assumed, not measured")


def end_of(profile: Profile, tick_s: float = LOCAL_CHECK_INTERVAL_S) -> Start:
    """The end after the last step: the workers' and torchrun's exit (measured by the profile,
    else assumed), then the launcher's next tick sees every group finished (half a check
    interval expected, 90% of one at p90)."""
    tick = tick_s
    if profile.shutdown_s is not None:
        return Start(
            profile.shutdown_s + tick / 2,
            MEASURED_START_LOG_SIGMA,
            f"the exit measured by the profile ({profile.shutdown_s:.3g} s) plus the launcher's "
            f"next tick (at most {tick:g} s)",
            tick,
        )
    return Start(
        LOCAL_SHUTDOWN_S + tick / 2,
        LOCAL_START_LOG_SIGMA,
        f"the exit assumed ({LOCAL_SHUTDOWN_S:g} s, not measured) plus the launcher's next tick "
        f"(at most {tick:g} s)",
        tick,
    )


def script_epochs(args: Sequence[str]) -> float | None:
    """The epochs the script's own arguments state (``--epochs N`` or ``--epochs=N``, the last
    one wins, as argparse reads them); None when they state none or not as a positive number."""
    found: str | None = None
    for i, arg in enumerate(args):
        if arg == "--":
            break  # past it, the script's own positional arguments
        if arg == SCRIPT_EPOCHS_FLAG and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(SCRIPT_EPOCHS_FLAG + "="):
            found = arg.partition("=")[2]
    if found is None:
        return None
    try:
        value = float(found)
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def epochs_to_run(
    profile: Profile, epochs: float | None, script_args: Sequence[str], notes: list[str]
) -> tuple[float, str]:
    """(epochs to predict, where they come from): the script's own ``--epochs`` (what it will
    run), else kplan's ``--epochs``, else the profile's, with a note (appended to ``notes``)
    where the two disagree or where the script's are unknown."""
    own = script_epochs(script_args)
    if own is not None:
        if epochs is not None and epochs != own:
            notes.append(
                f"kplan launch --epochs {epochs:g}, but the script's arguments say --epochs "
                f"{own:g}: predicted for {own:g}, what the script will run"
            )
        return own, "the script's --epochs"
    if epochs is not None:
        return epochs, "as given"
    notes.append(
        f"the script's arguments state no --epochs: it runs its own default, which kplan cannot "
        f"know; predicted for the profile's {profile.epochs:g} (give `-- --epochs N` to the "
        "script, as the kplan examples take it, or --epochs N to kplan launch)"
    )
    return profile.epochs, "the profile's; the script's own are unknown"


def _workload(profile: Profile, epochs: float | None, dataset_size: int | None) -> Workload:
    """The profile's workload (its fitted model where it has one) on this machine."""
    from kplan.planner.workload import workload_from_profile

    gpus: dict[str, GpuSpec] = {}
    if profile.gpu.lower() != "cpu":
        from kplan.catalogs.current import load_current

        gpus = dict(load_current().gpus)
    params = None
    if profile.fit is not None:
        from kplan.planner.perfmodel import params_from_dict

        params = params_from_dict(profile.fit, f"profile {profile.name} (fit)")
    return workload_from_profile(
        profile, gpus, params=params, epochs=epochs, dataset_size=dataset_size
    )


@dataclass(frozen=True)
class CpuShare:
    """How a CPU job's workers share the machine's cores, at launch and in the profile: the
    step time scales with the launch's oversubscription over the profile's (1: no change)."""

    workers: int
    threads: int  # per worker (kplan/core/threads.py: what the launch gives each)
    cores: int
    oversubscribed: float  # threads per core at launch, at least 1
    factor: float  # the launch's oversubscription over the profile's

    @property
    def log_sigma(self) -> float:
        return OVERSUBSCRIBED_LOG_SIGMA * math.log2(self.oversubscribed)


NO_SHARE = CpuShare(1, 1, 1, 1.0, 1.0)


def cpu_share(profile: Profile, workers: int, cores: int, notes: list[str]) -> CpuShare:
    """A CPU profile's workers and threads against the launch's on ``cores`` cores (a GPU
    profile's step is the GPU's: NO_SHARE); notes where they differ."""
    if profile.gpu.lower() != "cpu":
        return NO_SHARE
    threads = threads_per_worker(workers, cores)
    measured_workers = max(1, profile.gpus_per_node)
    # an older profile: torchrun gave each of several workers one thread, one worker all cores
    measured_threads = profile.cpu_threads or (1 if measured_workers > 1 else cores)
    launch = oversubscription(workers, threads, cores)
    measured = oversubscription(measured_workers, measured_threads, cores)
    share = CpuShare(workers, threads, cores, launch, launch / measured)
    if launch > 1:
        notes.append(
            f"{workers} worker(s) x {threads} thread(s) on {cores} core(s): each core runs "
            f"{launch:.3g} threads, so the step time is scaled by {share.factor:.3g} (the profile "
            f"ran {measured_workers} x {measured_threads}) and its sigma widened; "
            + (
                f"at most {cores} worker(s) avoid it"
                if threads == 1
                else f"OMP_NUM_THREADS={max(1, cores // workers)} avoids it"
            )
        )
    elif threads != measured_threads:
        notes.append(
            f"each worker runs {threads} CPU thread(s), the profile's ran {measured_threads}: "
            "the step time is the profile's (threads are not credited)"
        )
    return share


@dataclass(frozen=True)
class _Prediction:
    row: PlanRow
    sigma: float  # the step time's log-space spread
    extrapolated: bool  # more workers than the profile measured
    batch_extrapolated: bool  # a larger local batch than the profile swept


def _step_sigma(
    w: Workload, workers: int, local: int, share: CpuShare, notes: list[str]
) -> tuple[float, float, float]:
    """(the step time's log sigma, doublings of the workers past the profile's, doublings of
    the batch per worker past the largest swept): the fit's residuals, widened for each thing
    the profile did not measure (a note for the batch; ``cpu_share`` notes the threads)."""
    swept = max(w.max_local_batch_ref, 1)
    batch_doublings = math.log2(max(local / swept, 1.0))
    if batch_doublings > 0:
        notes.append(
            f"{local} samples per worker is past the profile's largest swept batch ({swept}): "
            f"the step time is extrapolated and its sigma widened (profile with "
            f"--max-local-batch {local} to measure it)"
        )
    doublings = math.log2(max(workers / max(w.params.max_workers_measured, 1), 1.0))
    sigma = math.sqrt(
        w.params.log_sigma**2
        + (WORKER_EXTRAPOLATION_LOG_SIGMA * doublings) ** 2
        + (BATCH_EXTRAPOLATION_LOG_SIGMA * batch_doublings) ** 2
        + share.log_sigma**2
    )
    return sigma, doublings, batch_doublings


def _predict(
    w: Workload,
    nodes: int,
    workers_per_node: int,
    usd_per_hour: float,
    notes: list[str],
    overheads: tuple[Start, Start],
    share: CpuShare = NO_SHARE,
) -> _Prediction:
    """The chosen row: the planner's step-time model on one node of every worker (scaled by
    the CPU's oversubscription, ``share``), its statistical efficiency at the base batch, and
    the closed-form time and cost."""
    import numpy as np

    from kplan.planner import costs, efficiency, perfmodel

    p = w.params
    workers = nodes * workers_per_node
    batch = w.base_batch
    local = math.ceil(batch / workers)
    # T_step = (T_c^g + T_sync^g)^(1/g) on one node of ``workers`` workers (perfmodel)
    step = float(perfmodel.step_time(p, 1, workers, local, 1)) * share.factor
    sigma, doublings, batch_doublings = _step_sigma(w, workers, local, share, notes)
    factor = float(efficiency.sample_factor(w.gns, batch, np.array([batch]))[0])
    samples = w.samples_at_base * factor
    steps = math.ceil(samples / batch)
    # the start's and the end's p90 with the training's p90 (their sum: an upper bound of the
    # sum's p90)
    tc, tc90 = (
        costs.time_and_cost(
            train_seconds=steps * step,
            instances=nodes,
            usd_per_hour=usd_per_hour / nodes,
            preempt_per_hour=0.0,
            log_sigma=sigma,
            checkpoint_s=costs.checkpoint_seconds(
                3.0 * w.gradient_bytes, costs.Overheads(provisioning_s=start)
            ),
            billing_min_s=0.0,
            billing_increment_s=1.0,
            overheads=costs.Overheads(provisioning_s=start),
        )
        for start in (
            sum(o.seconds for o in overheads),
            sum(o.p90_s for o in overheads),
        )
    )
    device = w.ref_gpu.name
    group = Group("local", "on-demand", "local", nodes, workers_per_node, device, local,
                  usd_per_hour / nodes)  # fmt: skip
    row = PlanRow(
        cloud="local",
        region="local",
        zone="local",
        instance_type="local",
        market="on-demand",
        nodes=nodes,
        workers=workers,
        local_batch=local,
        accum_steps=1,
        global_batch=batch,
        step_time_s=step,
        step_time_p90_s=step * math.exp(costs.Z90 * sigma),
        steps=steps,
        samples=samples,
        statistical_efficiency=min(1.0, w.samples_at_base / samples),
        throughput_samples_s=batch / step,
        hours=float(tc.hours),
        hours_p90=float(tc90.hours_p90),
        cost_usd=float(tc.cost_usd),
        cost_p90_usd=float(tc90.cost_p90_usd),
        usd_per_hour=usd_per_hour,
        expected_preemptions=0.0,
        checkpoint_interval_s=float(tc.checkpoint_interval_s),
        groups=(group,),
        gpu=device,
        precision=w.precision,
        terms=perfmodel.term_sources(p, gpu=p.gpu, nodes=1, workers=workers),
        spot=SpotTerms(basis="closed form; local: no preemptions"),
    )
    return _Prediction(row, sigma, doublings > 0, batch_doublings > 0)


def prediction_line(plan: Plan) -> str:
    """The local plan in one line, printed when the launch starts."""
    from kplan.launcher.report_html import money

    row = plan.chosen
    work = plan.local.work if plan.local is not None else "?"

    def secs(h: float) -> str:
        s = h * 3600
        return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{h:.2f} h"

    price = (
        "free" if not row.usd_per_hour else f"{money(row.cost_usd)} (p90 {money(row.cost_p90_usd)})"
    )
    return (
        f"predicted on this machine: {secs(row.hours)} (p90 {secs(row.hours_p90)}), "
        f"{price}; step {row.step_time_s * 1000:.1f} ms (p90 "
        f"{row.step_time_p90_s * 1000:.1f} ms) x {row.steps:,} steps; "
        f"work: {work}; `kplan report` compares it with the run"
    )
