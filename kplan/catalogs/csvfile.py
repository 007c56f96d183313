"""Read one catalog CSV file and parse its fields.

Structural problems (a missing file, undecodable bytes, a malformed CSV, a missing column) raise
``CatalogError``: nothing in such a file can be trusted. A problem confined to one row raises
``RowError`` from the field parsers; the loader drops that row and records the reason.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.resources.abc import Traversable

from kplan.core.errors import CatalogError

FILES_HINT = (
    "a catalog directory holds gpus.csv, instances.csv, prices.csv, spot_rates.csv and "
    "billing.csv (see docs/catalogs.md)"
)


_SHAPE = "\x00shape"  # key of the field-count problem marker; no CSV header can contain it


class RowError(ValueError):
    """One row is unusable; the message says which field and echoes its value."""


@dataclass(frozen=True)
class Row:
    """A data row: its line number in the file (the header is line 1) and its fields."""

    line: int
    fields: dict[str, str]

    def text(self, column: str) -> str:
        """A required text field, stripped; empty is an error."""
        value = self.fields[column].strip()
        if not value:
            raise RowError(f"{column} is empty")
        return value

    def number(self, column: str, *, allow_zero: bool = False) -> float:
        """A finite number, > 0 (or >= 0 with ``allow_zero``)."""
        raw = self.fields[column].strip()
        if not raw:
            raise RowError(f"{column} is empty")
        try:
            value = float(raw)
        except ValueError:
            raise RowError(f"{column}={raw!r} is not a number") from None
        if not math.isfinite(value):
            raise RowError(f"{column}={raw!r} is not a finite number")
        if value < 0 or (value == 0 and not allow_zero):
            bound = ">= 0" if allow_zero else "> 0"
            raise RowError(f"{column}={raw!r} must be {bound}")
        return value

    def integer(self, column: str) -> int:
        """A whole number > 0 (``8`` or ``8.0``)."""
        value = self.number(column)
        if value != int(value):
            raise RowError(f"{column}={self.fields[column].strip()!r} must be a whole number")
        return int(value)

    def choice(self, column: str, allowed: tuple[str, ...]) -> str:
        """One of ``allowed`` (compared in lower case)."""
        value = self.text(column).lower()
        if value not in allowed:
            raise RowError(f"{column}={value!r} is not one of {', '.join(allowed)}")
        return value


def read_table(
    directory: Traversable, name: str, columns: tuple[str, ...], *, label: str
) -> Iterator[Row]:
    """Yield the data rows of ``directory/name``; check the header has every ``columns``.

    ``label`` names the directory in error messages. Blank lines are skipped. A row whose field
    count differs from the header's raises ``RowError`` when its fields are read (its ``fields``
    carry a marker that ``check_shape`` reports).
    """
    path = directory / name
    where = f"{label}/{name}"
    if not path.is_file():
        raise CatalogError(f"catalog file {where} is missing", hint=FILES_HINT)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise CatalogError(
            f"{where} is not UTF-8 text ({err.reason} at byte {err.start})",
            hint="save the file as UTF-8 CSV",
        ) from None
    except OSError as err:
        raise CatalogError(f"cannot read {where}: {err.strerror}", hint=FILES_HINT) from None
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, None)
        if header is None:
            raise CatalogError(
                f"{where} is empty", hint=f"its first line must be: {','.join(columns)}"
            )
        header = [h.strip() for h in header]
        missing = [c for c in columns if c not in header]
        if missing:
            raise CatalogError(
                f"{where} lacks column(s) {', '.join(missing)} (header: {','.join(header)})",
                hint=f"the header must include: {','.join(columns)}",
            )
        for values in reader:
            if not values or all(not v.strip() for v in values):
                continue
            fields = dict(zip(header, values, strict=False))
            if len(values) != len(header):
                fields[_SHAPE] = f"{len(values)} fields, the header has {len(header)}"
            yield Row(reader.line_num, fields)
    except csv.Error as err:
        raise CatalogError(
            f"{where}:{reader.line_num}: malformed CSV ({err})",
            hint="check the quoting on that line",
        ) from None


def check_shape(row: Row) -> None:
    """Raise ``RowError`` if the row's field count differs from the header's."""
    problem = row.fields.get(_SHAPE)
    if problem is not None:
        raise RowError(f"row has {problem}")
