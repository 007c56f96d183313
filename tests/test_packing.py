"""The code packer ships only code: ignore files, secrets always left out, no home directory,
no link followed out of the folder, caps; what --dry-run shows; and, end to end through the
real boto3 client against a moto server, that the uploaded code object holds no secret."""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kplan.cli.main import app
from kplan.core.errors import InputError
from kplan.launcher import providers
from kplan.launcher.bootstrap import CODE_KEY, job_key
from kplan.launcher.clock import FakeClock, SystemClock
from kplan.launcher.jobspec import JobSpec, NodeSpec, new_job_id
from kplan.launcher.lifecycle import run_job
from kplan.launcher.packing import (
    PackedCode,
    code_folder,
    is_ignored,
    is_secret,
    pack_code,
    parse_ignore,
)
from kplan.launcher.providers import Backend
from kplan.launcher.state import EventRecord, StateDB
from kplan.launcher.storage import LocalStorage
from kplan.planner.catalog import Billing
from tests import launcher_fakes
from tests.aws_server import BUCKET, REGION, ZONE, MotoAws, fake_credentials, moto_backend
from tests.launcher_fakes import SimProvider, fast_dir

runner = CliRunner()

# --- gitignore semantics: (ignore file text, path, is a directory, ignored?) ----------------

CASES = [
    # a name without a slash matches at any depth
    ("*.log", "a.log", False, True),
    ("*.log", "deep/er/a.log", False, True),
    ("*.log", "a.log.txt", False, False),
    ("data", "data", True, True),
    ("data", "x/data", False, True),
    # comments, blank lines, trailing spaces, escapes
    ("# data\n\n", "# data", False, False),
    ("\\#data", "#data", False, True),
    ("out   ", "out", False, True),
    ("\\!x", "!x", False, True),
    ("a\\*b", "a*b", False, True),
    ("a\\*b", "axb", False, False),
    # a leading or inner slash anchors to the ignore file's folder
    ("/build", "build", True, True),
    ("/build", "src/build", True, False),
    ("doc/out", "doc/out", False, True),
    ("doc/out", "x/doc/out", False, False),
    # a trailing slash: directories only
    ("cache/", "cache", True, True),
    ("cache/", "cache", False, False),
    ("cache/", "a/cache", True, True),
    # * and ? stay within one segment; [...] classes
    ("a/*.py", "a/b.py", False, True),
    ("a/*.py", "a/b/c.py", False, False),
    ("file?.txt", "file1.txt", False, True),
    ("file?.txt", "file10.txt", False, False),
    ("run[0-9]", "run7", True, True),
    ("run[!0-9]", "run7", True, False),
    ("*", ".hidden", False, True),
    # ** across segments
    ("**/logs", "logs", True, True),
    ("**/logs", "a/b/logs", True, True),
    ("a/**/z", "a/z", False, True),
    ("a/**/z", "a/b/c/z", False, True),
    ("a/**/z", "b/a/z", False, False),
    ("a/**", "a/x/y", False, True),
    ("a/**", "a", True, False),  # everything inside, not the folder itself
    ("a/***/b", "a/x/b", False, True),
    # ! negation: the last matching rule wins
    ("*.ckpt\n!best.ckpt", "best.ckpt", False, False),
    ("*.ckpt\n!best.ckpt", "last.ckpt", False, True),
    ("!best.ckpt\n*.ckpt", "best.ckpt", False, True),
    ("out/*\n!out/keep.txt", "out/keep.txt", False, False),
    ("out/*\n!out/keep.txt", "out/drop.txt", False, True),
]


@pytest.mark.parametrize(("text", "path", "is_dir", "ignored"), CASES)
def test_gitignore_semantics(text: str, path: str, is_dir: bool, ignored: bool) -> None:
    parts = tuple(path.split("/"))
    assert is_ignored(parse_ignore(text), parts, is_dir) is ignored


def test_a_nested_ignore_file_is_anchored_to_its_folder_and_comes_later() -> None:
    rules = parse_ignore("*.csv\n") + parse_ignore("/raw\n!keep.csv\n", base=("sub",))
    assert is_ignored(rules, ("sub", "raw"), True)
    assert not is_ignored(rules, ("raw",), True)  # /raw is sub's, not the root's
    assert not is_ignored(rules, ("sub", "keep.csv"), False)  # the deeper file wins
    assert is_ignored(rules, ("keep.csv",), False)  # ... only below it
    assert is_ignored(rules, ("sub", "other.csv"), False)


def _split_match(segments: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    """The matcher as git's rules read, written the obvious (exponential) way: each ``**``
    tries every split of the rest of the path."""
    if not segments:
        return not parts
    if segments[0] == "**":
        if len(segments) == 1:
            return len(parts) >= 1
        return any(_split_match(segments[1:], parts[i:]) for i in range(len(parts) + 1))
    return (
        bool(parts) and fnmatchcase(parts[0], segments[0]) and _split_match(segments[1:], parts[1:])
    )


def test_the_linear_matcher_agrees_with_trying_every_split() -> None:
    rng = random.Random(7)
    words = ["a", "b", "*", "a*", "?", "**"]
    for _ in range(3000):
        line = "/".join(rng.choice(words) for _ in range(rng.randint(1, 5)))
        path = tuple(
            rng.choice("ab") + rng.choice(["", "a", "b"]) for _ in range(rng.randint(1, 6))
        )
        for rule in parse_ignore(line):
            assert rule.matches(path, False) is _split_match(rule.segments, path), (line, path)


def test_a_dozen_double_stars_over_a_deep_path_is_decided() -> None:
    """Twelve ``**`` over 40 folders: a split-trying matcher explores ~10**10 splits; the
    linear one a few hundred steps (bench/packing_ignore.py times it)."""
    rule = parse_ignore("/".join(["**/a"] * 12) + "/**/zz")[0]
    assert not rule.matches(("a",) * 40 + ("f.txt",), False)
    assert rule.matches(("a",) * 40 + ("zz",), False)


SECRETS = [
    ".aws", ".ssh", ".gnupg", ".kube", ".netrc", ".pypirc", ".env", ".env.local", ".envrc",
    "server.pem", "tls.key", "cert.p12", "credentials", "credentials.json", "id_rsa",
    "id_ed25519.pub", ".docker/config.json", ".config/gcloud", "CREDENTIALS.txt", ".SSH",
    "x/.Docker/Config.json",
]  # fmt: skip
NOT_SECRETS = ["train.py", "id_map.py", "keys.py", "environment.yml", "docker/config.json",
               "config/gcloud", "my.env.py", "pem.txt"]  # fmt: skip


@pytest.mark.parametrize("path", SECRETS)
def test_secret_names(path: str) -> None:
    assert is_secret(tuple(path.split("/")))


@pytest.mark.parametrize("path", NOT_SECRETS)
def test_code_names_are_not_secrets(path: str) -> None:
    assert not is_secret(tuple(path.split("/")))


# --- the packer on real folders ---------------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _project(tmp_path: Path) -> Path:
    """A project folder with credentials, ignore files and code; returns the script."""
    root = tmp_path / "proj"
    _write(
        root,
        {
            "train.py": "print('training')\n",
            "model/net.py": "NET = 1\n",
            "id_map.py": "IDS = {}\n",
            ".aws/credentials": "[default]\naws_secret_access_key = SECRET-AWS\n",
            ".ssh/id_rsa": "SECRET-SSH\n",
            ".env": "TOKEN=SECRET-ENV\n",
            "sub/.env.local": "TOKEN=SECRET-ENV-LOCAL\n",
            "key.pem": "SECRET-PEM\n",
            "keys/deploy": "-----BEGIN OPENSSH PRIVATE KEY-----\nSECRET-SNIFFED\n",
            ".netrc": "machine x password SECRET-NETRC\n",
            ".git/config": "[remote]\n",
            "__pycache__/net.cpython-312.pyc": "x",
            "data/big.bin": "0" * 1000,
            "data/README.md": "how to get the data\n",
            "runs/a/metrics.csv": "1\n",
            "runs/keep.txt": "kept by negation\n",
            "notes/todo.txt": "kplanignored\n",
            ".gitignore": "data/*\n!data/README.md\nruns/*\n!runs/keep.txt\n!.env\n!key.pem\n",
            ".kplanignore": "notes/\n",
            "sub/.gitignore": "*.tmp\n",
            "sub/ok.py": "OK = 1\n",
            "sub/scratch.tmp": "x",
        },
    )
    return root / "train.py"


def _names(packed: PackedCode) -> set[str]:
    with tarfile.open(fileobj=io.BytesIO(packed.data), mode="r:gz") as tar:
        return set(tar.getnames())


def test_packs_code_and_leaves_secrets_ignored_and_noise_out(tmp_path: Path) -> None:
    packed = pack_code(_project(tmp_path))
    expected = {
        "train.py", "model/net.py", "id_map.py", "data/README.md", "runs/keep.txt",
        ".gitignore", ".kplanignore", "sub/.gitignore", "sub/ok.py",
    }  # fmt: skip
    assert _names(packed) == expected
    assert {p for p, _ in packed.files} == expected
    assert packed.total_bytes == sum(n for _, n in packed.files)
    # A negation in .gitignore cannot bring a secret back; the sniffed key is named too.
    assert set(packed.skipped_secrets) == {
        ".aws/", ".ssh/", ".env", "sub/.env.local", "key.pem", ".netrc", "keys/deploy",
    }  # fmt: skip
    assert packed.ignored == 4  # data/big.bin, runs/a/, notes/, sub/scratch.tmp
    assert b"SECRET" not in _all_bytes(packed)


def _all_bytes(packed: PackedCode) -> bytes:
    out = b""
    with tarfile.open(fileobj=io.BytesIO(packed.data), mode="r:gz") as tar:
        for member in tar.getmembers():
            fh = tar.extractfile(member)
            out += fh.read() if fh else b""
    return out


GIT_TREE = {
    "train.py": "", "util.py": "", "a.log": "", "deep/er/b.log": "", "deep/er/keep.log": "",
    "build/x.o": "", "src/build/y.py": "", "doc/out": "", "x/doc/out": "", "cache/c": "",
    "z/cache": "", "run7/r": "", "runa/r": "", "logs/l": "", "a/b/logs/l": "", "m/z": "",
    "m/b/c/z": "", "n/m/z": "", "out/keep.txt": "", "out/drop.txt": "", "out/sub/deep.txt": "",
    "w/ckpt/best.ckpt": "", "w/last.ckpt": "", "w/best.ckpt": "", "file1.txt": "",
    "file10.txt": "", "sp ace.txt": "", "sub/raw/r.csv": "", "raw/r.csv": "", "sub/keep.csv": "",
    "sub/other.csv": "", "keep.csv": "", "sub/inner/e.tmp": "", "sub/inner/f.py": "",
    "#hash": "", "!bang": "", "star*name": "", "starxname": "",
    ".gitignore": (
        "*.log\n!keep.log\n/build\ndoc/out\ncache/\nrun[0-9]/\n**/logs\nm/**/z\nout/*\n"
        "!out/keep.txt\nw/**/*.ckpt\n!w/best.ckpt\nfile?.txt\nsp\\ ace.txt\n*.csv\n"
        "\\#hash\n\\!bang\nstar\\*name\n# a comment\n\n"
    ),
    "sub/.gitignore": "/raw\n!keep.csv\n*.tmp\n",
}  # fmt: skip


def test_the_packer_ships_what_git_calls_not_ignored(tmp_path: Path) -> None:
    """The same tree through real git (`git ls-files --others --exclude-standard`)."""
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    root = tmp_path / "repo"
    _write(root, GIT_TREE)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": os.devnull}  # fmt: skip

    def run(*args: str) -> str:
        done = subprocess.run(
            [git, *args], cwd=root, env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    run("init", "-q")
    by_git = set(run("ls-files", "--others", "--exclude-standard").splitlines())
    assert "train.py" in by_git and "a.log" not in by_git  # git did read the rules
    assert len(by_git) == 16, sorted(by_git)  # 40 files, 24 of them ignored
    assert {p for p, _ in pack_code(root / "train.py").files} == by_git


def test_ignore_files_above_the_folder_apply_inside_a_git_work_tree(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _write(
        repo,
        {
            ".git/HEAD": "ref: refs/heads/main\n",
            ".gitignore": "*.ckpt\n/train/local/\nlocal/\n",
            ".kplanignore": "train/data/\n",
            "train/train.py": "x = 1\n",
            "train/model.py": "m = 1\n",
            "train/a.ckpt": "weights",
            "train/local/l.py": "l",
            "train/data/d.bin": "d",
        },
    )
    packed = pack_code(repo / "train" / "train.py")
    assert [p for p, _ in packed.files] == ["model.py", "train.py"]
    assert packed.ignored == 3
    # Outside a work tree the folders above are not looked at (git would not either).
    plain = tmp_path / "plain"
    _write(plain, {".gitignore": "*.py\n", "train/train.py": "x\n", "train/util.py": "u\n"})
    assert [p for p, _ in pack_code(plain / "train" / "train.py").files] == [
        "train.py",
        "util.py",
    ]


def test_the_script_ships_even_when_an_ignore_rule_matches_it(tmp_path: Path) -> None:
    script = tmp_path / "p" / "train.py"
    _write(script.parent, {"train.py": "x = 1\n", ".gitignore": "*.py\n", "util.py": "u\n"})
    packed = pack_code(script)
    assert [p for p, _ in packed.files] == [".gitignore", "train.py"]


def test_a_script_named_like_a_secret_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "p" / "credentials_check.py"
    _write(script.parent, {script.name: "x = 1\n"})
    with pytest.raises(InputError, match="looks like a secret file") as err:
        pack_code(script)
    assert "rename it" in err.value.hint


def test_links_are_never_followed_out_of_the_folder(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    _write(outside, {"secret.txt": "SECRET-OUTSIDE\n"})
    script = tmp_path / "p" / "train.py"
    _write(script.parent, {"train.py": "x = 1\n", "lib/util.py": "u = 1\n", ".env": "SECRET\n"})
    (script.parent / "escape.txt").symlink_to(outside / "secret.txt")
    (script.parent / "escape_dir").symlink_to(outside, target_is_directory=True)
    (script.parent / "util.py").symlink_to(script.parent / "lib" / "util.py")
    (script.parent / "env_link").symlink_to(script.parent / ".env")
    packed = pack_code(script)
    assert set(packed.skipped_links) == {"escape.txt", "escape_dir"}
    assert "env_link" in packed.skipped_secrets  # a link to a secret is left out too
    assert b"SECRET" not in _all_bytes(packed)
    with tarfile.open(fileobj=io.BytesIO(packed.data), mode="r:gz") as tar:
        link = tar.getmember("util.py")
        assert link.issym() and link.linkname == "lib/util.py"


def test_a_fifo_neither_hangs_nor_ships(tmp_path: Path) -> None:
    script = tmp_path / "p" / "train.py"
    _write(script.parent, {"train.py": "x = 1\n"})
    os.mkfifo(script.parent / "pipe")
    assert [p for p, _ in pack_code(script).files] == ["train.py"]


def test_caps_on_bytes_and_files(tmp_path: Path) -> None:
    script = tmp_path / "p" / "train.py"
    _write(script.parent, {"train.py": "x = 1\n", **{f"f{i}.txt": "0" * 100 for i in range(5)}})
    with pytest.raises(InputError, match="more than 3 files") as err:
        pack_code(script, limit_files=3)
    assert ".kplanignore" in err.value.hint
    with pytest.raises(InputError, match=r"more than 0 MiB"):
        pack_code(script, limit_bytes=300)
    assert len(pack_code(script).files) == 6


@pytest.mark.parametrize("where", ["home", "ancestor"])
def test_a_home_directory_is_never_packed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    home = tmp_path / "users" / "me"
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    folder = home if where == "home" else tmp_path / "users"
    _write(folder, {"train.py": "x = 1\n"})
    with pytest.raises(InputError, match="a home directory") as err:
        pack_code(folder / "train.py")
    assert "folder of their own" in err.value.hint
    _write(home / "proj", {"train.py": "x = 1\n"})  # a folder inside home is fine
    assert code_folder(home / "proj" / "train.py") == (home / "proj").resolve()


def test_a_missing_script_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="training script not found"):
        pack_code(tmp_path / "nope.py")


# --- kplan launch: --dry-run shows the upload; $HOME is refused with exit 2 ------------------


@pytest.fixture
def kplan_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = fast_dir(tmp_path, "pack")
    monkeypatch.setenv("KPLAN_HOME", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _dry_run(script: Path, *extra: str) -> Any:
    return runner.invoke(
        app,
        ["launch", str(script), "--budget", "50", "--cloud", "aws",
         "--example-profile", "cifar10-resnet18", "--dry-run", *extra],
    )  # fmt: skip


def test_dry_run_lists_the_upload_and_the_secrets_left_out(
    kplan_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(providers.FACTORIES, "aws", "tests.launcher_fakes:refusing_backend")
    script = _project(tmp_path)
    _write(script.parent, {f"pkg/m{i:02}.py": f"M = {i}\n" for i in range(25)})
    res = _dry_run(script, "--json")
    assert res.exit_code == 0, res.output
    code = json.loads(res.output)["code"]
    paths = [f["path"] for f in code["files"]]
    assert code["file_count"] == len(paths) == 34  # every file in --json
    assert "pkg/m24.py" in paths and ".env" not in paths
    assert code["total_bytes"] == sum(f["bytes"] for f in code["files"])
    assert ".aws/" in code["skipped_secrets"] and "sub/.env.local" in code["skipped_secrets"]

    res = _dry_run(script)
    assert res.exit_code == 0, res.output
    out = res.output
    assert "code: 34 file(s)" in out and "and 14 more (--json lists all)" in out
    assert "left out as secrets (always): .aws/, .env, .netrc, .ssh/" in out
    assert "pkg/m05.py" in out and "pkg/m24.py" not in out  # the first 20 only


def test_launch_refuses_a_script_in_home_with_exit_2(
    kplan_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(providers.FACTORIES, "aws", "tests.launcher_fakes:refusing_backend")
    home = tmp_path / "home"
    _write(home, {"train.py": "x = 1\n", ".aws/credentials": "SECRET\n"})
    monkeypatch.setenv("HOME", str(home))
    for extra in ((), ("--json",)):
        res = _dry_run(home / "train.py", *extra)
        assert res.exit_code == 2, res.output
        assert "a home directory" in res.output and "hint:" in res.output
        assert "Traceback" not in res.output


# --- nothing is uploaded when the guard refuses to start ------------------------------------


def test_a_launch_the_guard_refuses_uploads_nothing_through_the_cli(
    kplan_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = LocalStorage(tmp_path / "bucket")
    storage.uri = "s3://bucket/kplan"  # a cloud job's storage, kept in a local folder
    sim = SimProvider(FakeClock(), storage)
    monkeypatch.setitem(providers.FACTORIES, "aws", "tests.launcher_fakes:current_backend")
    monkeypatch.setitem(launcher_fakes.CURRENT, "backend", Backend(sim, storage))
    script = _project(tmp_path)
    plan = tmp_path / "plan.json"
    res = runner.invoke(
        app,
        ["estimate", "--example", "cifar10-resnet18", "--cloud", "aws", "--budget", "50",
         "--spot", "--max-nodes", "2", "--out", str(plan), "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["launch", str(script), "--budget", "0.001", "--plan", str(plan)])
    assert res.exit_code == 2, res.output
    assert "cannot start this cluster" in res.output
    assert storage.list_keys("") == [] and sim.calls == []


def test_a_job_the_guard_refuses_uploads_nothing_through_run_job(tmp_path: Path) -> None:
    """The guard's first check comes before the code upload (lifecycle.run)."""
    folder = fast_dir(tmp_path, "guard")
    storage = LocalStorage(folder / "bucket")
    clock = FakeClock()
    sim = SimProvider(clock, storage)
    node = NodeSpec(0, "g4dn.xlarge", "on-demand", "us-east-1a", 1, 5.0)
    spec = JobSpec.build(
        "kp-pack-guard", "aws", "us-east-1", str(_project(tmp_path)), (node,), 0.001
    )
    try:
        with StateDB.open(folder / "kplan.db") as db:
            billing = Billing("aws", 60.0, 1.0, "test")
            out = run_job(spec, Backend(sim, storage), db, clock=clock, billing=billing)
        assert out.status != "succeeded" and sim.launched == []
        assert storage.list_keys("") == [], "the code was uploaded before the guard agreed"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --- acceptance: an AWS job through the real boto3 client and a moto server -----------------


def test_the_uploaded_code_object_holds_no_secret(
    moto: MotoAws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_credentials(monkeypatch)
    backend = moto_backend(moto)
    script = _project(tmp_path)
    spec = JobSpec.build(
        job_id=new_job_id(), cloud="aws", region=REGION, script=str(script),
        nodes=(NodeSpec(0, "g5.xlarge", "spot", ZONE, gpus=1, usd_per_hour=0.45),),
        budget_usd=20.0, check_interval_s=0.1, grace_s=1.0, teardown_s=10.0,
        finish_grace_s=5.0, provision_timeout_s=30.0,
    )  # fmt: skip
    db = StateDB.open(tmp_path / "kplan.db")

    def stop_at_head(event: EventRecord) -> None:
        if event.kind == "head":
            db.request_stop(spec.job_id, "test", event.time)

    outcome = run_job(spec, backend, db, clock=SystemClock(), on_event=stop_at_head)
    assert outcome.status == "cancelled", outcome.reason
    assert moto.leftovers(spec.job_id)["instances"] == []
    code_events = [e for e in db.events(spec.job_id) if e.kind == "code"]
    db.close()

    # The object as S3 holds it, fetched with a plain boto3 client (not kplan's storage).
    key = f"jobs/{job_key(spec.job_id, CODE_KEY)}"
    body = moto.client("s3").get_object(Bucket=BUCKET, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        names = set(tar.getnames())
        blob = b"".join((tar.extractfile(m) or io.BytesIO()).read() for m in tar.getmembers())
    assert "train.py" in names and "model/net.py" in names
    for secret in (".aws/credentials", ".ssh/id_rsa", ".env", "sub/.env.local", "key.pem",
                   ".netrc", "keys/deploy", "data/big.bin", "notes/todo.txt"):  # fmt: skip
        assert secret not in names
    assert not any(n.startswith((".aws", ".ssh", ".git/")) for n in names)
    assert b"SECRET" not in blob
    assert code_events and "left out 7 secret-looking path(s)" in code_events[0].message
