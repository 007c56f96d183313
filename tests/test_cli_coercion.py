"""Option values coerced without pydantic (kplan/cli/coercion.py) are those typer's own coercer
gives; every other value, a bad one included, is typer's (same value, same message)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from kplan.cli import coercion

_coercion = pytest.importorskip("typer._coercion")
if not hasattr(_coercion, "build_runtime_param"):  # pragma: no cover - another typer
    pytest.skip("this typer has no runtime coercion hook", allow_module_level=True)

from typer.models import OptionInfo  # noqa: E402

VALUES: list[Any] = [
    "0", "7", "007", "10", "0.1", "0.25", "1.0", "12345678901234", "1.5e3", "-1", "+3", " 4",
    "4 ", "abc", "", "1_000", "inf", "nan", ".5", "5.", "\u0663", 3, 0, 2.5, True, 10**20,
]  # fmt: skip


class _Param:
    multiple = False
    nargs = 1


def _outcome(coercer: Any, value: Any) -> tuple[Any, ...]:
    """(the value and its type) or (the refusal's message)."""
    try:
        got = coercer.coerce(value, _Param(), None)
    except Exception as err:  # compared, whatever typer raises
        return ("refused", str(err))
    return (repr(got), type(got))  # repr: a NaN equals itself


def _bounds(annotation: type) -> list[tuple[Any, Any, bool]]:
    out: list[tuple[Any, Any, bool]] = [(None, None, False), (1, 64, False), (0, None, False)]
    out.append((1, 10, True))
    if annotation is float:
        out.append((0.5, None, False))
    return out


@pytest.mark.parametrize("annotation", [int, float, str])
def test_plain_values_are_typers_own(annotation: type) -> None:
    answered = 0
    for low, high, clamp in _bounds(annotation):
        info = OptionInfo(min=low, max=high, clamp=clamp)
        d = _coercion.resolve_type_descriptor(annotation=annotation, parameter_info=info)
        typers = _coercion.build_runtime_param(d)
        plain = coercion.PlainFirst(d, _coercion.build_runtime_param)
        for value in VALUES:
            got = _outcome(plain, value)  # typer's own where not plain
            assert got == _outcome(typers, value), (annotation, low, high, value)
            answered += plain._answer(value) is not coercion._OTHER
    assert answered > 10  # the plain path was taken, not only typer's


def test_a_list_option_keeps_its_items() -> None:
    info = OptionInfo()
    d = _coercion.resolve_type_descriptor(annotation=list[str], parameter_info=info)
    plain = coercion.PlainFirst(d, _coercion.build_runtime_param)

    class Many(_Param):
        multiple = True

    assert plain.coerce(("aws", "gcp"), Many(), None) == ["aws", "gcp"]
    assert plain.coerce((), Many(), None) == []
    assert plain.coerce(None, Many(), None) == ()


def test_estimate_does_not_import_pydantic_and_bad_values_keep_typers_message() -> None:
    code = (
        "import sys\n"
        "sys.argv = ['kplan', 'estimate', '--example', 'imagenet-resnet50', '--json',"
        " '--deadline', '0.1', '--max-nodes', '8', '--cloud', 'aws']\n"
        "from kplan.cli.main import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('pydantic' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300
    )
    assert done.stdout.strip().splitlines()[-1] == "False", done.stderr
    bad = subprocess.run(
        [sys.executable, "-c", "from kplan.cli.main import main; main()", "estimate",
         "--example", "imagenet-resnet50", "--budget", "x"],
        check=False, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "Invalid value for '--budget': Input should be a valid number" in bad.stderr
