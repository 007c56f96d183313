"""A node whose Python is too old for kplan (issue 26, item 5): the bootstrap brings Python
3.11 with uv before it installs kplan, and stops with 97 and one line when it cannot.

The node is this machine behind stand-ins (tests/bootstrap_shims.py): its ``python3`` says it
is 3.9 (Debian 11's), pip "installs" uv and uv "installs" CPython 3.11 by logging the call and,
for ``uv venv``, making a real virtual environment of this test's own Python 3.11, which sees
torch and pip (symlinked, as tests/test_bootstrap_install.py's nodes do) but not kplan.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kplan.app.launching import free_port
from kplan.launcher.bootstrap import cloud_user_data, rendezvous
from kplan.launcher.wheel import NodeWheel
from tests.bootstrap_shims import node_tools, write_tool
from tests.test_bootstrap_install import _env, _spec, _stage, deps, wheel  # noqa: F401

# python3 of a Debian 11 node: 3.9, with pip; uv's calls logged (and its venv made for real)
_PYTHON39 = """#!/bin/bash
log={log}
case "$*" in
  "-c import sys; sys.exit(sys.version_info < (3, 11))") exit 1 ;;
  "-V") echo "Python 3.9.2"; exit 0 ;;
  "-m pip --version") echo "pip 20.3.4 from /usr/lib/python3/dist-packages/pip (python 3.9)" ;;
  "-m pip install --quiet uv") echo "pip install uv" >> "$log" ;;
  "-m uv python install 3.11")
    echo "uv python install 3.11 into $UV_PYTHON_INSTALL_DIR" >> "$log"; exit {uv_code} ;;
  "-m uv venv --seed --python 3.11 "*)
    dir="${{@: -1}}"; echo "uv venv $dir" >> "$log"
    {real} -m venv --without-pip "$dir" || exit 1
    site=$("$dir/bin/python" -c "import sysconfig; print(sysconfig.get_path('purelib'))")
    echo {deps} > "$site/deps.pth" ;;
  "-c "*) exec {real} "$@" ;;  # the status writer: plain Python 3.9 runs it too
  *) echo "python3.9 cannot run: $*" >> "$log"; exit 3 ;;
esac
"""


def _node(tmp_path: Path, deps: Path, uv_code: int = 0) -> dict[str, Path]:  # noqa: F811
    tools = node_tools(tmp_path / "tools", tmp_path / "powered-off")
    text = _PYTHON39.format(
        log=tmp_path / "py.log", real=sys.executable, deps=deps, uv_code=uv_code
    )
    write_tool(tools, "python3", text)
    return {"tools": tools, "venv": tmp_path / "no-venv", "bucket": tmp_path / "bucket",
            "index": tmp_path, "root": tmp_path / "node"}  # fmt: skip


def _boot(tmp_path: Path, node: dict[str, Path], wheel: NodeWheel) -> tuple[str, dict[str, int]]:  # noqa: F811
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir()
    script.write_text(
        "import sys, kplan.runtime.env\n"
        "print('started with kplan on', sys.version_info[:2], sys.prefix, flush=True)\n"
    )
    spec = _spec(script, wheel, install_deps=False, rdzv_port=free_port())
    store = _stage(node, spec, "s3://bkt/pfx", wheel)
    text = cloud_user_data(
        spec, spec.nodes[0], "h", rendezvous(spec, 0, None), "s3://bkt/pfx", str(node["root"])
    )
    env = {**_env(node, tmp_path), "PATH": f"{node['tools']}:/usr/bin:/bin"}
    subprocess.run(["bash", "-c", text], env=env, cwd=tmp_path, timeout=180, check=False)
    log = (node["root"] / "logs" / "node-0.log").read_text()
    return log, json.loads((store / "status" / "node-0.json").read_text())


@pytest.mark.slow
def test_a_python39_node_gets_python311_before_kplan_is_installed(
    tmp_path: Path,
    wheel: NodeWheel,  # noqa: F811
    deps: Path,  # noqa: F811
) -> None:
    node = _node(tmp_path, deps)
    log, status = _boot(tmp_path, node, wheel)
    assert status["exit_code"] == 0, log
    assert "the node's Python 3.9.2 is older than 3.11: installing Python 3.11 with uv" in log
    calls = (tmp_path / "py.log").read_text().splitlines()
    uv_dir = node["root"] / "uv" / "python"
    venv = node["root"] / "python"
    assert calls == ["pip install uv", f"uv python install 3.11 into {uv_dir}", f"uv venv {venv}"]
    # the job ran on the new Python, where the bootstrap installed kplan's wheel
    assert f"started with kplan on (3, 11) {venv}" in log
    assert list(venv.glob("lib/python3.11/site-packages/kplan-*.dist-info"))


@pytest.mark.slow
def test_a_node_that_cannot_bring_python_stops_with_97(
    tmp_path: Path,
    wheel: NodeWheel,  # noqa: F811
    deps: Path,  # noqa: F811
) -> None:
    node = _node(tmp_path, deps, uv_code=2)  # no route to the Python builds
    log, status = _boot(tmp_path, node, wheel)
    assert status["exit_code"] == 97, log
    assert "could not bring Python 3.11" in log and "--image with python3 >= 3.11" in log
    assert "started" not in log
    assert "python3.9 cannot run" not in (tmp_path / "py.log").read_text()
