"""Node bootstrap: no credentials anywhere, and the cloud script really runs (with stub tools)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kplan.core.threads import usable_cores
from kplan.launcher.bootstrap import (
    CODE_KEY,
    cloud_user_data,
    instance_spec,
    local_user_data,
    rendezvous,
    ship_wheel,
)
from kplan.launcher.dryrun import dry_run
from kplan.launcher.jobspec import JobSpec, NodeSpec
from kplan.launcher.ledger import LocalBilling
from kplan.launcher.packing import pack_code
from kplan.launcher.storage import LocalStorage
from kplan.launcher.wheel import build_wheel
from tests.bootstrap_shims import node_tools, write_tool

SECRETS = {
    "AWS_ACCESS_KEY_ID": "AKIAEXAMPLEKEY123456",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY",
    "AWS_SESSION_TOKEN": "FwoGZXIvYXdzEXAMPLESESSIONTOKEN",
    "GOOGLE_APPLICATION_CREDENTIALS": "/home/me/secret-sa-key.json",
    "HF_TOKEN": "hf_exampletokenvalue",
    "KPLAN_SECRET_PROBE": "probe-value-must-not-leak",
}


def _cloud_spec(tmp_path: Path, cloud: str, nodes: int = 2) -> JobSpec:
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir(exist_ok=True)
    if not script.exists():
        script.write_text("print('hi')\n")
    return JobSpec.build(
        job_id="kp-boot-1",
        cloud=cloud,
        region="r1",
        script=str(script),
        args=("--epochs", "3", "it's quoted"),
        nodes=tuple(NodeSpec(r, "t", "spot", "z1", 2, 1.0) for r in range(nodes)),
        budget_usd=10.0,
        global_batch=256,
        accum_steps=2,
        checkpoint_interval_s=300.0,
    )


def test_no_credentials_reach_a_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    texts = []
    for cloud, uri in (("aws", "s3://b/p"), ("gcp", "gs://b/p"), ("local", tmp_path.as_uri())):
        spec = _cloud_spec(tmp_path, cloud)
        if cloud == "local":
            spec = JobSpec.local(spec.script, spec.args, nodes=2, job_id="kp-boot-1")
        for node, host in ((spec.nodes[0], None), (spec.nodes[1], "10.0.0.2")):
            ispec = instance_spec(spec, node, "n", rendezvous(spec, 0, host), uri)
            assert all(k.startswith(("KPLAN_", "TORCH_")) for k in ispec.env), ispec.env
            texts += [ispec.user_data, json.dumps(dict(ispec.env)), json.dumps(dict(ispec.tags))]
        run = dry_run(spec, uri, LocalBilling())
        # file names and sizes only; its key names say "secrets"
        assert run.code is None or run.code.files == (("train.py", 12),)
        doc = run.to_dict()
        del doc["code"]
        texts.append(json.dumps(doc))
    blob = "\n".join(texts)
    for key, value in SECRETS.items():
        assert key not in blob and value not in blob
    assert not re.search(r"AKIA[0-9A-Z]{12,}|secret|password|aws_access|private_key", blob, re.I)


def test_the_cloud_scripts_are_valid_bash_with_the_right_tools(tmp_path: Path) -> None:
    for cloud, uri, tool in (("aws", "s3://b/p", "aws s3 cp"), ("gcp", "gs://b/p", "gsutil -q cp")):
        spec = _cloud_spec(tmp_path, cloud)
        head = cloud_user_data(spec, spec.nodes[0], "h", rendezvous(spec, 0, None), uri)
        worker = cloud_user_data(spec, spec.nodes[1], "w", rendezvous(spec, 0, "10.9.8.7"), uri)
        for text in (head, worker):
            subprocess.run(["bash", "-n"], input=text, text=True, check=True)
            assert text.startswith("#!/bin/bash") and tool in text and "poweroff" in text
            assert '--rdzv-endpoint="$HEAD_ADDR":29400' in text and "--nnodes=1:2" in text
            assert "export KPLAN_GLOBAL_BATCH=256" in text
            assert "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in text
        assert 'HEAD_ADDR="$MY_ADDR"' in head and "is_host=1" in head
        assert "HEAD_ADDR=10.9.8.7" in worker and "is_host=0" in worker


def test_local_user_data_runs_torchrun_with_elastic_c10d(tmp_path: Path) -> None:
    spec = JobSpec.local(str(tmp_path / "t.py"), ("a b",), nodes=3, job_id="kp-boot-2")
    text = local_user_data(spec, spec.nodes[1], "x", rendezvous(spec, 2, "127.0.0.1"), tmp_path)
    subprocess.run(["sh", "-n"], input=text, text=True, check=True)
    assert "--rdzv-endpoint=127.0.0.1:29402" in text and "--rdzv-id=kp-boot-2-g2" in text
    assert "--nnodes=1:3" in text and "--max-restarts=10" in text and "'a b'" in text
    assert "is_host=0" in text and f"{tmp_path}/kp-boot-2/logs/node-1.log" in text
    # three groups of one worker share this machine's cores: an even share each, unless the
    # user's OMP_NUM_THREADS says otherwise
    share = max(1, usable_cores() // 3)
    assert f'OMP_NUM_THREADS="${{OMP_NUM_THREADS:-{share}}}" ' in text


def test_local_workers_get_an_even_share_of_the_cores_unless_the_user_set_threads(
    tmp_path: Path,
) -> None:
    """The node's command line, run by sh: the workers see the share, or the user's value."""
    spec = JobSpec.local(str(tmp_path / "t.py"), nodes=2, workers_per_node=2, job_id="kp-boot-3")
    text = local_user_data(spec, spec.nodes[0], "x", rendezvous(spec, 1, "127.0.0.1"), tmp_path)
    line = next(x for x in text.splitlines() if "OMP_NUM_THREADS=" in x)
    probe = line.partition(" ")[0] + " sh -c 'echo \"$OMP_NUM_THREADS\"'"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run(["sh", "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(max(1, usable_cores() // 4))
    env["OMP_NUM_THREADS"] = "3"
    out = subprocess.run(["sh", "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "3"


_TRAIN = """
import json, os, time
from pathlib import Path
ckpt = Path(os.environ["KPLAN_CHECKPOINT_DIR"])
(ckpt / "step-1").mkdir(parents=True, exist_ok=True)
(ckpt / "step-1" / f"rank-{os.environ['RANK']}.pt").write_text("w")
print("trained rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], flush=True)
"""


@pytest.mark.slow
def test_the_aws_bootstrap_runs_a_real_torchrun_and_reports(tmp_path: Path) -> None:
    """Run the head's user-data with stub aws/hostname/poweroff/pip: code fetched from the
    bucket, torchrun trains, checkpoints and the log are synced, the status uploaded."""
    spec = _cloud_spec(tmp_path, "aws", nodes=1)
    Path(spec.script).write_text(_TRAIN)
    wheel = build_wheel(tmp_path / "home")
    spec = JobSpec.from_dict(
        {
            **spec.to_dict(),
            "kplan_wheel": str(wheel.path),
            "kplan_wheel_sha256": wheel.sha256,
            "node_requirements": ["torch==2.0.1", "numpy==1.26.4"],
        }
    )
    bucket = tmp_path / "s3"
    code = bucket / "b" / "p" / spec.job_id / CODE_KEY
    code.parent.mkdir(parents=True)
    code.write_bytes(pack_code(Path(spec.script)).data)
    assert ship_wheel(spec, LocalStorage(bucket / "b" / "p")) is not None
    stubs = node_tools(tmp_path / "bin", tmp_path / "powered-off")
    real = shutil.which("python3", path=str(Path(sys.executable).parent)) or sys.executable
    write_tool(
        stubs,
        "python3",
        f'#!/bin/bash\nif [ "$1 $2" = "-m pip" ]; then\n'
        f'  echo "pip $*" >> {tmp_path}/pip.log; exit 0\nfi\nexec {real} "$@"\n',
    )
    node_root = tmp_path / "node"
    spec = JobSpec.from_dict({**spec.to_dict(), "args": [], "rdzv_port": 29471})
    text = cloud_user_data(
        spec, spec.nodes[0], "h", rendezvous(spec, 0, None), "s3://b/p", str(node_root)
    )
    env = {
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "FAKE_S3": str(bucket),
        "HOME": str(tmp_path),
    }
    proc = subprocess.run(["bash", "-c", text], env=env, timeout=180, check=False)
    log = (node_root / "logs" / "node-0.log").read_text()
    assert proc.returncode == 0, log
    store = bucket / "b" / "p" / spec.job_id
    status = json.loads((store / "status" / "node-0.json").read_text())
    assert status["exit_code"] == 0 and status["node_rank"] == 0
    assert "trained rank 0 of 2" in log and "trained rank 1 of 2" in log
    assert (store / "ckpt" / "step-1" / "rank-1.pt").read_text() == "w"
    assert "trained rank 0" in (store / "logs" / "node-0.log").read_text()
    assert (tmp_path / "powered-off").exists()
    # umask 077 on the node: the log and what the job wrote are the node user's alone
    for path in (node_root / "logs" / "node-0.log", node_root / "ckpt" / "step-1" / "rank-1.pt"):
        assert path.stat().st_mode & 0o077 == 0, oct(path.stat().st_mode)
    pip_log = (tmp_path / "pip.log").read_text()  # the shipped wheel, never kplan by name
    assert f"install --quiet {node_root}/wheel/{wheel.name} torch==2.0.1 numpy==1.26.4" in pip_log
    assert "kplan[" not in pip_log and " kplan " not in pip_log
