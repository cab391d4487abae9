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
)
"""Each module registers its commands on ``app`` when imported."""

for _module in COMMAND_MODULES:
    importlib.import_module(_module)


def main() -> None:
    """Entry point: user errors print one line and exit with code 2."""
    try:
        app()
    except MmsimError as error:
        stderr.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
        sys.exit(error.exit_code)
    except KeyboardInterrupt:
        stderr.print("interrupted")
        sys.exit(130)
