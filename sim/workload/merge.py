"""Merging several time-ordered request streams into one (e.g. one single-model trace per service).

A streaming k-way merge: it holds at most about one chunk per input. Rows with
equal arrival times keep the order of the inputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from sim.workload.chunk import RequestChunk
from sim.workload.columns import concat, optional_columns, take


def merge_streams(streams: Iterable[Iterable[RequestChunk]], rows: int = 65536) -> Iterator[RequestChunk]:
    """One stream in arrival order from time-ordered streams; chunks of up to ``rows`` rows, renumbered.

    The output carries every optional column that any input's first chunk has.
    """
    sources = [iter(stream) for stream in streams]
    buffers: list[RequestChunk | None] = [None] * len(sources)
    live = list(range(len(sources)))
    optional: set[str] = set()
    started = False
    emitted = 0
    while live:
        for index in list(live):
            head = buffers[index]
            while head is None or len(head) == 0:
                head = buffers[index] = next(sources[index], None)
                if head is None:
                    live.remove(index)
                    break
                if not started:
                    optional.update(optional_columns(head))
        started = True
        pending = [(index, buffer) for index, buffer in enumerate(buffers) if buffer is not None and len(buffer)]
        if not pending:
            break
        # Every row up to the smallest "last time" among live inputs is safe to emit: no live input can
        # still produce an earlier row. Exhausted inputs do not constrain it. (Each live input has a
        # non-empty buffer here, so it is among the pending.)
        horizon_s = min((float(buffer.arrival_s[-1]) for index, buffer in pending if index in live), default=np.inf)
        parts = []
        for index, buffer in pending:
            cut = int(np.searchsorted(buffer.arrival_s, horizon_s, side="right"))
            parts.append(take(buffer, slice(0, cut)))
            rest = take(buffer, slice(cut, None))
            buffers[index] = rest if len(rest) else None
        merged = concat(parts, optional)
        merged = take(merged, np.argsort(merged.arrival_s, kind="stable"))
        for start in range(0, len(merged), rows):
            piece = take(merged, slice(start, start + rows))
            piece.extra = {}
            piece.first_id = emitted
            emitted += len(piece)
            yield piece
