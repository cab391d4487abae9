"""The workload as the engine sees it: a stream of request chunks from a scenario's ``workload:`` section."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from sim.errors import MmsimError
from sim.workload.chunk import RequestChunk
from sim.workload.config import MAX_TIME_S, TraceConfig, WorkloadConfig
from sim.workload.generator import generate
from sim.workload.rows import ImportOptions, RowReport
from sim.workload.textfiles import resolve_input


def trace_options(trace: TraceConfig, *, seed: int, base_dir: Path | None,
                  served_models: frozenset[str] | None = None) -> ImportOptions:
    """The import options a scenario's ``trace:`` entry stands for."""
    return ImportOptions(model=trace.model, model_map=trace.model_map, time_scale=trace.time_scale,
                         start_s=trace.start_s, end_s=trace.end_s, skip_bad=trace.skip_bad, arrivals=trace.arrivals,
                         seed=seed, base_dir=None if base_dir is None else str(base_dir),
                         served_models=served_models)


def iter_requests(config: WorkloadConfig, *, seed: int, base_dir: Path, chunk_rows: int = 65536,
                  report: RowReport | None = None) -> Iterator[RequestChunk]:
    """Chunks of up to ``chunk_rows`` requests in non-decreasing arrival order; ``first_id`` is the running index.

    Relative paths resolve against ``base_dir`` (the scenario's folder), then the
    current folder. A bad trace file raises :class:`sim.errors.MmsimError` naming
    the file and line; a missing file names the field. ``time_scale`` multiplies
    every arrival time. Trace rows naming a model the scenario does not serve are
    bad rows; arrivals past ``MAX_TIME_S`` after scaling are errors. A trace's rows are counted in ``report``
    (those ``skip_bad`` dropped among them), when one is given.
    """
    if config.generator is not None:
        chunks = generate(config.generator, seed=seed, base_dir=base_dir, chunk_rows=chunk_rows,
                          prefix_block_tokens=config.prefix_block_tokens)
    else:
        from sim.workload.reader import read_trace  # the trace readers, for trace workloads only

        trace = config.trace
        assert trace is not None  # a workload has exactly one of generator and trace
        path = resolve_input(trace.path, base_dir, "workload.trace.path")
        options = trace_options(trace, seed=seed, base_dir=base_dir, served_models=config.served_models)
        if report is not None:
            report.source = str(path)
        chunks = read_trace(path, trace.format, options, rows=chunk_rows, report=report)
    for chunk in chunks:
        if config.time_scale != 1.0:
            chunk.arrival_s = chunk.arrival_s * config.time_scale
        if len(chunk) and chunk.arrival_s[-1] > MAX_TIME_S:
            raise MmsimError(f"arrivals reach {chunk.arrival_s[-1]:.4g} s after scaling, past the simulator's "
                             f"horizon of {MAX_TIME_S:g} s; lower time_scale or shorten the workload",
                             field="workload.time_scale")
        yield chunk


def model_names(config: WorkloadConfig) -> list[str] | None:
    """The models the workload can request when known without reading a file (generator mix, --model, map)."""
    if config.generator is not None:
        return config.generator.model_names()
    trace = config.trace
    assert trace is not None  # a workload has exactly one of generator and trace
    if trace.model is not None:
        return [trace.model]
    if trace.model_map is not None:
        return sorted(set(trace.model_map.values()))
    return None
