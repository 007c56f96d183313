"""scripts/readme_check.py: what it takes from README.md, what it skips and why, and that it
reports a failing command (issue 12: every README command runs as written after its set-up).

The full check (a fresh venv, every command; a few minutes) runs in CI from ``.ci/run``."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from scripts import readme_check as rc

REPO = Path(__file__).resolve().parent.parent

SAMPLE = """\
# Title

```bash
scripts/quickstart.sh     # sets up .venv
scripts/test.sh           # the tests
```

Prose with `kplan estimate --not-a-command` inline is not run.

```python
print("not shell")
```

```bash
kplan estimate --example yolov3 --cloud aws --json   # --cloud filters here
kplan launch train.py --cloud gcp --budget 5
kplan launch train.py --cloud=aws --budget 5 --dry-run
kplan launch a.py \\
    --budget 1   # needs: the live view
                 # an indented comment explains the line above
kplan status; kplan logs JOB; echo 'a;b # not a comment'
```
"""


def test_extract_joins_splits_and_drops_comments() -> None:
    cmds = rc.extract(SAMPLE)
    assert [c.text for c in cmds] == [
        "scripts/quickstart.sh",
        "scripts/test.sh",
        "kplan estimate --example yolov3 --cloud aws --json",
        "kplan launch train.py --cloud gcp --budget 5",
        "kplan launch train.py --cloud=aws --budget 5 --dry-run",
        "kplan launch a.py      --budget 1",
        "kplan status",
        "kplan logs JOB",
        "echo 'a;b # not a comment'",
    ]
    assert [c.line for c in cmds][:3] == [4, 5, 15]
    assert cmds[5].needs == "the live view" and cmds[5].line == 18
    skipped = {c.text: c.skip for c in cmds if c.skip}
    assert set(skipped) == {"scripts/test.sh", "kplan launch train.py --cloud gcp --budget 5"}
    assert "cloud account" in skipped["kplan launch train.py --cloud gcp --budget 5"]


def _first(cmds: list[rc.Command], pred: Callable[[list[str]], bool]) -> int:
    """Index of the first command that is run (not skipped) and matches ``pred``."""
    return next(
        (i for i, c in enumerate(cmds) if not c.skip and pred(shlex.split(c.text))), len(cmds)
    )


def test_the_readme_sets_up_each_extra_before_the_commands_that_need_it() -> None:
    cmds = rc.extract((REPO / "README.md").read_text(encoding="utf-8"))
    texts = [c.text for c in cmds]
    assert texts[:2] == ["scripts/quickstart.sh", "scripts/test.sh"]

    def setup_of(extra: str) -> int:
        return _first(cmds, lambda w: w[0] == "scripts/setup.sh" and extra in w[1:])

    activate = texts.index(rc.ACTIVATE)
    kplan = _first(cmds, lambda w: w[0] == "kplan")
    assert 0 < activate < kplan < len(cmds)
    local_launch = _first(cmds, lambda w: w[:2] == ["kplan", "launch"] and "--dry-run" not in w)
    profile = _first(cmds, lambda w: w[:2] == ["kplan", "profile"])
    explore = _first(cmds, lambda w: w[:2] == ["kplan", "launch"] and "--explore" in w)
    html = _first(cmds, lambda w: "--html" in w)
    assert setup_of("torch") < min(local_launch, profile) < len(cmds)
    assert setup_of("fit") < explore < len(cmds) and setup_of("report") < html < len(cmds)
    # the skip rules name what they skip, and nothing a local user can run is skipped
    for cmd in cmds:
        if cmd.skip:
            assert cmd.text == "scripts/test.sh" or rc._needs_cloud(shlex.split(cmd.text))


def test_a_run_reports_each_command_and_fails_on_any_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(
        "```bash\n"
        "scripts/setup.sh torch\n"
        "source .venv/bin/activate\n"
        'kplan --version && test -n "$KPLAN_HOME" && test ! -e .venv   # runs in the copy\n'
        "echo made > made.txt; grep -q made made.txt\n"
        "false   # needs: something else\n"
        "kplan logs JOB\n"
        "kplan down x --cloud aws\n"
        "```\n"
    )
    venv = Path(sys.executable).parent.parent
    code = rc.main(["--readme", str(readme), "--venv", str(venv), "--timeout", "60"])
    out = capsys.readouterr().out
    assert code == 1, out
    lines = [line for line in out.splitlines() if line.startswith("[")]
    assert [line.split()[2] for line in lines] == [
        "SKIP", "PASS", "PASS", "PASS", "PASS", "FAIL", "FAIL", "SKIP"
    ]  # fmt: skip
    assert "(needs: something else)" in lines[5]
    assert "JOB: no job launched" in out and "exit 1" in out
    assert out.splitlines()[-1].startswith(
        "readme_check: 4 passed, 2 failed, 2 skipped (of 8 commands)"
    )
    assert not (REPO / "made.txt").exists()  # ran in the temporary copy


def test_setup_refuses_an_unknown_extra_before_touching_the_venv(tmp_path: Path) -> None:
    import subprocess

    copy = tmp_path / "kplan"
    (copy / "scripts").mkdir(parents=True)
    setup = copy / "scripts" / "setup.sh"
    setup.write_bytes((REPO / "scripts" / "setup.sh").read_bytes())
    out = subprocess.run(
        ["bash", str(setup), "torch", "cuda"], check=False, capture_output=True, text=True
    )
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "error: unknown set-up 'cuda'",
        "hint: scripts/setup.sh [torch] [fit] [report] [aws] [gcp] [dev]",
    ]
    assert not (copy / ".venv").exists()
