"""The ``mmsim`` command line: one typer app; each command group lives in its own module."""

from __future__ import annotations

import importlib
import sys

import typer
from rich.console import Console
from rich.markup import escape

from sim.errors import MmsimError

app = typer.Typer(
    name="mmsim",
    help="Simulate multi-model LLM serving on shared GPUs, calibrated on real measurements.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
stderr = Console(stderr=True)

COMMAND_MODULES = (
    "sim.cli.calibrate_cmds",
    "sim.cli.trace_cmds",
    "sim.cli.catalogue_cmds",
    "sim.cli.run_cmds",
    "sim.cli.reproduce_cmds",
    "sim.cli.report_cmds",
    "sim.cli.sweep_cmds",
    "sim.cli.validate_cmds",
)
"""Each module registers its commands on ``app`` when imported."""

for _module in COMMAND_MODULES:
    importlib.import_module(_module)


def _flags_without_types() -> None:
    """Help without a type beside on/off flags: typer (0.29) lists ``--force <bool>``, as if the flag took a value,
    and then refuses ``--force true``."""
    option = getattr(typer.core, "TyperOption", None)
    shown = getattr(option, "display_type_rich", None)
    if option is None or shown is None:
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag else shown(self, ctx)

    option.display_type_rich = display_type_rich


_flags_without_types()


MAX_MESSAGE_CHARS = 2000
"""An error message is cut to this length: a message must never echo a multi-megabyte field."""


def error_line(error: Exception | str) -> str:
    """The one line printed for a user error: printable whatever it quotes, and not too long."""
    message = str(error).encode("utf-8", "backslashreplace").decode("utf-8")  # lone surrogates cannot be printed
    return message if len(message) <= MAX_MESSAGE_CHARS else f"{message[:MAX_MESSAGE_CHARS]}... (cut)"


own_command_line = False
"""Whether :func:`main` runs this process's own command line (not an ``argv`` handed in, as tests do): only then
may a command start the process again (``calibrate.allocator``)."""


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors, writes failing for want of space or permission, and paths the system cannot look
    up, print one line and exit 2."""
    from sim.outputs import disk_error, path_error

    global own_command_line
    own_command_line = argv is None
    try:
        code = app(args=argv, standalone_mode=False)
    except typer.Abort:
        stderr.print("interrupted")
        sys.exit(130)
    except typer.TyperException as error:  # a bad flag or argument: one line too, not a box
        context = getattr(error, "ctx", None)
        message = error.format_message() if hasattr(error, "format_message") else str(error)
        if message.strip():  # empty when the group's help was printed instead (no command given)
            hint = f" (see {context.command_path} --help)" if context is not None else ""
            stderr.print(f"[bold red]error:[/] {escape(error_line(message))}{hint}", highlight=False, soft_wrap=True)
        sys.exit(getattr(error, "exit_code", 2))
    except MmsimError as error:
        stderr.print(f"[bold red]error:[/] {escape(error_line(error))}", highlight=False, soft_wrap=True)
        sys.exit(error.exit_code)
    except OSError as error:
        problem = disk_error(error, error.filename or "output") or path_error(error)
        if problem is None:
            raise
        stderr.print(f"[bold red]error:[/] {escape(error_line(problem))}", highlight=False, soft_wrap=True)
        sys.exit(problem.exit_code)
    except KeyboardInterrupt:
        stderr.print("interrupted")
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
