"""User-facing errors: one clear message, exit code 2, no traceback."""

from __future__ import annotations


class MmsimError(Exception):
    """A problem with the user's input (file, field, flag) that the CLI reports in one line."""

    exit_code = 2

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None):
        self.source = source
        self.field = field
        super().__init__(message)

    def __str__(self) -> str:
        where = ": ".join(part for part in (self.source, self.field) if part)
        message = super().__str__()
        return f"{where}: {message}" if where else message


def pydantic_error_message(error, source: str) -> MmsimError:
    """Turn a pydantic ValidationError into an MmsimError naming the first bad field."""
    first = error.errors()[0]
    # A key of a data file can be megabytes long: each part of the path is shortened.
    field = ".".join(str(part) if len(str(part)) <= 80 else f"{str(part)[:80]}..." for part in first["loc"]) or "(top level)"
    detail = first["msg"].removeprefix("Value error, ")  # our validators' own sentences need no pydantic label
    if first.get("type") == "extra_forbidden":
        detail = "unknown field"
    from sim.files import counted  # sim.files raises these errors: imported here, not at the top

    more = len(error.errors()) - 1
    extra = f" ({counted(more, 'more problem')})" if more else ""
    return MmsimError(f"{detail}{extra}", source=source, field=field)


def validate_mapping(model_cls, data: object, source: str, kind: str = "YAML mapping", *, strict: bool = False):
    """Validate a parsed file's top-level mapping as ``model_cls``, or raise one MmsimError naming the field.

    ``strict`` refuses conversions (``"16e9"`` or ``true`` for a number), as files written by people need.
    """
    from pydantic import ValidationError

    if not isinstance(data, dict):
        raise MmsimError(f"expected a {kind} at the top level", source=source)
    try:
        return model_cls.model_validate(data, strict=strict)
    except ValidationError as error:
        raise pydantic_error_message(error, source) from None
