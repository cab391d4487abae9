"""BurstGPT (HPMLL/BurstGPT): a real multi-model trace of ChatGPT and GPT-4 requests.

Header ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``
(newer releases add ``Session ID`` and ``Elapsed time``; extra columns are
ignored). Timestamps are whole seconds from the first day's midnight. Rows with
0 response tokens are failed requests, and rows with 0 request tokens carry no
prompt: both are dropped and counted. The ``Model`` labels are mapped to
catalogue models with a model map (or all to one model).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from sim.workload.chunk import RequestChunk
from sim.workload.columns import make_chunk
from sim.workload.native import text_column
from sim.workload.rows import ImportOptions, RowReport, finite_numbers, whole_numbers
from sim.workload.textfiles import csv_blocks

COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")
FAILED = "failed requests (0 request or response tokens)"


def read_burstgpt(path: Path, options: ImportOptions, report: RowReport, rows: int) -> Iterator[RequestChunk]:
    """Chunks with arrival times in the file's seconds and the file's model labels."""
    for _, frame, lines in csv_blocks(path, rows, report, required=COLUMNS, text_columns=("Model",)):
        seconds, bad_time, why_time = finite_numbers(frame["Timestamp"], "Timestamp", minimum=0.0,
                                                   maximum=1e11)  # epoch seconds are fine: times are rebased
        prompt, bad_prompt, why_prompt = whole_numbers(frame["Request tokens"], "Request tokens", minimum=0)
        output, bad_output, why_output = whole_numbers(frame["Response tokens"], "Response tokens", minimum=0)
        model, bad_model = text_column(frame["Model"])
        keep = report.check(lines, [(bad_time, why_time), (bad_model, lambda i: "Model is empty"),
                                    (bad_prompt, why_prompt), (bad_output, why_output)])
        failed = keep & ((prompt == 0) | (output == 0))
        report.drop(FAILED, int(failed.sum()))
        keep &= ~failed
        yield make_chunk(seconds[keep], model[keep], prompt[keep], output[keep], extra={"line": lines[keep]})
