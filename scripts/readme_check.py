"""Run every shell command of README.md as a new user would, and say which fail.

    python3 scripts/readme_check.py              # a fresh copy, a fresh .venv, every command
    python3 scripts/readme_check.py --list       # only show what it would run or skip, and why
    python3 scripts/readme_check.py --venv .venv # reuse a venv: skip the set-up lines (faster)

The commands are the lines of the README's ```bash blocks (a trailing ``\\`` joins lines, ``#``
starts a comment, ``;`` separates commands of one line). They run in README order, each with
``bash -c`` and a time limit, in a temporary copy of the working tree (the files git tracks or
would track: never the checkout's own .venv or KPLAN_HOME) with ``KPLAN_HOME`` in a temporary
folder, so the set-up lines (``scripts/quickstart.sh``, ``scripts/setup.sh torch``) build a
fresh ``.venv`` inside the copy with the README's own commands. ``source .venv/bin/activate``
puts that venv first on ``PATH`` for the commands after it. The word ``JOB`` stands for the
id of the job the README launched last (``kplan status --json``).

Skipped, always with the reason printed (the rules are :data:`SKIPS`): the test suite
(``scripts/test.sh``: CI runs it as a step of its own) and every command that needs a cloud
account (``kplan launch`` or ``kplan down`` with ``--cloud aws|gcp`` and no ``--dry-run``).
Every other command must exit 0. A comment ``# needs: ...`` on a command (work it waits for)
is printed with its result.

Prints one line per command (PASS, FAIL, SKIP), the output's last lines for a failure, and
``N passed, M failed, K skipped``; exits 1 if any failed, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ACTIVATE = "source .venv/bin/activate"
FENCE = re.compile(r"^```(\w*)\s*$")
CLOUDS = ("aws", "gcp")
TAIL_LINES = 15


@dataclass
class Command:
    """One command of the README: its text, where it is, and the comment after it."""

    text: str
    line: int
    comment: str = ""
    skip: str = ""  # why it is not run ("" = run it)
    needs: str = field(init=False, default="")

    def __post_init__(self) -> None:
        match = re.search(r"needs:\s*(.+)", self.comment)
        self.needs = match.group(1).strip() if match else ""


def _split_comment(line: str) -> tuple[str, str]:
    """``cmd  # note`` -> (``cmd``, ``note``); a ``#`` inside quotes or a word stays."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), ""


def _split_commands(line: str) -> list[str]:
    """Split on ``;`` outside quotes."""
    parts, quote, start = [], "", 0
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == ";":
            parts.append(line[start:i])
            start = i + 1
    parts.append(line[start:])
    return [p.strip() for p in parts if p.strip()]


def bash_blocks(text: str) -> Iterator[tuple[int, list[str]]]:
    """(first line number, lines) of each ```bash block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i].strip())
        if match and match.group(1) in ("bash", "sh", "shell", "console"):
            start, body = i + 2, []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                body.append(lines[i])
                i += 1
            yield start, body
        i += 1


def extract(text: str) -> list[Command]:
    """Every command of the README's bash blocks, in order, each with its skip reason."""
    commands: list[Command] = []
    for start, body in bash_blocks(text):
        pending, first = "", 0
        for offset, raw in enumerate(body):
            if not pending and raw.strip().startswith("#"):
                continue  # a comment line (also one that explains the line above)
            if raw.rstrip().endswith("\\"):
                pending += raw.rstrip()[:-1] + " "
                first = first or start + offset
                continue
            code, comment = _split_comment(pending + raw)
            where = first or start + offset
            pending, first = "", 0
            for part in _split_commands(code):
                commands.append(Command(part, where, comment, skip_reason(part)))
    return commands


def _needs_cloud(words: list[str]) -> bool:
    """``kplan launch|down ... --cloud aws|gcp`` without ``--dry-run`` (in ``estimate`` and
    ``catalog``, ``--cloud`` only filters the shipped catalog)."""
    if words[:1] != ["kplan"] or words[1:2] not in (["launch"], ["down"]) or "--dry-run" in words:
        return False
    for i, word in enumerate(words):
        value = word.split("=", 1)[1] if word.startswith("--cloud=") else None
        if word == "--cloud" and i + 1 < len(words):
            value = words[i + 1]
        if value is not None and value.lower() in CLOUDS:
            return True
    return False


# The skip rules, in order: (name, predicate on the command's words, reason printed).
SKIPS: list[tuple[str, Callable[[list[str]], bool], str]] = [
    (
        "test suite",
        lambda w: bool(w) and w[0].endswith("scripts/test.sh"),
        "the test suite: CI runs it as a step of its own",
    ),
    (
        "cloud",
        _needs_cloud,
        "needs a cloud account (kplan launch/down --cloud aws/gcp without --dry-run)",
    ),
]


def skip_reason(command: str) -> str:
    try:
        words = shlex.split(command)
    except ValueError as err:
        return f"cannot parse: {err}"
    for _, rule, reason in SKIPS:
        if rule(words):
            return reason
    return ""


def copy_tree(source: Path, dest: Path) -> int:
    """Copy the files git tracks or would track (not ignored ones: no .venv, no caches) from
    ``source`` to ``dest``, symlinks as symlinks. The number of files copied."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=source,
            check=True,
            capture_output=True,
        ).stdout.decode()
    except (OSError, subprocess.CalledProcessError) as err:
        raise SystemExit(f"error: cannot list the files of {source} with git: {err}") from None
    count = 0
    for name in sorted(set(filter(None, listed.split("\0")))):
        src, dst = source / name, dest / name
        if not src.is_symlink() and not src.is_file():
            continue  # deleted in the working tree
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)
        count += 1
    return count


def clean_env(home: Path) -> dict[str, str]:
    """The caller's environment without any active venv, with KPLAN_HOME in ``home``."""
    env = dict(os.environ)
    venv = env.pop("VIRTUAL_ENV", None)
    for name in ("PYTHONPATH", "PYTHONHOME", "KPLAN_HOME"):
        env.pop(name, None)
    path = env.get("PATH", "").split(os.pathsep)
    if venv:
        path = [p for p in path if Path(p) != Path(venv) / "bin"]
    env["PATH"] = os.pathsep.join(path)
    env["KPLAN_HOME"] = str(home)
    env["AWS_EC2_METADATA_DISABLED"] = "true"  # never probe for a cloud identity
    return env


def activate(env: dict[str, str], venv: Path) -> None:
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"


def last_job(env: dict[str, str], cwd: Path) -> str | None:
    """The id of the most recent job in KPLAN_HOME (``kplan status --json``)."""
    try:
        out = subprocess.run(
            ["kplan", "status", "--json"],
            check=False,
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        jobs = json.loads(out.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    if not isinstance(jobs, list) or not jobs:
        return None
    ids = [j.get("job_id") or j.get("id") for j in jobs if isinstance(j, dict)]
    ids = [i for i in ids if isinstance(i, str)]
    created = [j.get("created_at") or j.get("started_at") or 0 for j in jobs]
    if not ids:
        return None
    if all(isinstance(c, int | float) for c in created) and any(created):
        return str(max(zip(created, ids, strict=False))[1])
    return ids[-1]


@dataclass
class Result:
    command: Command
    status: str  # PASS, FAIL, SKIP
    seconds: float = 0.0
    detail: str = ""


def run_one(cmd: Command, cwd: Path, env: dict[str, str], timeout: float, log: Path) -> Result:
    text = cmd.text
    if re.search(r"\bJOB\b", text):
        job = last_job(env, cwd)
        if job is None:
            return Result(cmd, "FAIL", detail="JOB: no job launched before this command")
        text = re.sub(r"\bJOB\b", job, text)
    start = time.monotonic()
    with log.open("w") as out:
        out.write(f"$ {text}\n")
        out.flush()
        proc = subprocess.Popen(
            ["bash", "-c", text],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            rc = None
    seconds = time.monotonic() - start
    if rc == 0:
        return Result(cmd, "PASS", seconds)
    tail = log.read_text(errors="replace").splitlines()[-TAIL_LINES:]
    why = f"timed out after {timeout:g} s" if rc is None else f"exit {rc}"
    return Result(cmd, "FAIL", seconds, why + "\n" + "\n".join("    | " + t for t in tail))


def _label(cmd: Command) -> str:
    return f"README.md:{cmd.line}: {cmd.text}"


def check(
    readme: Path, venv: Path | None, timeout: float, keep: bool, source: Path = ROOT
) -> list[Result]:
    commands = extract(readme.read_text(encoding="utf-8"))
    tmp = Path(tempfile.mkdtemp(prefix="kplan-readme-"))
    results: list[Result] = []
    try:
        work, home, logs = tmp / "kplan", tmp / "home", tmp / "logs"
        home.mkdir()
        logs.mkdir()
        files = copy_tree(source, work)
        env = clean_env(home)
        print(f"readme_check: {len(commands)} commands from {readme}; a copy of {files} files")
        print(f"readme_check: working copy {work}, KPLAN_HOME={home}")
        if venv is not None:
            activate(env, venv.resolve())
            print(f"readme_check: --venv {venv}: set-up lines skipped")
        for name, _, reason in SKIPS:
            print(f"readme_check: skip rule '{name}': {reason}")
        for n, cmd in enumerate(commands, 1):
            setup = cmd.text.startswith("scripts/") and not cmd.skip
            if cmd.text == ACTIVATE:
                target = work / ".venv"
                if venv is None and not (target / "bin" / "activate").is_file():
                    result = Result(cmd, "FAIL", detail="no .venv to activate (no set-up ran)")
                else:
                    if venv is None:
                        activate(env, target)
                    result = Result(cmd, "PASS", detail="activated")
            elif cmd.skip:
                result = Result(cmd, "SKIP", detail=cmd.skip)
            elif setup and venv is not None:
                result = Result(cmd, "SKIP", detail="set-up line (--venv given)")
            else:
                result = run_one(cmd, work, env, timeout, logs / f"{n:02d}.log")
            results.append(result)
            _print(n, len(commands), result)
    finally:
        if keep:
            print(f"readme_check: kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return results


def _print(n: int, total: int, r: Result) -> None:
    needs = f"  (needs: {r.command.needs})" if r.command.needs else ""
    head = f"[{n:2d}/{total}] {r.status} {r.seconds:6.1f}s  {_label(r.command)}{needs}"
    print(head, flush=True)
    if r.status == "SKIP":
        print(f"        skipped: {r.detail}", flush=True)
    elif r.status == "FAIL":
        print(f"        {r.detail}", flush=True)


def summary(results: list[Result], seconds: float) -> str:
    count = {s: sum(r.status == s for r in results) for s in ("PASS", "FAIL", "SKIP")}
    return (
        f"readme_check: {count['PASS']} passed, {count['FAIL']} failed, {count['SKIP']} "
        f"skipped (of {len(results)} commands) in {seconds:.0f} s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--venv", type=Path, help="use this venv; skip the set-up lines")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per command")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copy and logs")
    parser.add_argument("--list", action="store_true", help="only list the commands")
    args = parser.parse_args(argv)
    if not args.readme.is_file():
        print(f"error: no README at {args.readme}", file=sys.stderr)
        return 2
    if args.venv is not None and not (args.venv / "bin" / "python").exists():
        print(f"error: --venv {args.venv} has no bin/python", file=sys.stderr)
        return 2
    if args.list:
        for cmd in extract(args.readme.read_text(encoding="utf-8")):
            state = f"SKIP ({cmd.skip})" if cmd.skip else "RUN"
            print(f"{state:4}  {_label(cmd)}")
        return 0
    start = time.monotonic()
    results = check(args.readme, args.venv, args.timeout, args.keep)
    print(summary(results, time.monotonic() - start))
    return 1 if any(r.status == "FAIL" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
