"""Wall time of what must be quick: refusals, fail-fast launches, a catalog load, a Monte-Carlo.

Run from the repository root: ``.venv/bin/python -m bench.failfast [--repeats 3]`` (about a
minute on a quiet machine). The tests check what each of these does (the message, the exit
code, the state left); how long it takes is measured here, never asserted in a test (a timed
test fails on a loaded machine). Each row is the median of ``--repeats`` runs (the best for the
catalog load, as its test took), next to the figure the test used to assert:

- ``launch, no credentials (gcp|aws)``: ``kplan launch`` in a fresh process without any cloud
  credential (tests/test_credentials.py): refused before any job exists;
- ``find_credentials, none``: the GCP credential chain with nothing to find (no metadata probe
  beyond one short try);
- ``launch, import error``: a 2-node local launch of a script failing on import
  (tests/test_local_failfast.py): the job fails without torchrun's restarts;
- ``logs -f, launcher gone``: ``kplan logs -f`` of a job whose launcher died
  (tests/test_launcher_crash.py);
- ``shipped catalog load``: ``load_catalog()`` (tests/test_catalog_shipped.py);
- ``wheel reuse``: ``build_wheel`` again on an unchanged tree (tests/test_bootstrap_install.py);
- ``terminate returns``: ``LocalProvider.terminate_instances`` asks and returns
  (tests/test_provider_local.py); ``grace kill``: a leader that ignores SIGTERM is killed
  after ``grace_s`` = 1 s;
- ``spot Monte-Carlo``: ``spotsim.simulate``, 20 configurations x 2000 runs x 8 nodes of a harsh
  market (tests/test_spotsim.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "kplan" / "examples" / "mlp_regression.py"
KPLAN = Path(sys.executable).with_name("kplan")
CREDENTIAL_VARS = ("AWS_", "GOOGLE_", "CLOUDSDK_", "GCE_", "KPLAN_AWS_", "KPLAN_GCP_", "KPLAN_GCS_")
WORKERS = "setsid sleep 300 & sleep 300 & "


def _clean_env(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(CREDENTIAL_VARS)}
    (folder / "home").mkdir(exist_ok=True)
    env.update(HOME=str(folder / "home"), KPLAN_HOME=str(folder / "kplan"))
    env.update(KPLAN_GCP_PROJECT="kplan-test-1", KPLAN_GCP_STORAGE_URI="gs://kplan-test/jobs")
    env.update(AWS_CONFIG_FILE=str(folder / "none"), AWS_SHARED_CREDENTIALS_FILE=str(folder / "n"))
    return env


def _timed(argv: list[str], env: dict[str, str], cwd: Path, code: int) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, timeout=300, check=False)
    took = time.perf_counter() - t0
    if done.returncode != code:
        raise SystemExit(f"{argv[1:3]} exited {done.returncode}: {done.stderr.decode()[-500:]}")
    return took


def launch_without_credentials(cloud: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        argv = [str(KPLAN), "launch", str(SCRIPT), "--cloud", cloud]
        argv += ["--example-profile", "cifar10-resnet18", "--budget", "50"]
        return _timed(argv, _clean_env(Path(tmp)), ROOT, 2)


def find_credentials_none() -> float:
    from kplan.launcher.providers.gcp_auth import find_credentials

    with tempfile.TemporaryDirectory() as tmp:
        env = _clean_env(Path(tmp))
        t0 = time.perf_counter()
        try:
            find_credentials(env)
        except Exception as err:  # the refusal is what is timed
            if "no Google credentials found" not in str(err):
                raise
        return time.perf_counter() - t0


def launch_import_error() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "bad.py").write_text("import nonexistent_module\n")
        argv = [str(KPLAN), "launch", str(folder / "bad.py"), "--nodes", "2", "--budget", "1"]
        argv += ["--check-interval", "0.5", "--job-id", "kp-bench-ff", "--quiet"]
        env = {**os.environ, "KPLAN_HOME": str(folder), "OMP_NUM_THREADS": "1"}
        return _timed(argv, env, folder, 1)


def logs_follow_launcher_gone() -> float:
    from kplan.launcher.jobspec import JobSpec
    from kplan.launcher.state import JobRecord, StateDB

    with tempfile.TemporaryDirectory() as tmp:
        home, job = Path(tmp), "kp-bench-gone-1"
        spec = JobSpec.local("train.py", (), nodes=1)
        spec = JobSpec(**{**spec.__dict__, "job_id": job})
        dead = subprocess.Popen(["true"])
        dead.wait()
        now = time.time()
        with StateDB.open(home / "kplan.db") as db:
            db.create_job(
                JobRecord(
                    job, "running", None, "local", "local", spec.to_dict(), None, 0.0, None, None,
                    None, None, dead.pid, None, now, now,
                )
            )  # fmt: skip
        log = home / "jobs" / job / "logs" / "node-0.log"
        log.parent.mkdir(parents=True)
        log.write_text("epoch 1 loss 0.25\n")
        return _timed([str(KPLAN), "logs", job, "-f"], {**os.environ, "KPLAN_HOME": tmp}, home, 0)


def catalog_load() -> float:
    from kplan.catalogs import load_catalog

    t0 = time.perf_counter()
    load_catalog()
    return time.perf_counter() - t0


def wheel_reuse() -> float:
    from kplan.launcher.wheel import build_wheel

    with tempfile.TemporaryDirectory() as tmp:
        first = build_wheel(Path(tmp))
        t0 = time.perf_counter()
        again = build_wheel(Path(tmp))
        took = time.perf_counter() - t0
        if again != first:
            raise SystemExit("the wheel was rebuilt")
        return took


def _provider_timings() -> tuple[float, float]:
    """(terminate_instances call, SIGTERM to the kill after a 1 s grace) on the local provider."""
    from kplan.launcher.provider import ClusterSpec, InstanceSpec
    from kplan.launcher.providers.local import LocalProvider, job_of

    job = "kp-bench-local"

    def state(provider: LocalProvider, iid: str) -> str:
        (found,) = [i for i in provider.query_instances(job_of(iid) or "") if i.id == iid]
        return found.state

    def start(provider: LocalProvider, user_data: str) -> str:
        spec = InstanceSpec(
            job_id=job, name=f"{job}-n0-r0", cloud="local", region="local", zone="local",
            instance_type="local", market="spot", node_rank=0, user_data=user_data, env={},
        )  # fmt: skip
        (inst,) = provider.run_instances(
            ClusterSpec(job_id=job, cloud="local", region="local"), [spec]
        )
        provider.wait_instances([inst.id], timeout_s=30)
        time.sleep(0.5)  # the tree is up
        return inst.id

    def until_terminated(provider: LocalProvider, iid: str) -> None:
        deadline = time.monotonic() + 60
        while state(provider, iid) != "terminated":
            if time.monotonic() > deadline:
                raise SystemExit(f"{iid} not terminated after 60 s")
            time.sleep(0.05)

    with tempfile.TemporaryDirectory() as tmp:
        provider = LocalProvider(Path(tmp), grace_s=5)
        iid = start(provider, WORKERS + "wait")
        t0 = time.perf_counter()
        provider.terminate_instances([iid])
        call = time.perf_counter() - t0
        until_terminated(provider, iid)
    with tempfile.TemporaryDirectory() as tmp:
        provider = LocalProvider(Path(tmp), grace_s=1.0)
        iid = start(provider, f"trap 'true' TERM; {WORKERS} while true; do wait; done")
        t0 = time.perf_counter()
        provider.terminate_instances([iid])
        until_terminated(provider, iid)
        grace = time.perf_counter() - t0
    return call, grace


def spot_monte_carlo() -> float:
    from kplan.planner import spotsim
    from kplan.planner.spot import Outage, RecoveryPolicy, SpotRisk, Weibull

    r = SpotRisk(
        cloud="aws", family="p3", region="*", lifetime=Weibull(0.9, 1.7), co_loss=0.05,
        outage=Outage(0.5, (0.1, 0.2, 0.3, 0.5), 1.0), source="bench",
    )  # fmt: skip
    t0 = time.perf_counter()
    spotsim.simulate(
        work_s=np.linspace(2, 20, 20) * 3600.0,
        nodes=8,
        risks=[r],
        policies=[RecoveryPolicy(max_replacements=10**6, capacity_wait_s=3600.0)],
        usd_per_hour=0.9,
        usd_per_hour_on_demand=3.06,
        runs=2000,
    )
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    n = max(args.repeats, 1)

    def median(fn: Callable[[], float]) -> float:
        return statistics.median(fn() for _ in range(n))

    calls, graces = zip(*(_provider_timings() for _ in range(n)), strict=True)
    rows = [
        ("launch, no credentials (gcp)", median(lambda: launch_without_credentials("gcp")), "< 10"),
        ("launch, no credentials (aws)", median(lambda: launch_without_credentials("aws")), "< 10"),
        ("find_credentials, none", median(find_credentials_none), "< 5"),
        ("launch, import error (2 nodes)", median(launch_import_error), "< 30"),
        ("logs -f, launcher gone", median(logs_follow_launcher_gone), "< 30"),
        ("shipped catalog load (best)", min(catalog_load() for _ in range(n)), "< 0.1"),
        ("wheel reuse", median(wheel_reuse), "< 1.0"),
        ("terminate returns", statistics.median(calls), "< 1.0"),
        ("grace kill (grace 1 s)", statistics.median(graces), "0.9 - 5.0"),
        ("spot Monte-Carlo (20 x 2000 x 8)", median(spot_monte_carlo), "< 5.0"),
    ]
    print(f"{'what':34} {'seconds':>8}   was asserted")
    for what, seconds, bound in rows:
        print(f"{what:34} {seconds:8.3f}   {bound}")


if __name__ == "__main__":
    main()
