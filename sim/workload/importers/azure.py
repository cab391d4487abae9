"""Azure LLM inference traces (2023 Splitwise, 2024 DynamoLLM; also the 2025 multimodal layout).

Header ``TIMESTAMP,ContextTokens,GeneratedTokens`` (other columns, such as
``NumImages``, are ignored). Timestamps are absolute datetimes with 6 or 7
fractional digits or none, with or without a time zone (``+00:00``, ``Z``);
times without a zone are read as UTC. One service per file, so the model name is
given. CRLF line ends and a last line without newline are normal in these files.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from sim.workload.chunk import RequestChunk
from sim.workload.columns import make_chunk
from sim.workload.rows import ImportOptions, RowReport, whole_numbers
from sim.workload.textfiles import csv_blocks

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def read_azure(path: Path, options: ImportOptions, report: RowReport, rows: int) -> Iterator[RequestChunk]:
    """Chunks with arrival times in seconds after the first valid timestamp.

    Times are subtracted in integer nanoseconds before becoming float seconds, so
    they keep sub-microsecond precision (epoch seconds as floats would not).
    """
    import pandas as pd  # here, not at the top: the formats load together, and native traces are read without it

    origin_ns = None
    for _, frame, lines in csv_blocks(path, rows, report, required=COLUMNS, text_columns=("TIMESTAMP",)):
        stamps = pd.to_datetime(frame["TIMESTAMP"], format="ISO8601", utc=True, errors="coerce")
        bad_time = stamps.isna().to_numpy()
        nanos = stamps.to_numpy(dtype="datetime64[ns]").astype(np.int64)
        if origin_ns is None and not bad_time.all():
            origin_ns = int(nanos[np.flatnonzero(~bad_time)[0]])
        seconds = np.where(bad_time, 0, nanos - (origin_ns or 0)) / 1e9
        prompt, bad_prompt, why_prompt = whole_numbers(frame["ContextTokens"], "ContextTokens")
        output, bad_output, why_output = whole_numbers(frame["GeneratedTokens"], "GeneratedTokens")
        keep = report.check(lines, [
            (bad_time, lambda i: f"TIMESTAMP {frame['TIMESTAMP'].iloc[i]!r} is not a date and time"),
            (bad_prompt, why_prompt), (bad_output, why_output)])
        count = int(keep.sum())
        yield make_chunk(seconds[keep], np.full(count, options.model, dtype=object), prompt[keep], output[keep],
                         extra={"line": lines[keep]})
