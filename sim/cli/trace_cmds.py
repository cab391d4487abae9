"""``mmsim trace ...``: import public traces, merge, generate and summarise native traces.

The workload readers and writers (and pandas with them) are imported by the commands that use them: every
``mmsim`` command imports this module to register these ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sim.catalogue import catalogue
from sim.cli import app
from sim.cli.common import comma_list, console, print_json, table
from sim.cli.trace_flags import (load_generator_file, parse_length, parse_pairs, parse_windows, plain_model_name, scalar,
                                 validate, validate_flags)
from sim.errors import MmsimError
from sim.files import check_regular_file, counted, cut
from sim.outputs import check_output_file
from sim.workload.config import (MAX_PREFIX_BLOCK_TOKENS, PREFIX_BLOCK_TOKENS, TRACE_FORMATS, Arrivals,
                                 GeneratorConfig)

if TYPE_CHECKING:
    from sim.workload.chunk import RequestChunk

trace_app = typer.Typer(help="Import, merge, generate and summarise request traces.", no_args_is_help=True)
app.add_typer(trace_app, name="trace")

GENERATE_DEFAULTS = {
    "arrivals": {"process": "poisson"},
    "prompt_tokens": {"dist": "lognormal", "mean": 1000, "cv": 1.0},
    "output_tokens": {"dist": "lognormal", "mean": 250, "cv": 1.0},
}
"""What ``trace generate`` assumes without --config (the design's example lengths)."""
CHUNK_ROWS = typer.Option(65536, "--chunk-rows", min=1, max=1 << 24, help="rows held in memory at a time")
SEED = typer.Option(0, "--seed", min=0, max=2**63 - 1, help="length-pairs: random seed of the arrivals")


@trace_app.command("formats")
def trace_formats() -> None:
    """List the trace formats that import, stats and scenarios can read."""
    from sim.workload.importers import FORMATS

    console.print(table("Trace formats", ["name", "what"], [[f.name, f.summary] for f in FORMATS.values()]))


@trace_app.command("import")
def trace_import(
    fmt: str = typer.Argument(..., metavar="FORMAT", help=f"one of: {', '.join(TRACE_FORMATS)}"),
    source: Path = typer.Argument(..., metavar="IN", help="the trace file to import"),
    target: Path = typer.Argument(..., metavar="OUT", help="native trace to write (.csv, .jsonl or .parquet)"),
    model: str | None = typer.Option(None, help="model (deployment name) of every request of a single-model trace "
                                     "(one whose model column holds more than one model is refused: use --model-map)"),
    model_map: str | None = typer.Option(None, "--model-map", help="trace label to model (deployment name): SRC=DST,..."),
    time_scale: float = typer.Option(1.0, "--time-scale", help="multiply inter-arrival times (0.5 = twice the rate)"),
    start_s: float | None = typer.Option(None, "--start", help="keep requests from this many seconds after the trace start"),
    end_s: float | None = typer.Option(None, "--end", help="keep requests before this many seconds after the trace start"),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="drop and count malformed rows instead of stopping"),
    rate: float | None = typer.Option(None, help="length-pairs: arrivals per second"),
    process: str = typer.Option("poisson", help="length-pairs: arrival process, poisson or gamma"),
    cv: float | None = typer.Option(None, help="length-pairs: inter-arrival CV (gamma)"),
    seed: int = SEED,
    chunk_rows: int = CHUNK_ROWS,
) -> None:
    """Import a public trace FORMAT file IN into a native trace OUT (times rebased to start at 0)."""
    from sim.workload.importers import get_format
    from sim.workload.reader import read_trace
    from sim.workload.rows import ImportOptions, RowReport
    from sim.workload.writer import write_trace

    get_format(fmt)  # an unknown name is reported before the files are looked at
    check_regular_file(source, "trace file")
    check_not_an_input(target, [source], "OUT is the trace IN; give a new file for the native trace")
    check_output_target(target)
    arrivals = None
    if fmt == "length-pairs":
        if rate is None:
            raise MmsimError("length-pair files have no times: give --rate (and --process gamma --cv X for bursts)")
        spec = {"process": process, "rate_per_s": rate, **({"cv": cv} if cv is not None else {})}
        arrivals = validate(Arrivals, spec, "--process/--rate/--cv")
    elif rate is not None or cv is not None:
        raise MmsimError("--rate, --process and --cv are for length-pairs files only")
    options = ImportOptions(model=model, model_map=parse_pairs(model_map, "--model-map") if model_map else None,
                            time_scale=time_scale, start_s=start_s, end_s=end_s, skip_bad=skip_bad,
                            arrivals=arrivals, seed=seed)
    report = RowReport(str(source))
    labels: set[str] = set()
    write_trace(_labels_into(read_trace(source, fmt, options, rows=chunk_rows, report=report), labels), target)
    console.print(f"wrote {target}: {report.summary()}", highlight=False, soft_wrap=True)
    note_deployment_names(labels, "" if model or model_map else "or map the trace's labels with --model-map LABEL=NAME")


def _labels_into(chunks: Iterator[RequestChunk], labels: set[str]) -> Iterator[RequestChunk]:
    """``chunks`` as they are, adding each one's model labels to ``labels`` on the way."""
    for chunk in chunks:
        labels.update(chunk.model.tolist())
        yield chunk


def note_deployment_names(names: set[str], remedy: str = "") -> None:
    """Say which of a trace's model names are not catalogue models. A trace names the deployments a scenario serves,
    which may be aliases or config-file models, so these are not errors; but a typo shows here, not at the run."""
    unlisted = sorted(names.difference(catalogue()))
    if unlisted:
        shown = ", ".join(repr(cut(name)) for name in unlisted[:5]) + (f" and {len(unlisted) - 5} more" if len(unlisted) > 5 else "")
        console.print(f"note: {shown} {'is not a catalogue model' if len(unlisted) == 1 else 'are not catalogue models'}: "
                      f"a scenario replaying this trace must serve {'it' if len(unlisted) == 1 else 'them'} by that "
                      f"name (models: - {{name: CATALOGUE-MODEL, alias: NAME}} or {{config: config.json, name: NAME}})"
                      + (f", {remedy}" if remedy else ""), highlight=False, soft_wrap=True)


@trace_app.command("merge")
def trace_merge(
    sources: list[Path] = typer.Argument(..., metavar="IN...", help="native traces to merge"),
    target: Path = typer.Argument(..., metavar="OUT", help="merged native trace (.csv, .jsonl or .parquet)"),
    chunk_rows: int = CHUNK_ROWS,
) -> None:
    """Merge native traces (e.g. one per service, each imported with --model) into one, in time order."""
    from sim.workload.merge import merge_streams
    from sim.workload.reader import read_trace
    from sim.workload.rows import ImportOptions
    from sim.workload.writer import write_trace

    for path in sources:
        check_regular_file(path, "trace file")
    check_not_an_input(target, sources, "OUT is also an input; the last argument is the merged trace to write, so "
                       "give a new file after the inputs")
    check_output_target(target)
    options = ImportOptions()
    streams = [read_trace(path, "mmsim", options, rows=chunk_rows) for path in sources]
    rows = write_trace(merge_streams(streams, chunk_rows), target)
    console.print(f"wrote {target}: {counted(rows, 'request')} from {counted(len(sources), 'trace')}", highlight=False, soft_wrap=True)


def check_not_an_input(target: Path, sources: list[Path], message: str) -> None:
    """Refuse a trace to write that is one of the command's inputs (also through a link, a hard link or another
    spelling of its path): the output is opened for writing while the input is still being read. A path the
    system refuses to look at (a name over 255 bytes, a link that loops) is the output check's one line."""
    from sim.outputs import cannot_write

    try:
        same = target.exists() and any(target.samefile(path) for path in sources)
    except OSError as error:
        raise cannot_write(error, target) from None
    if same:
        raise MmsimError(message, source=str(target))


def check_output_target(target: Path) -> None:
    """A trace file to write: a known suffix, in a writable folder, not a folder or device (before reading)."""
    from sim.workload.textfiles import file_kind

    file_kind(target)
    check_output_file(target)


@trace_app.command("generate")
def trace_generate(
    target: Path = typer.Option(..., "--out", help="native trace to write (.csv, .jsonl or .parquet)"),
    config: Path | None = typer.Option(None, help="YAML: a scenario, its workload, or a generator mapping"),
    seed: int | None = typer.Option(None, min=0, max=2**63 - 1, help="random seed (default: the scenario's, else 0)"),
    duration_s: float | None = typer.Option(None, "--duration", help="seconds of arrivals"),
    max_requests: int | None = typer.Option(None, "--max-requests", help="stop after this many requests"),
    process: str | None = typer.Option(None, help="poisson, gamma, rate-series or servegen"),
    rate: float | None = typer.Option(None, help="arrivals per second (rate-series/servegen: time-average)"),
    cv: float | None = typer.Option(None, help="gamma: inter-arrival CV"),
    windows: str | None = typer.Option(None, help="rate-series: START:RATE[:CV],..."),
    servegen: str | None = typer.Option(None, "--servegen-file", help="servegen: a chunk-N-trace.csv file"),
    mix: str | None = typer.Option(None, help="model shares: NAME=WEIGHT,..."),
    zipf: float | None = typer.Option(None, help="Zipf exponent of model popularity (with --models)"),
    models: str | None = typer.Option(None, help="models in popularity order for --zipf: a,b,c"),
    prompt: str | None = typer.Option(None, help="prompt lengths, e.g. lognormal,mean=1000,cv=1 or constant,value=512"),
    output: str | None = typer.Option(None, help="output lengths, e.g. lognormal,mean=250,cv=1"),
    chunk_rows: int = CHUNK_ROWS,
) -> None:
    """Generate a synthetic trace (same seed, same bytes)."""
    from sim.workload.generator import generate
    from sim.workload.writer import write_trace

    check_output_target(target)
    if config is not None:
        data, config_seed, served, block_tokens = load_generator_file(config)
        source, base_dir = str(config), config.parent
    else:
        data, config_seed, served, block_tokens = dict(GENERATE_DEFAULTS), None, None, PREFIX_BLOCK_TOKENS
        source, base_dir = "trace generate options", Path.cwd()
    arrivals = dict(data.get("arrivals") or {})
    if process is not None and process != arrivals.get("process"):
        arrivals = {"process": process}
    flags = {"rate_per_s": rate, "cv": cv, "windows": parse_windows(windows) if windows else None, "path": servegen}
    arrivals.update({key: value for key, value in flags.items() if value is not None})
    data = {**data, "arrivals": arrivals}
    data.update({key: value for key, value in {"duration_s": duration_s, "max_requests": max_requests}.items()
                 if value is not None})
    if mix is not None:
        data["mix"] = {plain_model_name(name, "--mix"): scalar(weight, "--mix")
                       for name, weight in parse_pairs(mix, "--mix").items()}
    if mix is not None and (zipf is not None or models is not None):
        raise MmsimError("give the model mix as --mix NAME=WEIGHT,... or as --zipf S --models a,b,c, not both")
    if (zipf is None) != (models is None):
        raise MmsimError("--zipf S and --models a,b,c go together: give both (the exponent and the models in "
                         "popularity order)")
    if models is not None:
        data["mix"] = {"zipf": zipf, "models": comma_list(models, "--models", lambda name: plain_model_name(name, "--models"),
                                                          "model", "comma-separated model names", unique=False)}
    if prompt is not None:
        data["prompt_tokens"] = parse_length(prompt, "--prompt")
    if output is not None:
        data["output_tokens"] = parse_length(output, "--output")
    if "mix" not in data:
        raise MmsimError("give the model mix: --mix NAME=WEIGHT,... or --zipf S --models a,b,c"
                         + (" (or mix: in the generator file)" if config is not None else ""),
                         source=str(config) if config is not None else None)
    generator = validate(GeneratorConfig, data, source) if config is not None else validate_flags(data)
    unserved = [name for name in generator.model_names() if name not in served] if served is not None else []
    if served is not None and unserved:
        raise MmsimError(f"model {cut(unserved[0])!r} is not served by this scenario (it serves "
                         f"{cut(', '.join(sorted(served)), 200)})", source=source, field="mix")
    seed = seed if seed is not None else (config_seed or 0)
    if not 0 <= seed <= 2**63 - 1:
        raise MmsimError(f"the seed must be from 0 to 2**63-1, not {seed}", source=source, field="seed")
    rows = write_trace(generate(generator, seed=seed, base_dir=base_dir, chunk_rows=chunk_rows,
                                field="generator", prefix_block_tokens=block_tokens), target)
    console.print(f"wrote {target}: {counted(rows, 'request')} (seed {seed})", highlight=False, soft_wrap=True)
    if served is None:
        note_deployment_names(set(generator.model_names()))


@trace_app.command("stats")
def trace_stats_cmd(
    path: Path = typer.Argument(..., help="trace file"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    plot: Path | None = typer.Option(None, help="also draw the statistics into a .png or .svg file"),
    fmt: str = typer.Option("mmsim", "--format", help=f"one of: {', '.join(TRACE_FORMATS)}"),
    model: str | None = typer.Option(None, help="model label for single-model formats (default: the file name), or "
                                     "of every request of a single-model trace (several models: use --model-map)"),
    model_map: str | None = typer.Option(None, "--model-map", help="trace label to model: SRC=DST,..."),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="drop malformed rows instead of stopping"),
    prefix_block_tokens: int = typer.Option(PREFIX_BLOCK_TOKENS, "--prefix-block-tokens", min=1,
                                            max=MAX_PREFIX_BLOCK_TOKENS,
                                            help="prompt tokens each prefix id stands for (Mooncake: 512)"),
) -> None:
    """Count, span, rate, burstiness, model shares, length percentiles and ideal prefix reuse of a trace."""
    from sim.workload.importers import FORMATS
    from sim.workload.reader import read_trace
    from sim.workload.rows import ImportOptions, RowReport
    from sim.workload.stats import trace_stats
    from sim.workload.stats_plot import PLOT_SUFFIXES, plot_stats

    single_model = fmt in FORMATS and not FORMATS[fmt].model_column
    if plot is not None:
        if plot.suffix.lower() not in PLOT_SUFFIXES:
            raise MmsimError(f"plot file must end in {' or '.join(PLOT_SUFFIXES)}", source=str(plot))
        check_output_file(plot)
    options = ImportOptions(model=model or (path.stem if single_model else None),
                            model_map=parse_pairs(model_map, "--model-map") if model_map else None, skip_bad=skip_bad)
    report = RowReport(str(path))
    stats = trace_stats(read_trace(path, fmt, options, report=report), prefix_block_tokens)
    summary = {**stats.summary(), "trace_rows": report.counts()}
    if plot is not None and summary["requests"]:
        plot_stats(stats, plot, title=path.name)
    if as_json:
        print_json(summary)
        return
    if not summary["requests"]:  # every statistic but the count is undefined: a table of "None" says nothing
        console.print(f"{path}: no requests ({report.summary()})" + ("; no plot drawn" if plot is not None else ""),
                      highlight=False, soft_wrap=True)
        return
    rows = [[key, _show(value)] for key, value in summary.items() if not isinstance(value, dict)]
    rows += [[f"share {name}", f"{share:.3f}"] for name, share in summary["models"].items()]
    classes = summary.get("slo_class_requests") or {}
    if classes:  # the 10 SLO classes with the most requests (equal counts: label order), then the rest in one row
        from rich.markup import escape

        ranked = sorted(classes.items(), key=lambda item: -item[1])
        unclassed = summary["requests"] - sum(classes.values())
        rows += [[f"slo_class {escape(label)}", f"{counted(count, 'request')} ({count / summary['requests']:.1%})"]
                 for label, count in ranked[:10]]
        if len(ranked) > 10:
            rows.append([f"slo_class: {len(ranked) - 10:,} more classes",
                         f"{counted(sum(count for _, count in ranked[10:]), 'request')} (--json lists every class)"])
        if unclassed:
            rows.append(["slo_class none (empty cell)",
                         f"{counted(unclassed, 'request')} ({unclassed / summary['requests']:.1%})"])
    for key in ("prompt_tokens", "output_tokens"):
        rows.append([key, ", ".join(f"{name} {_show(value)}" for name, value in summary[key].items())])
    if summary["prefix_reuse"] is not None:
        rows.append(["ideal prefix reuse", f"{summary['prefix_reuse']['share']:.1%} of prompt tokens "
                                           f"({prefix_block_tokens}-token blocks seen before)"])
    if report.bad_rows:
        rows.append(["rows skipped as malformed (--skip-bad)",
                     f"{report.bad_rows:,} of {report.rows_read:,} (first: {report.first_bad})"])
    console.print(table(str(path), ["statistic", "value"], rows))


def _show(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
