"""HTML policy-comparison reports: load runs, check they are comparable, compute the tables and verdict, draw the
plots, assemble one offline page."""

import importlib

_EXPORTS = {"RunData": "sim.reports.data", "load_run": "sim.reports.data", "build_report": "sim.reports.html"}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    # Lazy: the CLI imports small parts (defaults, the verdict) without paying for matplotlib at start-up.
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sim.reports' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
