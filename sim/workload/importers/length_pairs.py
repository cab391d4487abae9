"""Length-pair files (ShareGPT, arXiv summarisation as processed by Vidur / Sarathi-Serve).

Header ``num_prefill_tokens,num_decode_tokens,...`` and no times: each row, in
file order, becomes one request of the given model, and arrival times come from
a generated process (Poisson or Gamma at a rate, or any generator arrival spec).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from sim.errors import MmsimError
from sim.workload.arrivals import ArrivalStream, windows_for
from sim.workload.chunk import RequestChunk
from sim.workload.columns import make_chunk
from sim.workload.rows import ImportOptions, RowReport, whole_numbers
from sim.workload.textfiles import csv_blocks

COLUMNS = ("num_prefill_tokens", "num_decode_tokens")


def read_length_pairs(path: Path, options: ImportOptions, report: RowReport, rows: int) -> Iterator[RequestChunk]:
    """Chunks pairing the file's lengths with generated arrival times (seconds from 0)."""
    if options.arrivals is None:
        raise MmsimError("length-pair files have no times; give an arrival process (--rate, optionally "
                         "--process gamma --cv X)", source=str(path))
    base_dir = Path(options.base_dir) if options.base_dir else None
    arrivals = ArrivalStream(windows_for(options.arrivals, base_dir), options.seed)
    for _, frame, lines in csv_blocks(path, rows, report, required=COLUMNS):
        prompt, bad_prompt, why_prompt = whole_numbers(frame["num_prefill_tokens"], "num_prefill_tokens")
        output, bad_output, why_output = whole_numbers(frame["num_decode_tokens"], "num_decode_tokens")
        keep = report.check(lines, [(bad_prompt, why_prompt), (bad_output, why_output)])
        wanted = int(keep.sum())
        times = arrivals.take(wanted)
        used = len(times)
        yield make_chunk(times, [options.model] * used, prompt[keep][:used], output[keep][:used],
                         extra={"line": lines[keep][:used]})
        if used < wanted:
            return
