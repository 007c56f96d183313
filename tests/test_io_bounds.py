"""kplan.core.files's bounded readers and kplan.core.flags' range checks, unit by unit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kplan.core import flags
from kplan.core.errors import DataFileError, InputError
from kplan.core.files import (
    MAX_JSON_DEPTH,
    check_writable,
    json_depth,
    parse_json,
    read_csv_rows,
    read_user_text,
)


def test_json_depth_ignores_brackets_inside_strings() -> None:
    assert json_depth('{"a": "[[[[{{{{", "b": ["\\"]]]"]}') == 2
    assert json_depth("[" * 10 + "]" * 10) == 10
    assert json_depth("1") == 0


def test_parse_json_refuses_deep_nesting_without_recursion() -> None:
    text = "[" * 200_000 + "]" * 200_000
    with pytest.raises(DataFileError, match=f"more than {MAX_JSON_DEPTH} levels"):
        parse_json(text, "x.json", "profile")
    assert parse_json("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH, "x.json", "profile")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": NaN}', "NaN is not a number"),
        ('{"a": -Infinity}', "-Infinity is not a number"),
        ('{"a": 1e400}', "out of range"),
        ('{"a": 1e16}', "out of range"),
        ('{"a": ' + "9" * 400 + "}", "too large"),
        ('{"a": 9007199254740992}', "too large"),
    ],
)
def test_parse_json_refuses_numbers_no_field_may_hold(text: str, message: str) -> None:
    with pytest.raises(DataFileError, match=message):
        parse_json(text, "x.json", "model")


def test_parse_json_keeps_ordinary_numbers() -> None:
    doc = parse_json('{"a": 9007199254740991, "b": -1e15, "c": 1e-300}', "x", "model")
    assert doc == {"a": 2**53 - 1, "b": -1e15, "c": 1e-300}


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "p.json"
    os.mkfifo(fifo)  # no writer: opening it for reading would block forever
    with pytest.raises(DataFileError, match="FIFO"):
        read_user_text(fifo, "profile")


def test_devices_folders_and_big_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DataFileError, match="a device"):
        read_user_text(Path("/dev/zero"), "profile")
    with pytest.raises(DataFileError, match="a folder"):
        read_user_text(tmp_path, "profile")
    big = tmp_path / "big.csv"
    big.write_text("x" * 101)
    with pytest.raises(DataFileError, match="101 bytes, more than the 100"):
        read_user_text(big, "measurements", limit=100)
    with pytest.raises(InputError, match="not found"):
        read_user_text(tmp_path / "nope.json", "plan")


def test_csv_reader_goes_through_the_bounded_reader(tmp_path: Path) -> None:
    bad = tmp_path / "m.csv"
    bad.write_bytes(b"nodes,workers\n\xff\xfe\n")
    with pytest.raises(DataFileError, match="not UTF-8"):
        read_csv_rows(bad, ("nodes",), ("workers",), "measurements")


def test_check_writable(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a folder"):
        check_writable(tmp_path, "--out")
    (tmp_path / "f").write_text("x")
    with pytest.raises(InputError, match="not a folder"):
        check_writable(tmp_path / "f" / "out.json", "--out")
    os.mkfifo(tmp_path / "fifo")  # not /dev/null: a regression must not touch the system's
    with pytest.raises(InputError, match="not a regular file"):
        check_writable(tmp_path / "fifo", "--out")
    check_writable(tmp_path / "new" / "out.json", "--out")  # a folder to be made is fine


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 0.0, -1.0, 1e10])
def test_flag_numbers_are_finite_and_bounded(value: float) -> None:
    with pytest.raises(InputError, match="--timeout"):
        flags.number("--timeout", value, high=1e8)


def test_flag_integers_and_texts() -> None:
    flags.integer("--nodes", 64, high=64)
    with pytest.raises(InputError, match="--nodes=65 must be <= 64"):
        flags.integer("--nodes", 65, high=64)
    with pytest.raises(InputError, match="--node=-1 must be >= 0"):
        flags.integer("--node", -1, low=0, high=10)
    for bad in ("", "  ", "a\x1b[31m", "x" * 300):
        with pytest.raises(InputError, match="--objective"):
            flags.text("--objective", bad)
    with pytest.raises(InputError, match="not one of"):
        flags.text("--market", "cheap", choices=("spot", "on-demand"))
