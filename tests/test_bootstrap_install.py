"""Nodes install the kplan that launched them (issue 10): the wheel, its cache, and the
generated bootstrap script run for real in a clean environment where no index has kplan.

The "node" is this machine: a fresh virtual environment whose ``python3`` comes first on PATH
and sees torch, numpy and the other dependencies (symlinked from the test's own environment)
but not kplan; pip runs with ``PIP_NO_INDEX`` and a find-links folder holding only a decoy
``kplan-99.0.0`` wheel, which a ``pip install kplan`` by name would pick; the bucket is a
folder reached through stand-ins for ``aws`` and ``gsutil`` (tests/bootstrap_shims.py).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kplan import __version__
from kplan.app.launching import free_port
from kplan.cli.main import app
from kplan.core.errors import CloudError, InputError
from kplan.launcher.bootstrap import (
    CODE_KEY,
    cloud_user_data,
    rendezvous,
    ship_wheel,
    wheel_key,
    wheel_upload,
)
from kplan.launcher.jobspec import JobSpec, NodeSpec
from kplan.launcher.packing import pack_code
from kplan.launcher.storage import LocalStorage
from kplan.launcher.wheel import (
    NodeWheel,
    build_wheel,
    check_index_url,
    node_requirements,
    read_wheel,
    source_tree,
)
from tests.bootstrap_shims import node_tools

REPO = Path(__file__).resolve().parent.parent
runner = CliRunner()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> NodeWheel:
    return build_wheel(tmp_path_factory.mktemp("home"))


def _spec(
    script: Path, wheel: NodeWheel | None, cloud: str = "aws", gpus: int = 1, **options: object
) -> JobSpec:
    values: dict[str, object] = {
        "job_id": "kp-install-1",
        "cloud": cloud,
        "region": "r1",
        "script": str(script),
        "nodes": (NodeSpec(0, "t", "spot", "z1", gpus, 1.0),),
        "budget_usd": 10.0,
    }
    if wheel is not None:
        values.update(
            kplan_wheel=str(wheel.path),
            kplan_wheel_sha256=wheel.sha256,
            node_requirements=node_requirements(),
        )
    values.update(options)
    return JobSpec.build(**values)  # type: ignore[arg-type]


# --- the wheel and its cache -----------------------------------------------------------------


def test_the_wheel_is_this_kplan_with_every_package(wheel: NodeWheel) -> None:
    assert source_tree() == REPO
    assert wheel.name == f"kplan-{__version__}-py3-none-any.whl"
    assert wheel.sha256 == hashlib.sha256(wheel.path.read_bytes()).hexdigest()
    with zipfile.ZipFile(wheel.path) as zf:
        names = set(zf.namelist())
        metadata = zf.read(f"kplan-{__version__}.dist-info/METADATA").decode()
    # every package of the source tree is in it (pyproject.toml once missed three)
    packages = {
        str(Path(folder).relative_to(REPO))
        for folder, _, files in os.walk(REPO / "kplan")
        if "__init__.py" in files
    }
    assert {"kplan/runtime", "kplan/launcher/providers", "kplan/cli/commands"} <= packages
    for package in packages:
        assert f"{package}/__init__.py" in names, package
    assert "kplan/runtime/env.py" in names and "kplan/py.typed" in names
    assert any(n.startswith("kplan/catalogs/data/") for n in names)
    assert f"Version: {__version__}" in metadata
    assert not any(n.endswith(".pyc") or "__pycache__" in n for n in names)


def _copy_source(dest: Path) -> Path:
    shutil.copytree(
        REPO / "kplan", dest / "kplan", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    return dest


def test_an_unchanged_source_reuses_the_wheel_and_a_changed_one_rebuilds(tmp_path: Path) -> None:
    source = _copy_source(tmp_path / "src")
    home = tmp_path / "home"
    first = build_wheel(home, source)
    assert first.path.is_relative_to(home / "wheels")
    mtime = first.path.stat().st_mtime_ns
    again = build_wheel(home, source)  # how long a reuse takes: bench/failfast.py
    assert again == first and again.path.stat().st_mtime_ns == mtime  # not rebuilt
    (source / "kplan" / "runtime" / "env.py").write_text(
        (source / "kplan" / "runtime" / "env.py").read_text() + "\n# changed\n"
    )
    changed = build_wheel(home, source)
    assert changed.path != first.path and changed.sha256 != first.sha256
    with zipfile.ZipFile(changed.path) as zf:
        assert zf.read("kplan/runtime/env.py").decode().endswith("# changed\n")
    assert first.path.is_file()  # the old one stays for the jobs that use it
    assert not list(source.glob("build")) and not list(source.glob("*.egg-info"))


def test_a_failed_or_slow_build_is_one_line_and_a_hint(tmp_path: Path) -> None:
    source = _copy_source(tmp_path / "src")
    (source / "pyproject.toml").write_text("[project\nname = 'kplan'\n")
    with pytest.raises(CloudError, match="building kplan's wheel for the nodes failed") as err:
        build_wheel(tmp_path / "home", source)
    assert "\n" not in err.value.message and "setuptools" in err.value.hint
    good = _copy_source(tmp_path / "src2")
    with pytest.raises(CloudError, match=r"took longer than 0\.01 s"):
        build_wheel(tmp_path / "home", good, timeout_s=0.01)


def test_without_setuptools_the_build_fetches_only_its_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 3.12+ venv made by `pip install -e` has no setuptools: building offline without
    # isolation would fail there, so pip builds in isolation (it fetches setuptools, the build
    # backend, from the index); with setuptools here the build stays offline.
    from kplan.launcher.wheel import build_command

    online = build_command(tmp_path / "src", tmp_path / "out", have_setuptools=False)
    offline = build_command(tmp_path / "src", tmp_path / "out", have_setuptools=True)
    assert "--no-build-isolation" not in online and "--no-index" not in online
    assert {"--no-build-isolation", "--no-index", "--no-deps"} <= set(offline)
    assert online[-1] == offline[-1] == str(tmp_path / "src")  # a local tree, never a name
    assert "--no-index" in build_command(tmp_path / "src", tmp_path / "out")  # this venv
    # A 3.11 venv's own setuptools (65) cannot read pyproject's license string: isolation.
    from kplan.launcher import wheel

    monkeypatch.setattr(wheel, "setuptools_major", lambda: 65)
    assert "--no-index" not in build_command(tmp_path / "src", tmp_path / "out")


def test_the_node_requirements_pin_what_the_launcher_runs() -> None:
    reqs = dict(r.split("==") for r in node_requirements())
    for name in ("torch", "numpy", "scipy", "typer", "rich"):
        assert reqs[name] == importlib.metadata.version(name).split("+")[0], name
    assert all("+" not in v for v in reqs.values())  # no local build label (2.13.0+cpu)


def test_the_upload_checks_the_sha256(tmp_path: Path, wheel: NodeWheel) -> None:
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    storage = LocalStorage(tmp_path / "bucket")
    spec = _spec(script, wheel)
    text = ship_wheel(spec, storage)
    assert text is not None and wheel.sha256[:12] in text
    key = f"{spec.job_id}/{wheel_key(spec)}"
    assert key == f"kp-install-1/code/{wheel.name}"
    assert storage.get_bytes(key) == wheel.path.read_bytes()
    copy = tmp_path / wheel.name
    copy.write_bytes(wheel.path.read_bytes() + b"x")
    with pytest.raises(CloudError, match="changed since the job was planned"):
        read_wheel(str(copy), wheel.sha256)
    with pytest.raises(CloudError, match="cannot read kplan's wheel"):
        read_wheel(str(tmp_path / "gone.whl"), wheel.sha256)
    assert ship_wheel(_spec(script, None), storage) is None


# --- the script: never kplan by name --------------------------------------------------------


def _pip_install_args(text: str) -> list[list[str]]:
    out = []
    for line in text.splitlines():
        if "pip install" in line:
            out.append(shlex.split(line.split("pip install", 1)[1].split("||")[0]))
    return out


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_no_script_installs_kplan_by_name(tmp_path: Path, wheel: NodeWheel, cloud: str) -> None:
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    uri = "s3://b/p" if cloud == "aws" else "gs://b/p"
    variants = {
        "pinned": _spec(script, wheel, cloud),
        "index": _spec(script, wheel, cloud, pip_index_url="https://pypi.example.com/simple"),
        "image": _spec(script, wheel, cloud, install_deps=False, image="img-1"),
        "no wheel": _spec(script, None, cloud),
    }
    for what, spec in variants.items():
        text = cloud_user_data(spec, spec.nodes[0], "h", rendezvous(spec, 0, None), uri)
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)
        assert not re.search(r"kplan\[|install[^\n]*\bkplan\b(?![-/])", text), what
        for args in _pip_install_args(text):
            named = [a for a in args if re.match(r"^kplan($|[\[=<>~!])", a)]
            assert not named, (what, args)
        if what == "no wheel":
            assert "ships no kplan wheel" in text and "fail 96" in text
            assert "pip install" not in text.split("fail()")[1].split("job.tar.gz")[0]
            continue
        installs = next(a for a in _pip_install_args(text) if "$WHEEL" in a)
        assert installs[:2] == ["--quiet", "$WHEEL"], installs
        assert f'WHEEL="$W/wheel/{wheel.name}"' in text and wheel.sha256 in text
        # the only "kplan==" is the constraint that keeps later installs on this one
        assert text.count("kplan==") == 1
        assert f'echo "kplan=={__version__}" > "$W/wheel/constraints.txt"' in text
        if what == "image":
            assert installs[2:] == ["--no-deps"] and "torch==" not in text
        else:
            assert installs[2:] == list(node_requirements())
    index = variants["index"]
    text = cloud_user_data(index, index.nodes[0], "h", rendezvous(index, 0, None), uri)
    assert "export PIP_INDEX_URL=https://pypi.example.com/simple" in text


def test_the_dry_run_shows_the_wheel_upload(tmp_path: Path, wheel: NodeWheel) -> None:
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    spec = _spec(script, wheel, install_deps=False)
    doc = wheel_upload(spec)
    assert doc is not None
    assert doc["key"] == f"kp-install-1/code/{wheel.name}" and doc["bytes"] == wheel.size
    assert doc["sha256"] == wheel.sha256 and doc["installs_with"] == ["--no-deps"]
    assert wheel_upload(_spec(script, None)) is None


# --- validation: JobSpec and kplan launch ------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("ftp://mirror.example.com/simple", "not an http://, https:// or file:// URL"),
        ("pypi.example.com/simple", "not an http://, https:// or file:// URL"),
        ("https://", "not an http://, https:// or file:// URL"),
        ("https://user:tok@pypi.example.com/simple", "user name or password"),
        ("https://pypi.example.com/sim ple", "spaces or control characters"),
        ("", "empty"),
    ],
)
def test_bad_index_urls_are_refused(url: str, needle: str) -> None:
    with pytest.raises(InputError, match=re.escape(needle)):
        check_index_url(url)


def test_good_index_urls_and_the_jobspec_round_trip(tmp_path: Path, wheel: NodeWheel) -> None:
    for url in ("https://pypi.example.com/simple", "http://10.0.0.5:8080/", "file:///srv/idx"):
        assert check_index_url(url) == url
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    spec = _spec(script, wheel, pip_index_url="https://pypi.example.com/simple")
    again = JobSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec and again.install.requirements == spec.install.requirements
    old = spec.to_dict()
    old.pop("install")
    assert JobSpec.from_dict(old).install.wheel is None  # a job recorded before the wheel
    bad = [
        {"kplan_wheel": str(wheel.path), "kplan_wheel_sha256": None},
        {"kplan_wheel": "/x/evil.sh", "kplan_wheel_sha256": "a" * 64},
        {"kplan_wheel": str(wheel.path), "kplan_wheel_sha256": "z" * 64},
        {"node_requirements": ("--index-url=https://evil.example.com",)},
        {"node_requirements": ("torch==2.5 ; rm -rf /",)},
    ]
    for change in bad:
        with pytest.raises(InputError):
            JobSpec.from_dict({**spec.to_dict(), **change})


@pytest.fixture
def cli_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KPLAN_HOME", str(tmp_path / "home"))
    return tmp_path


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--cloud", "aws", "--pip-index-url", "ftp://x.example.com/"], "--pip-index-url"),
        (["--cloud", "gcp", "--pip-index-url", "https://u:p@x.example.com/"], "password"),
        (["--cloud", "aws", "--image", "ami 1"], "--image"),
        (["--image", "ami-1"], "are for --cloud aws or gcp"),
        (["--no-install-deps"], "are for --cloud aws or gcp"),
        (["--cloud", "local", "--pip-index-url", "https://x.example.com/"], "for --cloud aws"),
    ],
)
def test_launch_refuses_bad_install_flags(cli_home: Path, argv: list[str], needle: str) -> None:
    script = cli_home / "train.py"
    script.write_text("print(1)\n")
    args = ["launch", str(script), "--budget", "5", "--example-profile", "cifar10-resnet18"]
    if "--cloud" not in argv or "local" in argv:
        args = ["launch", str(script), "--budget", "5"]
    res = runner.invoke(app, [*args, *argv, "--dry-run"])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output
    assert not (cli_home / "home" / "wheels").exists()  # refused before building anything


def test_launch_help_names_the_install_options() -> None:
    res = runner.invoke(app, ["launch", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    for flag in ("--pip-index-url", "--no-install-deps", "--image"):
        assert flag in res.output, flag


# --- the bootstrap script itself, on a clean "node" -------------------------------------------


def _decoy(folder: Path) -> Path:
    """A kplan 99.0.0 wheel that is not ours: on the index a by-name install would pick it."""
    files = {
        "kplan/__init__.py": b"raise SystemExit('the decoy kplan from the index ran')\n",
        "kplan-99.0.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: kplan\nVersion: 99.0.0\n",
        "kplan-99.0.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("kplan-99.0.0.dist-info/RECORD,,")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "kplan-99.0.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr("kplan-99.0.0.dist-info/RECORD", "\n".join(record) + "\n")
    return path


@pytest.fixture(scope="module")
def deps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This environment's packages (torch, numpy, pip, ...) without kplan, as symlinks."""
    folder = tmp_path_factory.mktemp("deps")
    site = Path(sysconfig.get_path("purelib"))
    for entry in site.iterdir():
        if entry.name.startswith(("kplan", "__editable__", "_kplan")) or entry.suffix == ".pth":
            continue
        (folder / entry.name).symlink_to(entry)
    return folder


def _clean_venv(venv: Path, deps: Path) -> Path:
    """A fresh venv without pip or kplan that sees ``deps`` (a .pth file); its python3."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python3"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "deps.pth").write_text(f"{deps}\n")
    return python


@pytest.fixture
def node(tmp_path: Path, deps: Path) -> Iterator[dict[str, Path]]:
    """A clean node: a fresh venv (python3 first on PATH) that sees ``deps`` but no kplan."""
    venv = tmp_path / "venv"
    python = _clean_venv(venv, deps)
    yield {
        "venv": venv,
        "python": python,
        "index": tmp_path / "index",
        "bucket": tmp_path / "bucket",
        "tools": node_tools(tmp_path / "tools", tmp_path / "powered-off"),
        "powered_off": tmp_path / "powered-off",
        "root": tmp_path / "node",
    }


def _env(node: dict[str, Path], tmp_path: Path) -> dict[str, str]:
    return {
        "PATH": f"{node['tools']}:{node['venv'] / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "FAKE_S3": str(node["bucket"]),
        "FAKE_GCS": str(node["bucket"]),
        "PIP_NO_INDEX": "1",  # no index at all ...
        "PIP_FIND_LINKS": str(node["index"]),  # ... but find-links with a decoy kplan
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_CACHE_DIR": "1",
    }


def _kplan_on_node(node: dict[str, Path], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    code = "import kplan, importlib.metadata as m; print(kplan.__file__, m.version('kplan'))"
    return subprocess.run(
        [node["python"], "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(node, tmp_path),
        check=False,
    )


def _stage(node: dict[str, Path], spec: JobSpec, uri: str, wheel: NodeWheel) -> Path:
    """The launcher's uploads, into the fake bucket: the code and the wheel."""
    store = node["bucket"] / uri.split("://", 1)[1] / spec.job_id
    (store / CODE_KEY).parent.mkdir(parents=True)
    (store / CODE_KEY).write_bytes(pack_code(Path(spec.script)).data)
    ship_wheel(spec, LocalStorage(store.parent))
    assert (store / "code" / wheel.name).read_bytes() == wheel.path.read_bytes()
    return store


@pytest.mark.slow
def test_the_bootstrap_installs_the_shipped_kplan_on_a_clean_node_and_trains(
    tmp_path: Path, wheel: NodeWheel, node: dict[str, Path]
) -> None:
    decoy = _decoy(node["index"])
    env = _env(node, tmp_path)
    # the node as it boots: torch is there, kplan is not, and a by-name install gets the decoy
    before = _kplan_on_node(node, tmp_path)
    assert before.returncode != 0 and "No module named 'kplan'" in before.stderr
    probe = [node["python"], "-c", "import torch, numpy; print(torch.__version__)"]
    assert subprocess.run(probe, env=env, capture_output=True, check=False).returncode == 0
    got = subprocess.run(
        [node["python"], "-m", "pip", "download", "--no-deps", "-d", tmp_path / "dl", "kplan"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert got.returncode == 0 and (tmp_path / "dl" / decoy.name).is_file(), got.stderr
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(REPO / "kplan" / "examples" / "mlp_regression.py", code / "mlp_regression.py")
    spec = _spec(
        code / "mlp_regression.py",
        wheel,
        gpus=2,  # two gloo workers on the one node
        args=("--epochs", "1", "--samples", "1024", "--batch-size", "128"),
        rdzv_port=free_port(),
    )
    store = _stage(node, spec, "s3://bkt/pfx", wheel)
    text = cloud_user_data(
        spec, spec.nodes[0], "h", rendezvous(spec, 0, None), "s3://bkt/pfx", str(node["root"])
    )
    t0 = time.perf_counter()
    proc = subprocess.run(["bash", "-c", text], env=env, timeout=240, check=False)
    elapsed = time.perf_counter() - t0
    log = (node["root"] / "logs" / "node-0.log").read_text()
    assert proc.returncode == 0, log
    status = json.loads((store / "status" / "node-0.json").read_text())
    assert status["exit_code"] == 0 and status["node_rank"] == 0
    assert "epoch 0 mse" in log and "decoy" not in log
    assert list((store / "metrics").glob("*")), "no metrics reached the bucket"
    assert node["powered_off"].exists()
    after = _kplan_on_node(node, tmp_path)
    assert after.returncode == 0, after.stderr
    where, version = after.stdout.split()
    assert Path(where).is_relative_to(node["venv"]) and version == __version__  # not 99.0.0
    installed = node["venv"] / "lib"
    assert list(installed.glob("python3*/site-packages/kplan-*.dist-info"))
    print(f"bootstrap on a clean node: {elapsed:.1f} s")


@pytest.mark.parametrize("damage", ["tampered", "missing"])
def test_a_tampered_or_missing_wheel_stops_the_node_with_code_96(
    tmp_path: Path, wheel: NodeWheel, node: dict[str, Path], damage: str
) -> None:
    _decoy(node["index"])
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir()
    script.write_text("raise SystemExit('the job must not start')\n")
    spec = _spec(script, wheel, cloud="gcp", rdzv_port=free_port())
    store = _stage(node, spec, "gs://bkt/pfx", wheel)
    shipped = store / "code" / wheel.name
    if damage == "tampered":
        data = bytearray(shipped.read_bytes())
        data[len(data) // 2] ^= 0xFF  # one byte changed: still a file of the same size
        shipped.write_bytes(bytes(data))
    else:
        shipped.unlink()
    text = cloud_user_data(
        spec, spec.nodes[0], "h", rendezvous(spec, 0, None), "gs://bkt/pfx", str(node["root"])
    )
    proc = subprocess.run(["bash", "-c", text], env=_env(node, tmp_path), timeout=60, check=False)
    log = (node["root"] / "logs" / "node-0.log").read_text()
    assert proc.returncode == 96, log
    assert json.loads((store / "status" / "node-0.json").read_text())["exit_code"] == 96
    reason = "does not match its sha256" if damage == "tampered" else "cannot fetch the kplan"
    assert reason in log and "must not start" not in log
    assert node["powered_off"].exists()
    assert _kplan_on_node(node, tmp_path).returncode != 0  # nothing was installed


# --- the launcher uploads it -------------------------------------------------------------------


def test_a_launch_uploads_the_wheel_before_any_instance(tmp_path: Path, wheel: NodeWheel) -> None:
    from kplan.launcher.clock import FakeClock
    from kplan.launcher.lifecycle import run_job
    from kplan.launcher.providers import Backend
    from kplan.launcher.state import StateDB
    from kplan.planner.catalog import Billing
    from tests.launcher_fakes import SimProvider

    script = tmp_path / "code" / "train.py"
    script.parent.mkdir()
    script.write_text("print('train')\n")
    storage = LocalStorage(tmp_path / "store")
    storage.uri = "s3://bucket/kplan"
    clock = FakeClock()
    seen: list[bool] = []

    class Watching(SimProvider):
        def run_instances(self, cluster: object, specs: object) -> object:  # type: ignore[override]
            seen.append(storage.get_bytes(f"kp-install-1/code/{wheel.name}") is not None)
            return super().run_instances(cluster, specs)  # type: ignore[arg-type]

    sim = Watching(clock, storage, finish_at=clock.now() + 600)
    spec = _spec(script, wheel, check_interval_s=30.0)
    with StateDB.open(tmp_path / "kplan.db") as db:
        out = run_job(
            spec, Backend(sim, storage), db, clock=clock, billing=Billing("aws", 60.0, 1.0, "t")
        )
        events = [e.message for e in db.events(spec.job_id) if e.kind == "code"]
    assert out.status == "succeeded" and seen == [True]
    assert storage.get_bytes(f"kp-install-1/code/{wheel.name}") == wheel.path.read_bytes()
    assert any(f"uploaded kplan's wheel {wheel.name}" in m for m in events), events
    assert all(f'WHEEL="$W/wheel/{wheel.name}"' in s.user_data for s in sim.launched)


def test_an_aws_launch_puts_the_wheel_in_the_bucket_through_boto3(
    tmp_path: Path, wheel: NodeWheel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real boto3 client against a moto server: the S3 object is the wheel, byte for byte,
    and the instance's user-data fetches that key and checks that sha256."""
    from kplan.launcher.clock import SystemClock
    from kplan.launcher.lifecycle import run_job
    from kplan.launcher.providers import Backend
    from kplan.launcher.providers.aws import AwsProvider
    from kplan.launcher.providers.aws_common import AwsConfig
    from kplan.launcher.providers.aws_storage import S3Storage
    from kplan.launcher.state import EventRecord, StateDB
    from tests.aws_server import PROFILE, REGION, ZONE, MotoAws, fake_credentials

    bucket = "kplan-wheel"
    server = MotoAws()
    try:
        fake_credentials(monkeypatch)
        server.instance_profile()
        s3 = server.client("s3")
        s3.create_bucket(Bucket=bucket)
        config = AwsConfig(
            region=REGION, endpoint_url=server.url, instance_profile=PROFILE,
            image_id="ami-12c6146b", placement_groups=False, backoff_s=0.0, poll_s=0.05,
            cleanup_timeout_s=5.0,
        )  # fmt: skip
        backend = Backend(AwsProvider(config), S3Storage(f"s3://{bucket}/jobs", config))
        script = tmp_path / "code" / "train.py"
        script.parent.mkdir()
        script.write_text("print('train')\n")
        spec = _spec(
            script, wheel, check_interval_s=0.1, grace_s=1.0, teardown_s=10.0,
            finish_grace_s=5.0, provision_timeout_s=30.0,
        )  # fmt: skip
        doc = spec.to_dict()
        doc["nodes"][0].update(zone=ZONE, instance_type="g5.xlarge")
        spec = JobSpec.from_dict({**doc, "region": REGION})
        db = StateDB.open(tmp_path / "kplan.db")

        def stop_at_head(event: EventRecord) -> None:
            if event.kind == "head":
                db.request_stop(spec.job_id, "test", event.time)

        outcome = run_job(spec, backend, db, clock=SystemClock(), on_event=stop_at_head)
        db.close()
        assert outcome.status == "cancelled", outcome.reason
        assert server.leftovers(spec.job_id)["instances"] == []
        key = f"jobs/{spec.job_id}/code/{wheel.name}"
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert hashlib.sha256(body).hexdigest() == wheel.sha256 and body == wheel.path.read_bytes()
        ec2 = server.client("ec2")
        ids = [
            i["InstanceId"]
            for r in ec2.describe_instances()["Reservations"]
            for i in r["Instances"]
            if {"Key": "kplan-job", "Value": spec.job_id} in i.get("Tags", [])
        ]
        assert ids
        raw = ec2.describe_instance_attribute(InstanceId=ids[0], Attribute="userData")
        user_data = base64.b64decode(raw["UserData"]["Value"]).decode()
        assert f'"$STORE/code/{wheel.name}" "$WHEEL"' in user_data
        assert f'echo "{wheel.sha256}  $WHEEL" | sha256sum' in user_data
    finally:
        server.stop()


def test_a_kplan_installed_from_its_wheel_ships_itself_again(
    tmp_path: Path, wheel: NodeWheel, node: dict[str, Path], deps: Path
) -> None:
    """No source tree (kplan installed from a wheel): the installed files are packed again,
    and that wheel installs and imports on another clean node."""
    env = _env(node, tmp_path)
    subprocess.run(
        [node["python"], "-m", "pip", "install", "--quiet", "--no-deps", str(wheel.path)],
        env=env,
        check=True,
    )
    code = (
        "import sys; from pathlib import Path; from kplan.launcher.wheel import build_wheel, "
        "source_tree; assert source_tree() is None; w = build_wheel(Path(sys.argv[1])); "
        "print(w.path)"
    )
    got = subprocess.run(
        [node["python"], "-c", code, str(tmp_path / "home")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert got.returncode == 0, got.stderr
    again = Path(got.stdout.strip())
    assert again.is_relative_to(tmp_path / "home" / "wheels") and again.name == wheel.name
    with zipfile.ZipFile(wheel.path) as a, zipfile.ZipFile(again) as b:
        ours = {n: a.read(n) for n in a.namelist() if n.startswith("kplan/")}
        theirs = {n: b.read(n) for n in b.namelist() if n.startswith("kplan/")}
        meta = b.read(f"kplan-{__version__}.dist-info/METADATA").decode()
    assert ours == theirs and f"Version: {__version__}" in meta
    # a second clean node installs the re-packed wheel and imports kplan from it
    other = tmp_path / "other"
    python = _clean_venv(other, deps)
    subprocess.run([python, "-m", "pip", "install", "--quiet", str(again)], env=env, check=True)
    probe = "import kplan.runtime, kplan.cli.main, kplan; print(kplan.__file__)"
    out = subprocess.run(
        [python, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert Path(out.stdout.strip()).is_relative_to(other)


# --- a node whose python3 has no pip (Debian/Ubuntu: ensurepip disabled) ----------------------

_NO_ENSUREPIP = """#!/bin/bash
# the node's python3, with ensurepip disabled as Debian and Ubuntu ship it
if [ "$1 $2" = "-m ensurepip" ]; then
  echo "ensurepip is disabled in Debian/Ubuntu for the system python" >&2; exit 1
fi
exec {python} "$@"
"""

_APT_GET = """#!/bin/bash
# apt-get update | install -y python3-pip: "installs" pip where the node's python3 sees it
echo "apt-get $*" >> {log}
case " $* " in *" install "*) ln -s {pip} {deps}/pip;; esac
"""

_SYSTEM_TOOLS = (
    "bash", "awk", "mkdir", "sleep", "touch", "mv", "cp", "tar", "gzip", "sha256sum", "dirname",
    "cat", "rm", "ln",
)  # fmt: skip


@pytest.mark.parametrize("apt", [True, False])
def test_a_node_without_pip_gets_it_from_apt_or_stops_with_97(
    tmp_path: Path, wheel: NodeWheel, deps: Path, apt: bool
) -> None:
    """ensurepip disabled: with apt-get the bootstrap installs python3-pip and goes on; without
    it the node stops with 97 and says why. PATH holds only the tools the script needs."""
    bare = tmp_path / "deps"  # this environment's packages without pip
    bare.mkdir()
    for entry in deps.iterdir():
        if entry.name != "pip":
            (bare / entry.name).symlink_to(entry.resolve())
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    real = venv / "bin" / "python3"
    purelib = subprocess.run(
        [real, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "deps.pth").write_text(f"{bare}\n")
    tools = node_tools(tmp_path / "tools", tmp_path / "powered-off")
    (tools / "python3").write_text(_NO_ENSUREPIP.format(python=real))
    (tools / "python3").chmod(0o755)
    if apt:
        text = _APT_GET.format(log=tmp_path / "apt.log", pip=(deps / "pip").resolve(), deps=bare)
        (tools / "apt-get").write_text(text)
        (tools / "apt-get").chmod(0o755)
    system = tmp_path / "system"
    system.mkdir()
    for name in _SYSTEM_TOOLS:
        found = shutil.which(name)
        assert found is not None, name
        (system / name).symlink_to(found)
    node = {"tools": tools, "venv": venv, "bucket": tmp_path / "bucket", "index": tmp_path}
    env = {**_env(node, tmp_path), "PATH": f"{tools}:{system}"}
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir()
    script.write_text("import kplan.runtime.env\nprint('started with kplan', flush=True)\n")
    spec = _spec(script, wheel, install_deps=False, rdzv_port=free_port())
    store = _stage(node, spec, "s3://bkt/pfx", wheel)
    root = tmp_path / "node"
    text = cloud_user_data(
        spec, spec.nodes[0], "h", rendezvous(spec, 0, None), "s3://bkt/pfx", str(root)
    )
    subprocess.run(["bash", "-c", text], env=env, timeout=180, check=False)
    log = (root / "logs" / "node-0.log").read_text()
    status = json.loads((store / "status" / "node-0.json").read_text())
    if apt:
        assert status["exit_code"] == 0, log
        assert "started with kplan" in log
        calls = (tmp_path / "apt.log").read_text().splitlines()
        assert calls == ["apt-get -q update", "apt-get -q -y install python3-pip"]
    else:
        assert status["exit_code"] == 97, log
        assert "has no pip" in log and "started" not in log


def test_the_codes_requirements_cannot_swap_in_an_index_kplan(
    tmp_path: Path, wheel: NodeWheel, node: dict[str, Path]
) -> None:
    """A requirements.txt beside the script asking for kplan>=99 (the decoy on the index) fails
    the node with 99 instead of replacing the shipped kplan."""
    _decoy(node["index"])
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("raise SystemExit('the job must not start')\n")
    (code / "requirements.txt").write_text("kplan>=99\n")
    spec = _spec(code / "train.py", wheel, rdzv_port=free_port())
    store = _stage(node, spec, "s3://bkt/pfx", wheel)
    text = cloud_user_data(
        spec, spec.nodes[0], "h", rendezvous(spec, 0, None), "s3://bkt/pfx", str(node["root"])
    )
    assert 'export PIP_CONSTRAINT="$W/wheel/constraints.txt"' in text
    subprocess.run(["bash", "-c", text], env=_env(node, tmp_path), timeout=120, check=False)
    log = (node["root"] / "logs" / "node-0.log").read_text()
    assert json.loads((store / "status" / "node-0.json").read_text())["exit_code"] == 99, log
    after = _kplan_on_node(node, tmp_path)
    assert after.returncode == 0 and after.stdout.split()[1] == __version__, after.stderr


def test_launch_dry_run_ships_this_kplan_with_the_chosen_install_options(cli_home: Path) -> None:
    """Through the CLI (offline): the wheel upload, its sha256, and user-data that installs it
    with --no-deps from --pip-index-url on --image."""
    script = cli_home / "train.py"
    script.write_text("print(1)\n")
    res = runner.invoke(
        app,
        [
            "launch", str(script), "--budget", "50", "--cloud", "aws",
            "--example-profile", "cifar10-resnet18", "--pip-index-url",
            "https://pypi.example.com/simple", "--no-install-deps", "--image", "ami-0abc",
            "--dry-run", "--json",
        ],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    upload = doc["requests"][1]
    assert upload["call"] == "storage.put_bytes" and upload["key"].endswith(
        f"/code/kplan-{__version__}-py3-none-any.whl"
    )
    built = Path(upload["from"])
    assert built.is_relative_to(cli_home / "home" / "wheels")
    assert hashlib.sha256(built.read_bytes()).hexdigest() == upload["sha256"]
    assert upload["installs_with"] == ["--no-deps"] and upload["bytes"] == built.stat().st_size
    heads = [i for r in doc["requests"] if "instances" in r for i in r["instances"]]
    for inst in heads:
        assert inst["image"] == "ami-0abc"
        assert "export PIP_INDEX_URL=https://pypi.example.com/simple" in inst["user_data"]
        assert f'echo "{upload["sha256"]}  $WHEEL"' in inst["user_data"]
        assert 'pip install --quiet "$WHEEL" --no-deps' in inst["user_data"]
