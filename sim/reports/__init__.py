"""HTML policy-comparison reports: load runs, compute the table, draw the plots, assemble one offline page."""

from sim.reports.data import RunData, load_run
from sim.reports.html import build_report

__all__ = ["RunData", "load_run", "build_report"]
