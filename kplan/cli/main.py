"""The kplan command line: parse, call a library function, render.

No business logic lives here. Heavy modules (torch, cloud SDKs, scikit-learn, rich) are imported
inside the commands that need them so that ``kplan --help`` starts fast.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, NoReturn

import typer

from kplan import __version__
from kplan.cli.help_text import KplanCommand, KplanGroup
from kplan.core.errors import KplanError

# Exit status when stdout is a pipe that closed early (`kplan ... | head`): 128 + SIGPIPE, what
# a shell reports for a tool that the closed pipe ended; no message.
EXIT_BROKEN_PIPE = 141


def _broken_pipe() -> NoReturn:
    """stdout's reader is gone: point stdout at /dev/null (so the flush at exit cannot fail
    again) and leave quietly."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (a test runner's buffer)
        pass
    raise typer.Exit(EXIT_BROKEN_PIPE)


def _stdout_is_devnull() -> bool:
    try:
        out, null = os.fstat(sys.stdout.fileno()), os.stat(os.devnull)
    except (OSError, ValueError):
        return False
    return (out.st_dev, out.st_ino) == (null.st_dev, null.st_ino)


def _tolerant_output() -> None:
    """Let stdout and stderr write what their encoding cannot hold as escapes (``\\xe8``) rather
    than fail: a terminal that is not UTF-8 (LANG=C, PYTHONIOENCODING=ascii, a latin-1 pipe)
    still gets every line, a profile named in another script included. Text is never lost;
    only characters the stream cannot encode change form."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", None) == "strict":
            # a closed or detached stream has nothing to protect
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors="backslashreplace")


class _KplanGroup(KplanGroup):
    """Top-level group: turns every KplanError into one line plus a hint and its exit code."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        _tolerant_output()  # the rendering edge: every line kplan prints passes these streams
        try:  # `kplan --help` prints while parsing, before invoke
            return super().make_context(*args, **kwargs)
        except BrokenPipeError:
            _broken_pipe()

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            _broken_pipe()
        except SystemExit as done:
            # rich's Console meets a closed pipe by pointing stdout at /dev/null and exiting 1.
            if done.code == 1 and _stdout_is_devnull():
                raise typer.Exit(EXIT_BROKEN_PIPE) from None
            raise
        except KplanError as err:
            if ctx.meta.get("kplan.debug"):
                raise
            _print_error(err)
            raise typer.Exit(err.exit_code) from None
        except Exception as err:
            # typer's own exits and usage errors pass through; anything else is a bug.
            if type(err).__module__.startswith(("typer", "click")) or ctx.meta.get("kplan.debug"):
                raise
            if type(err).__module__ == "sqlite3":
                # The state database went bad after it was opened (a check at open refuses a
                # damaged file): not a kplan bug, and not the user's input either.
                _print_error(_state_db_error(err))
                raise typer.Exit(2) from None
            _print_error(
                KplanError(
                    f"internal error: {type(err).__name__}: {err}",
                    hint="re-run with --debug for the traceback and report it",
                )
            )
            raise typer.Exit(1) from None


def _state_db_error(err: Exception) -> KplanError:
    from kplan.launcher.state import default_db_path

    path = default_db_path()
    if "locked" in str(err) or "busy" in str(err):
        return KplanError(
            f"the state database {path} is locked ({err})",
            hint="another kplan holds it; try again in a moment",
        )
    return KplanError(
        f"the state database {path} cannot be read: {type(err).__name__}: {err}",
        hint=f"move {path} away (or point KPLAN_HOME elsewhere); `kplan down JOB --cloud C "
        "--region R` still finds a job's instances by its tag",
    )


def _print_error(err: KplanError) -> None:
    from kplan.core.text import clean  # a path or a reason may hold escape sequences

    # One line each, whatever the message holds (a multi-line SQLite or OS error text).
    typer.echo(f"error: {' '.join(clean(err.message).splitlines())}", err=True)
    if err.hint:
        typer.echo(f"hint: {' '.join(clean(err.hint).splitlines())}", err=True)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kplan {__version__}")
        raise typer.Exit(0)


def _root(
    ctx: typer.Context,
    debug: bool = typer.Option(False, "--debug", help="Show the full traceback on errors."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    ctx.meta["kplan.debug"] = debug


# The top-level commands, in the order `kplan --help` lists them, each with the module that
# registers it (launch's module registers status, logs and down with it).
_COMMANDS = {
    "estimate": "estimate",
    "profile": "profile",
    "check": "check",
    "launch": "launch",
    "controller": "launch",
    "status": "jobs",
    "logs": "jobs",
    "down": "jobs",
    "attach": "attach",
    "report": "report",
    "simulate": "simulate",
    "model": "model",
    "catalog": "catalog",
}


def build_app(command: str | None = None) -> typer.Typer:
    """The command line. With ``command`` (one of the top-level commands), only that command is
    registered: a run of it parses, helps and fails exactly as in the whole CLI, without importing
    the other commands' modules or building their parameters (start-up time)."""
    from kplan.cli import coercion

    coercion.install()  # plain option values without pydantic (start-up time)
    app = typer.Typer(
        cls=_KplanGroup,
        name="kplan",
        help="Plan, launch and account for distributed PyTorch training on the cloud, cost-aware.",
        no_args_is_help=True,
        add_completion=True,  # --install-completion, --show-completion
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
    )
    app.callback()(_root)
    _register(app, None if command is None else _COMMANDS[command])
    return app


def _register(app: typer.Typer, module: str | None) -> None:
    import importlib

    groups = []
    for name in dict.fromkeys(_COMMANDS.values()):
        if module not in (None, name) or (module is None and name == "jobs"):
            continue  # launch's module registers the jobs commands after launch
        mod = importlib.import_module(f"kplan.cli.commands.{name}")
        if name in ("model", "catalog"):
            app.add_typer(mod.app, name=name, cls=KplanGroup)
            groups.append(mod.app)
        else:
            mod.register(app)
    # Every command's help follows one style (kplan/cli/help_text.py): examples, metavars, defaults.
    for typer_app in (app, *groups):
        for info in typer_app.registered_commands:
            if info.cls in (None, typer.core.TyperCommand):
                info.cls = KplanCommand


def _invoked(args: list[str]) -> str | None:
    """The top-level command a command line runs (None: help, completion, a name kplan does not
    have, or none: those need every command)."""
    if any(k.endswith("_COMPLETE") for k in os.environ):
        return None  # shell completion lists every command
    for arg in args:
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return arg if arg in _COMMANDS else None
    return None


def __getattr__(name: str) -> typer.Typer:
    """``app``: the whole command line, built on first use (tests, documentation)."""
    if name == "app":
        whole = build_app()
        globals()["app"] = whole
        return whole
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Console-script entry point."""
    try:
        try:
            build_app(_invoked(sys.argv[1:]))(standalone_mode=True)
        finally:
            sys.stdout.flush()  # a pipe closed early shows here, not as a warning at exit
    except BrokenPipeError:
        try:
            _broken_pipe()
        except typer.Exit as done:
            sys.exit(done.exit_code)
