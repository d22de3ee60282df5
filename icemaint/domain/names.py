"""Table identifiers: the one place user-supplied table names are checked before they reach SQL or a path."""

from __future__ import annotations

import re
from dataclasses import dataclass

from icemaint.errors import UserError

# Iceberg allows more, but a maintenance system that builds SQL and file paths from names
# accepts only plain identifiers: no quotes, dots inside parts, slashes, spaces or semicolons.
_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class InvalidTableName(UserError, ValueError):
    """A table name that is not `namespace.table` made of plain identifiers."""


@dataclass(frozen=True, order=True)
class TableName:
    namespace: tuple[str, ...]
    name: str

    @classmethod
    def parse(cls, text: str) -> "TableName":
        if not isinstance(text, str) or not text:
            raise InvalidTableName(f"table name {text!r} is empty; expected 'namespace.table'")
        parts = text.split(".")
        if len(parts) < 2:
            raise InvalidTableName(f"table name {text!r} has no namespace; expected 'namespace.table'")
        for part in parts:
            if not _PART.fullmatch(part):
                raise InvalidTableName(
                    f"table name {text!r} is not allowed: part {part!r} must be letters, digits and "
                    "underscores, starting with a letter or underscore (no quotes, paths, spaces or SQL)"
                )
        return cls(tuple(parts[:-1]), parts[-1])

    @property
    def key(self) -> str:
        """The dotted name, as used for partition keys, policy keys and audit records."""
        return ".".join((*self.namespace, self.name))

    def sql(self, catalog: str) -> str:
        """The fully qualified, back-quoted Spark SQL identifier."""
        return ".".join(f"`{p}`" for p in (catalog, *self.namespace, self.name))

    def procedure_arg(self) -> str:
        """The table argument of an Iceberg procedure, a SQL string literal (parts are plain identifiers)."""
        return "'" + self.key + "'"

    def __str__(self) -> str:
        return self.key


_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def check_column(name: str) -> str:
    """A column name from config or metadata, checked before it is quoted into SQL."""
    if not isinstance(name, str) or not _COLUMN.fullmatch(name):
        raise ValueError(f"column name {name!r} is not a plain identifier")
    return name


def quote_column(name: str) -> str:
    """A column, or a field path in structs (`st.ts`), as a back-quoted Spark SQL reference."""
    return ".".join(f"`{check_column(part)}`" for part in str(name).split("."))


def is_column_path(name: str) -> bool:
    """Whether `name` is a column or a struct field path made of plain identifiers."""
    return isinstance(name, str) and all(_COLUMN.fullmatch(part) for part in name.split("."))
