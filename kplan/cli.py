"""The kplan command line: parse, call a library function, render.

No business logic lives here. Heavy modules (torch, cloud SDKs, scikit-learn, rich) are imported
inside the commands that need them so that ``kplan --help`` starts fast.
"""

from __future__ import annotations

import sys
from typing import Any

import typer

from kplan import __version__
from kplan.errors import KplanError


class _KplanGroup(typer.core.TyperGroup):
    """Top-level group: turns every KplanError into one line plus a hint and its exit code."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
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
    from kplan.render.text import clean  # a path or a reason may hold escape sequences

    # One line each, whatever the message holds (a multi-line SQLite or OS error text).
    typer.echo(f"error: {' '.join(clean(err.message).splitlines())}", err=True)
    if err.hint:
        typer.echo(f"hint: {' '.join(clean(err.hint).splitlines())}", err=True)


app = typer.Typer(
    cls=_KplanGroup,
    name="kplan",
    help="Plan, launch and account for distributed PyTorch training on the cloud, cost-aware.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kplan {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    ctx: typer.Context,
    debug: bool = typer.Option(False, "--debug", help="Show the full traceback on errors."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    ctx.meta["kplan.debug"] = debug


def _register() -> None:
    from kplan.commands import catalog, estimate, launch, model, profile, report, simulate

    estimate.register(app)
    profile.register(app)
    launch.register(app)
    report.register(app)
    simulate.register(app)
    app.add_typer(model.app, name="model")
    app.add_typer(catalog.app, name="catalog")


_register()


def main() -> None:
    """Console-script entry point."""
    sys.exit(app(standalone_mode=True))
