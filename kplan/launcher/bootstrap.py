"""What runs on a node: ``InstanceSpec.user_data`` and the runtime environment.

- ``local``: a ``/bin/sh`` script that runs torchrun (c10d rendezvous on 127.0.0.1) in the
  script's folder, appends its output to ``<job>/logs/node-<rank>.log``, forwards SIGTERM to
  torchrun (which forwards it to the workers: they checkpoint) and writes
  ``<job>/status/node-<rank>.json`` when torchrun exits; its lease watchdog ends it (SIGTERM)
  when the launcher stopped renewing ``<job>/lease.json``.
- clouds: a cloud-init / startup-script (bash) that first arms the hard stop
  (kplan/launcher/hardstop.py: on AWS a ``shutdown`` timer of the instance's cap; on both the
  lease watchdog), installs the launcher's own kplan (its wheel from the job's bucket,
  sha256-checked: :func:`install_kplan`, ``kplan/launcher/wheel.py``), fetches the packed code
  from the job's bucket (``aws s3 cp`` / ``gsutil cp``), restores the
  checkpoints, runs torchrun with rendezvous on the head's private IP, syncs checkpoints,
  metrics and the log to the bucket every minute, uploads the status file and powers the
  machine off. Exit codes of a failed start: 96 kplan's wheel missing or tampered with, 97 pip
  could not install it, 98 the code could not be fetched, 99 ``requirements.txt`` failed.

The environment comes from :func:`kplan.runtime.env.kplan_environ`, plus
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (elastic restarts with gloo reconnect only with it).
Nothing here reads the launcher's environment: no credentials reach a node through kplan
(instances use an instance profile / a service account).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict
from urllib.parse import unquote, urlparse

from kplan.catalogs.images import NODE_PYTHON
from kplan.core.errors import InputError
from kplan.core.precision import check_precision
from kplan.core.threads import THREADS_ENV, threads_per_worker
from kplan.launcher.hardstop import LEASE_KEY, timer_sh, watchdog_sh
from kplan.launcher.jobspec import JobSpec, NodeSpec
from kplan.launcher.provider import TAG_JOB, TAG_MANAGED, TAG_NODE, ClusterSpec, InstanceSpec
from kplan.launcher.storage import Storage
from kplan.planner.spot import RecoveryPolicy
from kplan.planner.spotnotice import NOTICE_S, POLL_S, stop_before_s
from kplan.runtime.batch_schedule import parse as parse_schedule
from kplan.runtime.env import kplan_environ

CODE_KEY = "code/job.tar.gz"
CLOUD_ROOT = "/opt/kplan"  # the job's folder on a cloud node
SYNC_PERIOD_S = 60
EXTRA_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


@dataclass(frozen=True)
class Rendezvous:
    """torchrun's c10d rendezvous for one generation of the job."""

    host: str | None  # head's private IP; None on the head itself (it resolves its own)
    port: int
    run_id: str  # "<job>-g<generation>"
    is_host: bool


def rendezvous(spec: JobSpec, generation: int, head_addr: str | None) -> Rendezvous:
    """Generation ``generation``'s rendezvous; ``head_addr`` None: for the head itself.

    Each generation (a restart of all groups after the head was lost) has its own run id and,
    on the local cloud where every node shares 127.0.0.1, its own port."""
    port = spec.training.rdzv_port + (generation if spec.cloud == "local" else 0)
    run_id = f"{spec.job_id}-g{generation}"
    return Rendezvous(head_addr, port, run_id, head_addr is None)


def job_key(job_id: str, key: str) -> str:
    return f"{job_id}/{key}"


def status_key(job_id: str, rank: int) -> str:
    return job_key(job_id, f"status/node-{rank}.json")


def log_key(job_id: str, rank: int) -> str:
    return job_key(job_id, f"logs/node-{rank}.log")


def local_root(storage_uri: str) -> Path:
    """The folder of a ``file://`` storage URI."""
    parsed = urlparse(storage_uri)
    if parsed.scheme != "file":
        raise InputError(f"local jobs need file:// storage, got {storage_uri!r}", hint="fix it")
    return Path(unquote(parsed.path))


def worker_env(spec: JobSpec, job_dir: str) -> dict[str, str]:
    """The runtime's variables for a node whose job folder is ``job_dir`` (no secrets)."""
    env = kplan_environ(
        job_id=spec.job_id,
        metrics_path=f"{job_dir}/metrics",
        checkpoint_dir=f"{job_dir}/ckpt",
        checkpoint_interval=spec.recovery.checkpoint_interval_s,
        global_batch=spec.batch.global_batch,
        accum_steps=spec.batch.accum_steps,
        max_local_batch=spec.batch.max_local_batch,
        batch_schedule=None if spec.batch.schedule is None else parse_schedule(spec.batch.schedule),
        policies=spec.training.policies or None,
        # a batch change by the launcher or the plan's schedule keeps the job's statistical
        # target (the plan priced the samples to reach it at each batch)
        epochs_by="progress"
        if spec.adaptation.enabled or spec.adaptation.explore or spec.batch.schedule
        else None,
        control_path=f"{job_dir}/control.json",
        precision=check_precision(spec.training.precision, "precision"),
        compression=None if spec.training.compression == "none" else spec.training.compression,
        sync_policy=None if spec.training.sync_policy == "every" else spec.training.sync_policy,
    )
    return {**env, **EXTRA_ENV}


def torchrun_args(spec: JobSpec, node: NodeSpec, rdzv: Rendezvous, host_expr: str) -> list[str]:
    """torchrun's flags (``host_expr``: the rendezvous host, maybe a shell expansion)."""
    conf = f"is_host={int(rdzv.is_host)},last_call_timeout={spec.timing.rdzv_last_call_s:g}"
    return [
        "-m",
        "kplan.launcher.noderun",  # torchrun, exiting with the script's code (noderun.py)
        f"--nnodes=1:{len(spec.nodes)}",
        f"--nproc-per-node={node.gpus}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={host_expr}:{rdzv.port}",
        f"--rdzv-id={rdzv.run_id}",
        f"--rdzv-conf={conf}",
        f"--max-restarts={spec.recovery.max_restarts}",
    ]


_STATUS_PY = (
    "import json,os,sys,time;p=sys.argv[1];t=p+'.tmp';"
    "d={'exit_code':int(sys.argv[2]),'time':time.time(),'node_rank':int(sys.argv[3]),"
    "'instance':sys.argv[4]};f=open(t,'w');json.dump(d,f);f.flush();os.fsync(f.fileno());"
    "f.close();os.replace(t,p)"
)

# Forward SIGTERM (a spot notice, a shutdown, `kplan down`, the lease watchdog) to torchrun
# (``$child``) only, which forwards it to its workers (they checkpoint); wait for it to exit.
# After a SIGTERM a failed exit is reported as 143 whatever torchrun returned, so the launcher
# replaces the node instead of calling the script failed.
_FORWARD_AND_WAIT = """got_term=0
trap 'got_term=1; kill -TERM "$child" 2>/dev/null' TERM INT
wait "$child"; code=$?
while kill -0 "$child" 2>/dev/null; do wait "$child"; code=$?; done
if [ "$got_term" = 1 ] && [ "$code" != 0 ]; then code=143; fi
"""


def local_user_data(spec: JobSpec, node: NodeSpec, name: str, rdzv: Rendezvous, root: Path) -> str:
    """The local provider's command line (a ``/bin/sh`` script)."""
    q = shlex.quote
    job_dir = root / spec.job_id
    script = Path(spec.script).resolve()
    host = rdzv.host or "127.0.0.1"
    cmd = [spec.install.python, *torchrun_args(spec, node, rdzv, host), str(script), *spec.args]
    # every group's workers share this machine's cores: unless the user's OMP_NUM_THREADS says
    # otherwise, each gets an even share (kplan/core/threads.py), as the profile's workers did
    threads = threads_per_worker(sum(n.gpus for n in spec.nodes), environ={})
    status = job_dir / "status" / f"node-{node.node_rank}.json"
    log = job_dir / "logs" / f"node-{node.node_rank}.log"
    # The lease watchdog ends this node's worker group (SIGTERM to this script: the workers
    # checkpoint) when the launcher stopped renewing the lease: no orphan outlives it.
    lease = f"cat {q(str(job_dir / LEASE_KEY))}"
    return (
        f"# kplan local node: job {spec.job_id}, node {node.node_rank} ({name})\n"
        f"mkdir -p {q(str(status.parent))} {q(str(log.parent))} || exit 1\n"
        f"cd {q(str(script.parent))} || exit 1\n"
        f'{THREADS_ENV}="${{{THREADS_ENV}:-{threads}}}" '
        f"{' '.join(q(a) for a in cmd)} >> {q(str(log))} 2>&1 < /dev/null &\n"
        "child=$!\n"
        f"{watchdog_sh(lease, spec.timing.lease_period_s, 'kill -TERM $$')}"
        f"{_FORWARD_AND_WAIT}"
        f'{q(spec.install.python)} -c {q(_STATUS_PY)} {q(str(status))} "$code" '
        f"{node.node_rank} {q(name)}\n"
        'exit "$code"\n'
    )


def _cloud_tools(storage_uri: str) -> tuple[str, str, str]:
    """Copy, sync, and sync-without-hidden-files commands for the bucket (the instance's role)."""
    scheme = urlparse(storage_uri).scheme
    if scheme == "s3":
        sync = "aws s3 sync --only-show-errors"
        return "aws s3 cp --only-show-errors", sync, f"{sync} --exclude '.*' --exclude '*/.*'"
    if scheme == "gs":
        sync = "gsutil -q -m rsync -r"
        return "gsutil -q cp", sync, f"{sync} -x '(^|.*/)[.].*'"
    raise _not_a_bucket(storage_uri)


def _not_a_bucket(storage_uri: str) -> InputError:
    return InputError(
        f"cloud jobs need s3:// or gs:// storage, got {storage_uri!r}",
        hint="set the job's storage bucket (--storage)",
    )


def cloud_hard_stop(spec: JobSpec, storage_uri: str, max_run_s: int | None) -> str:
    """Bash the cloud node runs first: on AWS the shutdown timer of the instance's cap (GCP
    enforces it itself: ``maxRunDuration``), then the lease watchdog, which powers the node off
    when ``$STORE/lease.json`` was not renewed for one lease period (kplan/launcher/hardstop.py)."""
    scheme = urlparse(storage_uri).scheme
    if scheme == "s3":
        fetch = f'aws s3 cp --only-show-errors "$STORE/{LEASE_KEY}" -'
    elif scheme == "gs":
        fetch = f'gsutil -q cat "$STORE/{LEASE_KEY}"'
    else:
        raise _not_a_bucket(storage_uri)
    timer = timer_sh(max_run_s) if scheme == "s3" and max_run_s is not None else ""
    return timer + watchdog_sh(fetch, spec.timing.lease_period_s, "poweroff")


def cloud_user_data(
    spec: JobSpec,
    node: NodeSpec,
    name: str,
    rdzv: Rendezvous,
    storage_uri: str,
    node_root: str = CLOUD_ROOT,
    max_run_s: int | None = None,
) -> str:
    """A cloud-init user-data / GCP startup-script (bash), with no credentials in it.

    ``node_root``: the job's folder on the node (tests run the script in a temporary one);
    ``max_run_s``: the instance's hard-stop cap (AWS: armed here as a shutdown timer)."""
    q = shlex.quote
    cp, sync, sync_visible = _cloud_tools(storage_uri)
    store = f"{storage_uri.rstrip('/')}/{spec.job_id}"
    env = worker_env(spec, node_root)
    exports = "".join(f"export {k}={q(v)}\n" for k, v in sorted(env.items()))
    head = '"$MY_ADDR"' if rdzv.host is None else q(rdzv.host)
    args = torchrun_args(spec, node, rdzv, "@HEAD@")
    run = " ".join(q(a) for a in args).replace("@HEAD@", '"$HEAD_ADDR"')
    script_rel = Path(spec.script).name
    user_args = " ".join(q(a) for a in spec.args)
    rank = node.node_rank
    return f"""#!/bin/bash
# kplan node bootstrap: job {spec.job_id}, node {rank} ({name}). Generated; holds no credentials:
# the bucket is reached with the instance's own role (instance profile / service account).
set -uo pipefail
umask 077  # the job's code, checkpoints, metrics and logs are private on the node
{exports}W={q(node_root)}
STORE={q(store)}
mkdir -p "$W/code" "$W/ckpt" "$W/metrics" "$W/logs"
PY=python3  # the node's Python; install_kplan brings a newer one when it is too old
LOG="$W/logs/node-{rank}.log"
exec >>"$LOG" 2>&1
{cloud_hard_stop(spec, storage_uri, max_run_s)}MY_ADDR=$(hostname -I | awk '{{print $1}}')
HEAD_ADDR={head}
push() {{
  {sync_visible} "$W/ckpt" "$STORE/ckpt" ; {sync} "$STORE/ckpt" "$W/ckpt"
  {sync} "$W/metrics" "$STORE/metrics" ; {cp} "$LOG" "$STORE/logs/node-{rank}.log"
  {cp} "$STORE/control.json" "$W/.control.json" 2>/dev/null \
    && mv -f "$W/.control.json" "$W/control.json"
}}
status() {{
  "$PY" -c {q(_STATUS_PY)} "$W/status.json" "$1" {rank} {q(name)}
  {cp} "$W/status.json" "$STORE/status/node-{rank}.json"
}}
fail() {{ status "$1"; poweroff; exit "$1"; }}
{install_kplan(spec, cp)}{cp} "$STORE/{CODE_KEY}" "$W/job.tar.gz" \\
  && tar -xzf "$W/job.tar.gz" -C "$W/code" \\
  || fail 98
if [ -f "$W/code/requirements.txt" ]; then
  "$PY" -m pip install --quiet -r "$W/code/requirements.txt" || fail 99
fi
{sync} "$STORE/ckpt" "$W/ckpt" || true
( n=0; while [ ! -e "$W/.stop-sync" ]; do
    sleep 1; n=$((n + 1)); if [ "$n" -ge {SYNC_PERIOD_S} ]; then n=0; push; fi
  done ) &
syncer=$!
cd "$W/code"
"$PY" {run} --local-addr="$MY_ADDR" {q(script_rel)} {user_args} < /dev/null &
child=$!
{notice_watch(spec, node)}{_FORWARD_AND_WAIT}touch "$W/.stop-sync"; wait "$syncer"
push
status "$code"
poweroff
"""


def notice_stop_s(spec: JobSpec) -> float:
    """How long before a spot preemption this job's workers stop with a checkpoint
    (kplan/planner/spotnotice.py): from the plan's step and checkpoint times where the lead
    fits in the cloud's notice; otherwise at once (the whole notice less the watch's poll),
    which gives the checkpoint all there is."""
    chosen = spec.plan.chosen if spec.plan is not None else None
    rec = chosen.spot.recovery if chosen is not None else None
    stop = None
    if chosen is not None:
        ck = rec.checkpoint_s if rec is not None else RecoveryPolicy().checkpoint_s
        stop = stop_before_s(spec.cloud, chosen.step_time_s, ck)
    return stop if stop is not None else NOTICE_S[spec.cloud] - POLL_S


def watches_notice(spec: JobSpec, node: NodeSpec) -> bool:
    """Whether ``node`` runs the notice watch: a spot node of a cloud that gives notice."""
    return node.market == "spot" and spec.cloud in NOTICE_S


def notice_watch(spec: JobSpec, node: NodeSpec) -> str:
    """Bash starting a spot node's notice watch (kplan/launcher/spot_notice.py) on this
    script (``$$``, whose SIGTERM trap stops torchrun); nothing for an on-demand node."""
    if not watches_notice(spec, node):
        return ""
    return (
        f'"$PY" -m kplan.launcher.spot_notice --cloud {spec.cloud} --pid $$ '
        f"--stop-before {notice_stop_s(spec):g} &\n"
    )


def wheel_key(spec: JobSpec) -> str | None:
    """The bucket key (under the job's prefix) of the kplan wheel the nodes install."""
    if spec.install.wheel is None:
        return None
    return f"code/{Path(spec.install.wheel).name}"


# The wheel's upload as ``--dry-run`` lists it ("from" is a keyword: the functional form).
WheelUpload = TypedDict(
    "WheelUpload",
    {
        "call": str,
        "key": str,
        "bytes": int | None,
        "from": str,
        "sha256": str | None,
        "installs_with": list[str],
        "pip_index_url": str | None,
    },
)


def wheel_upload(spec: JobSpec) -> WheelUpload | None:
    """The wheel's upload as ``--dry-run`` shows it (None: the job ships none)."""
    key = wheel_key(spec)
    if key is None or spec.install.wheel is None:
        return None
    try:
        size: int | None = Path(spec.install.wheel).stat().st_size
    except OSError:
        size = None
    return {
        "call": "storage.put_bytes",
        "key": job_key(spec.job_id, key),
        "bytes": size,
        "from": spec.install.wheel,
        "sha256": spec.install.wheel_sha256,
        "installs_with": list(spec.install.requirements)
        if spec.install.install_deps
        else ["--no-deps"],
        "pip_index_url": spec.install.pip_index_url,
    }


def ship_wheel(spec: JobSpec, storage: Storage) -> str | None:
    """Upload the job's kplan wheel to ``<job>/code/<name>`` after checking its sha256; the
    event text, or None when the job ships none (the nodes then fail with exit code 96)."""
    key = wheel_key(spec)
    if key is None or spec.install.wheel is None or spec.install.wheel_sha256 is None:
        return None
    from kplan.launcher.wheel import read_wheel

    data = read_wheel(spec.install.wheel, spec.install.wheel_sha256)
    storage.put_bytes(job_key(spec.job_id, key), data)
    sha = spec.install.wheel_sha256[:12]
    return f"uploaded kplan's wheel {Path(key).name} ({len(data):,} bytes, sha256 {sha}...)"


def install_kplan(spec: JobSpec, cp: str) -> str:
    """Bash that installs the launcher's kplan on a node: the wheel from the job's bucket,
    checked against its sha256, with the dependencies pinned to the launcher's versions from
    the node's index (or ``--pip-index-url``), or none (``install_deps`` False: the image has
    them). Never ``pip install kplan`` by name: a package of that name on an index is not ours.

    Exit codes: 96 the wheel is missing or does not match its sha256, 97 pip failed."""
    q = shlex.quote
    key = wheel_key(spec)
    if key is None or spec.install.wheel_sha256 is None:
        return 'echo "kplan: this job ships no kplan wheel; launch it with kplan launch"; fail 96\n'
    pip_env = "export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_ROOT_USER_ACTION=ignore\n"
    # images whose python3 is the system's (PEP 668) refuse pip without it; older pip ignores it
    pip_env += "export PIP_BREAK_SYSTEM_PACKAGES=1\n"
    if spec.install.pip_index_url is not None:
        pip_env += f"export PIP_INDEX_URL={q(spec.install.pip_index_url)}\n"
    if spec.install.install_deps:
        deps = "".join(f" {q(r)}" for r in spec.install.requirements)
    else:
        deps = " --no-deps"
    return (
        f"{pip_env}"
        # no pip: ensurepip, or (Debian/Ubuntu images, where ensurepip is disabled) apt-get
        "python3 -m pip --version >/dev/null 2>&1 || python3 -m ensurepip --upgrade \\\n"
        "  || { command -v apt-get >/dev/null && apt-get -q update \\\n"
        "       && DEBIAN_FRONTEND=noninteractive apt-get -q -y install python3-pip; } \\\n"
        '  || { echo "kplan: the node\'s python3 has no pip (use --image)"; fail 97; }\n'
        f"{bring_python(spec)}"
        # the name and the sha256 were validated (JobSpec): no quoting needed inside "..."
        f'mkdir -p "$W/wheel"; WHEEL="$W/wheel/{Path(key).name}"\n'
        f'{cp} "$STORE/{key}" "$WHEEL" \\\n'
        '  || { echo "kplan: cannot fetch the kplan wheel from the bucket"; fail 96; }\n'
        f'echo "{spec.install.wheel_sha256}  $WHEEL" | sha256sum --check --status \\\n'
        '  || { echo "kplan: the kplan wheel does not match its sha256"; fail 96; }\n'
        f'"$PY" -m pip install --quiet "$WHEEL"{deps} || fail 97\n'
        # later installs (the code's requirements.txt) may not replace it with an index's kplan
        f'echo "kplan=={_wheel_version(key)}" > "$W/wheel/constraints.txt"\n'
        'export PIP_CONSTRAINT="$W/wheel/constraints.txt"\n'
    )


def bring_python(spec: JobSpec) -> str:
    """Bash that makes ``$PY`` a Python >= 3.11 with pip: the node's ``python3`` when it is new
    enough, else one uv installs (Debian 11's 3.9, Ubuntu 22.04's 3.10).

    uv comes from the node's package index (``--pip-index-url`` when given, which uv's
    ``uv venv --seed`` uses too); ``uv python install`` fetches a python-build-standalone
    CPython from GitHub's release downloads unless the image sets ``UV_PYTHON_INSTALL_MIRROR``.
    A node that reaches neither stops with 97 and says to use an ``--image`` with Python
    >= 3.11. The new Python lives in a virtual environment under the job's folder
    (``$W/python``), so the image's own packages stay as they were."""
    q = shlex.quote
    want = ".".join(str(v) for v in NODE_PYTHON)
    index = spec.install.pip_index_url
    uv_index = "" if index is None else f"UV_DEFAULT_INDEX={q(index)} "
    too_old = f"\"kplan: the node's $(python3 -V 2>&1) is older than {want}"
    return (
        f"if ! python3 -c 'import sys; sys.exit(sys.version_info < {NODE_PYTHON})'; then\n"
        f'  echo {too_old}: installing Python {want} with uv"\n'
        # cloud-init runs this as root, maybe without HOME: uv keeps everything in the job's
        # folder
        '  export UV_PYTHON_INSTALL_DIR="$W/uv/python" UV_CACHE_DIR="$W/uv/cache"\n'
        # each line ends in && or ||, where bash reads on: no backslash, each line parses alone
        "  python3 -m pip install --quiet uv &&\n"
        f"    python3 -m uv python install {want} &&\n"
        f'    {uv_index}python3 -m uv venv --seed --python {want} "$W/python" &&\n'
        '    PY="$W/python/bin/python" ||\n'
        f"    {{ echo \"kplan: could not bring Python {want} (pip index, and GitHub for uv's "
        f'Python builds); use an --image with python3 >= {want}"; fail 97; }}\n'
        "fi\n"
    )


def _wheel_version(key: str) -> str:
    """``code/kplan-0.1.0-py3-none-any.whl`` -> ``0.1.0`` (the name was validated)."""
    return Path(key).name.split("-")[1]


def user_data(
    spec: JobSpec,
    node: NodeSpec,
    name: str,
    rdzv: Rendezvous,
    storage_uri: str,
    max_run_s: int | None = None,
) -> str:
    if spec.cloud == "local":
        return local_user_data(spec, node, name, rdzv, local_root(storage_uri))
    return cloud_user_data(spec, node, name, rdzv, storage_uri, max_run_s=max_run_s)


def node_env(spec: JobSpec, storage_uri: str) -> dict[str, str]:
    """``InstanceSpec.env``: the runtime's variables as the node sees its job folder."""
    if spec.cloud == "local":
        return worker_env(spec, str(local_root(storage_uri) / spec.job_id))
    return worker_env(spec, CLOUD_ROOT)


def cluster_spec(spec: JobSpec, storage_uri: str) -> ClusterSpec:
    return ClusterSpec(
        job_id=spec.job_id,
        cloud=spec.cloud,
        region=spec.region,
        ports=(spec.training.rdzv_port, spec.training.rdzv_port + 200),
        placement_group=len(spec.nodes) > 1 and spec.cloud != "local",
        storage_uri=None if spec.cloud == "local" else storage_uri,
        network=spec.placement.network,
        subnet=spec.placement.subnet,
        service_account=spec.placement.service_account,
        external_ip=spec.placement.external_ip,
    )


def instance_name(job_id: str, rank: int, launch: int) -> str:
    """``<job>-n<rank>-r<k>``: the k-th instance (0 = first, then replacements) of a rank."""
    return f"{job_id}-n{rank}-r{launch}"


def instance_spec(
    spec: JobSpec,
    node: NodeSpec,
    name: str,
    rdzv: Rendezvous,
    storage_uri: str,
    max_run_s: int | None = None,
) -> InstanceSpec:
    """The request for one node: its user-data, environment, tags and hard-stop cap
    (``max_run_s``: kplan/launcher/hardstop.py ``cap_seconds``; None: none)."""
    return InstanceSpec(
        job_id=spec.job_id,
        name=name,
        cloud=spec.cloud,
        region=spec.region,
        zone=node.zone,
        instance_type=node.instance_type,
        market=node.market,
        node_rank=node.node_rank,
        user_data=user_data(spec, node, name, rdzv, storage_uri, max_run_s),
        image=spec.install.image,
        env=node_env(spec, storage_uri),
        tags={TAG_JOB: spec.job_id, TAG_NODE: str(node.node_rank), TAG_MANAGED: "true"},
        max_run_s=None if spec.cloud == "local" else max_run_s,
    )
