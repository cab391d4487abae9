"""Trace formats: the native one and importers of public traces, by name.

Each reader turns one file into chunks whose ``arrival_s`` is in the source's own
seconds and whose ``extra['line']`` holds line (or row) numbers for messages;
:func:`sim.workload.reader.read_trace` then sorts out order, time windows,
rebasing, scaling and model names the same way for every format.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sim.errors import MmsimError
from sim.workload.chunk import RequestChunk
from sim.workload.importers.azure import read_azure
from sim.workload.importers.burstgpt import read_burstgpt
from sim.workload.importers.length_pairs import read_length_pairs
from sim.workload.importers.mooncake import read_mooncake
from sim.workload.native import read_native
from sim.workload.rows import ImportOptions, RowReport

Reader = Callable[[Path, ImportOptions, RowReport, int], Iterator[RequestChunk]]


@dataclass(frozen=True)
class TraceFormat:
    """A readable trace format.

    ``model_column``: rows name their model (else one model is given for the
    file). ``rebase``: times are absolute or offset, so the first row is time 0
    (native and generated times are kept as they are).
    """

    name: str
    read: Reader
    model_column: bool
    rebase: bool
    summary: str


FORMATS = {f.name: f for f in (
    TraceFormat("mmsim", read_native, True, False, "native trace (.csv, .jsonl, .parquet)"),
    TraceFormat("azure-2023", read_azure, False, True, "Azure LLM inference 2023 (TIMESTAMP,ContextTokens,GeneratedTokens)"),
    TraceFormat("azure-2024", read_azure, False, True, "Azure LLM inference 2024 (same columns, UTC offsets)"),
    TraceFormat("burstgpt", read_burstgpt, True, True, "BurstGPT CSV (Timestamp,Model,Request tokens,Response tokens,...)"),
    TraceFormat("mooncake", read_mooncake, False, True, "Mooncake JSONL (timestamp ms, input/output_length, hash_ids)"),
    TraceFormat("length-pairs", read_length_pairs, False, False,
                "length-pair CSV (num_prefill_tokens,num_decode_tokens,...) + generated arrivals"),
)}


def get_format(name: str) -> TraceFormat:
    """The format called ``name``; an unknown name is a user error listing the known ones."""
    if name not in FORMATS:
        raise MmsimError(f"unknown trace format {name!r}; known formats: {', '.join(FORMATS)}")
    return FORMATS[name]
