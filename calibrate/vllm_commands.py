"""What ``mmsim calibrate --engine vllm`` and ``mmsim validate vllm`` do, with their terminal output.

The typer definitions live in ``sim.cli.calibrate_cmds`` and ``sim.cli.validate_cmds``; they import this
module only when the command runs, so no other command imports vLLM or torch.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from calibrate.allocator import ensure_tcmalloc
from calibrate.vllm_calibrate import EngineCalibration, probe_count, run_engine_calibration
from calibrate.vllm_engine import TINY_QWEN2, EngineLimits, VllmEngine, model_folder, require_vllm
from calibrate.vllm_report import write_html
from calibrate.vllm_validate import Trace, error_text, spread_text, summary_rows, validate_levels
from sim.catalogue import ModelSpec, get_model, model_from_hf_config, register_model
from sim.errors import MmsimError
from sim.profile import load_profile

console, stderr = Console(), Console(stderr=True)
DEFAULT_MODEL = "qwen2.5-3b"


def _may_restart() -> bool:
    """Whether this process runs its own ``mmsim`` command line, which it may start again."""
    from sim import cli

    return cli.own_command_line


def _progress(label: str) -> Progress:
    return Progress(TextColumn(f"[bold]{label}[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.description}"), console=stderr, transient=False)


def resolve_model(model: str | None, config: Path | None) -> ModelSpec:
    """A catalogue model, or the architecture of ``config`` registered under ``model`` (default: its folder's name)."""
    if config is None:
        return get_model(model or DEFAULT_MODEL)
    name = model or Path(config).resolve().parent.name
    return register_model(model_from_hf_config(config, name))


def calibrate_engine_command(model: str | None, config: Path | None, dtype: str, device: str, limits: EngineLimits,
                             quick: bool, out: Path, workdir: Path, base: Path | None) -> Path:
    """Calibrate one model's step costs on a real vLLM engine and write the profile."""
    from calibrate.build import write_profile

    require_vllm()
    default_model = model is None and config is None and device == "cpu"
    # A bad model or config.json is refused before the command starts again.
    spec = None if default_model else resolve_model(model, config)
    if device == "cpu":
        ensure_tcmalloc(_may_restart())
    if spec is None:
        config = Path(out).parent / "tiny-qwen2" / "config.json"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(json.dumps(TINY_QWEN2, indent=1))
        stderr.print(f"no --models or --config: calibrating a 2-layer random-weight Qwen2 ({config})", highlight=False)
        spec = resolve_model("tiny-qwen2", config)
    request = EngineCalibration(spec, config, dtype, device, limits, quick, workdir, base)
    started = time.perf_counter()
    with _progress("calibrating vLLM") as progress:
        task = progress.add_task("starting the engine", total=probe_count(request))
        data = run_engine_calibration(request, lambda what: progress.update(task, advance=1, description=what))
    profile = write_profile(data, out)
    fit = data["validation"][f"vllm_fit:{spec.name}"]
    console.print(f"[bold]{spec.name}[/] on {profile.hardware.gpu.name} via {fit['engine']}: residuals of the fit "
                  "(mean / max |error| over the samples kept; outliers: samples left out)", highlight=False)
    for term, report in fit["residuals"].items():
        console.print(f"  {term:15} {report['samples']:4d} samples, {report['outliers']:2d} outliers  "
                      f"{report['mean_abs_pct']}% / {report['max_abs_pct']}%", highlight=False)
    for kind, report in fit["whole_step_errors"].items():
        console.print(f"  whole {kind:9} {report['samples']:4d} samples  mean {report['mean_pct']:+}%, "
                      f"|error| {report['mean_abs_pct']}% (max {report['max_abs_pct']}%)", highlight=False)
    console.print(f"wrote {out} in {time.perf_counter() - started:.1f} s", highlight=False)
    return out


def read_workload(source: Path, model: str | None, config: Path | None, seed: int) -> tuple[Trace, ModelSpec, dict]:
    """The requests of a trace file (mmsim format) or a scenario (its one model, workload and engine section)."""
    from sim.catalogue import configs_relative_to, resolve_config_path
    from sim.scenario import load_scenario
    from sim.workload.stream import iter_requests

    if source.suffix in (".yaml", ".yml"):
        with configs_relative_to(source.parent):
            scenario = load_scenario(source)
        if len(scenario.models) != 1:
            raise MmsimError(f"validate vllm replays one model; the scenario serves {len(scenario.models)}", source=str(source))
        entry = scenario.models[0]
        spec = get_model(entry.name)
        workload, engine = scenario.workload, scenario.engine.model_dump()
        if entry.config and config is None:
            with configs_relative_to(source.parent):
                config = resolve_config_path(entry.config)
        settings = {"engine": engine, "dtype": entry.dtype, "config": config}
    else:
        from sim.workload.config import WorkloadConfig

        spec = resolve_model(model, config)
        workload = WorkloadConfig.model_validate({"trace": {"path": str(source), "format": "mmsim"}})
        settings = {"engine": {}, "dtype": None, "config": config}
    arrival, prompt, output = [], [], []
    for chunk in iter_requests(workload, seed=seed, base_dir=source.parent):
        arrival.extend(chunk.arrival_s.tolist())
        prompt.extend(chunk.prompt_tokens.tolist())
        output.extend(chunk.output_tokens.tolist())
    if not arrival:
        raise MmsimError("the workload holds no requests", source=str(source))
    import numpy as np

    start = arrival[0]
    trace = Trace(np.asarray(arrival) - start, np.asarray(prompt, dtype=int), np.asarray(output, dtype=int))
    return trace, spec, settings


def validate_vllm_command(source: Path, profile: Path, loads: list[float], model: str | None, config: Path | None,
                          dtype: str | None, device: str, limits: EngineLimits, out: Path | None, max_error: float | None,
                          as_json: bool, seed: int, repeats: int = 1) -> dict:
    """Replay a trace (or a scenario's workload) through vLLM and mmsim; print and write the comparison."""
    require_vllm()
    trace, spec, settings = read_workload(source, model, config, seed)
    load_profile(profile)  # a bad profile is refused before the engine takes minutes to start
    if device == "cpu":
        ensure_tcmalloc(_may_restart())
    dtype = dtype or settings["dtype"] or "fp16"
    config = settings["config"]
    engine_section = settings["engine"]
    if engine_section:
        limits = EngineLimits(**(limits.__dict__ | {k: engine_section[k] for k in
                                                    ("max_num_seqs", "max_num_batched_tokens", "block_size")}))
    longest = int((trace.prompt_tokens + trace.output_tokens).max())
    limits = EngineLimits(**(limits.__dict__ | {"max_model_len": max(limits.max_model_len, longest + 1)}))
    with tempfile.TemporaryDirectory(prefix="mmsim-vllm-") as scratch:
        folder = model_folder(spec, config, dtype, Path(scratch))
        with _progress("validating against vLLM") as progress:
            task = progress.add_task("starting the engine", total=len(trace) * len(loads) * repeats + 1)
            engine = VllmEngine(folder, dtype, limits, device)
            progress.update(task, advance=1, description="engine started")
            try:
                result = validate_levels(engine, trace, loads, spec, config, dtype, profile, limits,
                                         lambda what: progress.update(task, advance=1, description=what), repeats)
            finally:
                engine.close()
    if out is not None:
        _write_outputs(result, out)
    if as_json:
        print(json.dumps(result | {"levels": [{k: v for k, v in level.items() if k != "per_request"}
                                              for level in result["levels"]]}, indent=1))
    else:
        from calibrate.commands import table

        console.print(table(f"mmsim vs {result['engine']}: {spec.name} ({dtype}), {len(trace)} requests per level",
                            ["load", "metric", "real", "simulated", "error", "at replay speed"], summary_rows(result)))
        if result["profile_allocator"] not in (None, result["allocator"]):
            stderr.print(f"warning: the profile was calibrated on {result['profile_allocator']}'s allocator and the "
                         f"replay ran on {result['allocator']}'s: their steps differ by the allocator too",
                         highlight=False)
        console.print(f"largest |error|: {result['max_abs_error_pct']:.1f}%; before the replay the engine ran "
                      f"{result['engine_drift_pct']:+.1f}% against the profile's prices of the same steps "
                      "(machine noise since calibration)", highlight=False)
        for level in result["levels"]:
            kinds = level["steps_vs_profile_by_kind_pct"]
            console.print(f"load {level['load']:g}: the replay's steps took {level['steps_vs_profile_pct']:+.1f}% "
                          f"against the profile's prices of them (decode-only {error_text(kinds['decode'])}, with "
                          f"prefills {error_text(kinds['prefill'])}), {level['steps_off_cpu_pct']:.1f}% of their time "
                          "with the engine off the CPU (other processes); \"at replay speed\": the simulator with its "
                          f"decode work priced x{level['replay_speed']['decode']:.3f} and its prefill work "
                          f"x{level['replay_speed']['prefill']:.3f}, as the replay ran them", highlight=False)
            if level["replays"] > 1:
                spread = level["replay_spread_pct"]
                console.print(f"load {level['load']:g}: its {level['replays']} replays came apart by "
                              + ", ".join(f"{name} {spread_text(spread[name])}" for name in spread)
                              + " (largest - smallest, of their mean: the engine's own spread)", highlight=False)
    if max_error is not None and result["max_abs_error_pct"] > max_error:
        console.print(f"[red]an error exceeds --max-error {max_error:g}%[/]")
        raise SystemExit(1)
    return result


def _write_outputs(result: dict, out: Path) -> None:
    """``validation.json`` and ``validation.html`` in ``out``, each written atomically."""
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (("validation.json", json.dumps(result, indent=1)), ("validation.html", write_html(result))):
        handle = tempfile.NamedTemporaryFile("w", dir=out, prefix=f".{name}.", delete=False)
        with handle:
            handle.write(text)
        os.chmod(handle.name, 0o644)
        os.replace(handle.name, out / name)
