"""Mooncake (kvcache-ai/Mooncake FAST'25 traces): JSONL with prefix-block hashes.

Keys ``timestamp`` (milliseconds from the trace start), ``input_length``,
``output_length`` and ``hash_ids`` (one id per 512-token prompt block; equal ids
mean a shared prefix), which become the requests' ``prefix_ids``. Timestamps are
bucketed (~3 s in the conversation trace), so equal stamps are not real bursts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from sim.workload.chunk import RequestChunk
from sim.workload.columns import make_chunk, parse_prefix_ids, prefix_ids_problem
from sim.workload.rows import ImportOptions, RowReport, finite_numbers, whole_numbers
from sim.workload.textfiles import jsonl_blocks

KEYS = ["timestamp", "input_length", "output_length", "hash_ids"]


def read_mooncake(path: Path, options: ImportOptions, report: RowReport, rows: int) -> Iterator[RequestChunk]:
    """Chunks with arrival times in seconds from the trace start and prefix ids from ``hash_ids``."""
    import pandas as pd  # here, not at the top: the formats load together, and native traces are read without it

    for records, lines in jsonl_blocks(path, rows, report):
        frame = pd.DataFrame.from_records(records, columns=KEYS)
        millis, bad_time, why_time = finite_numbers(frame["timestamp"], "timestamp", minimum=0.0,
                                                 maximum=1e14)  # epoch milliseconds are fine: times are rebased
        prompt, bad_prompt, why_prompt = whole_numbers(frame["input_length"], "input_length")
        output, bad_output, why_output = whole_numbers(frame["output_length"], "output_length")
        hashes = frame["hash_ids"].to_numpy(dtype=object, na_value=None)
        parsed = [parse_prefix_ids(value, text=False) for value in hashes]
        bad_hash = np.fromiter((ids is False for ids in parsed), bool, len(parsed))
        keep = report.check(lines, [(bad_time, why_time), (bad_prompt, why_prompt), (bad_output, why_output),
                                    (bad_hash, lambda i: prefix_ids_problem(
                                        hashes[i], False, "hash_ids", "hash_ids must be a list of whole numbers"))])
        prefix = np.empty(len(parsed), dtype=object)
        prefix[:] = [None if ids is False else ids for ids in parsed]
        count = int(keep.sum())
        yield make_chunk(millis[keep] / 1000.0, np.full(count, options.model, dtype=object), prompt[keep], output[keep],
                         prefix_ids=prefix[keep], extra={"line": lines[keep]})
