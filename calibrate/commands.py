"""What ``mmsim calibrate`` and ``mmsim calibrate validate`` do, with their terminal output.

The typer definitions live in ``sim.cli.calibrate_cmds`` and import this module
only when a calibration command runs, so ``mmsim --help`` never imports torch.
This module does not import ``sim.cli`` itself, so a bare GPU machine can call
these functions without the simulator's other dependencies
(``scripts/gpu_calibrate.sh`` does).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from calibrate.bench_interconnect import (activation_sizes_bytes, describe, fit_interconnect, measure_interconnect,
                                          node_interconnect)
from calibrate.build import write_profile
from calibrate.hardware import resolve_device
from calibrate.layers import torch_dtype
from calibrate.plan import plan_for
from calibrate.run import Request, run_calibration, total_steps
from calibrate.validate import LoopShape, choose_model, validate
from sim.catalogue import get_model
from sim.errors import MmsimError
from sim.files import load_json
from sim.profile import load_profile

QUICK_MODELS = ("qwen2.5-3b",)
FULL_MODELS = ("qwen2.5-3b", "qwen3-8b", "qwen2.5-14b")
console, stderr = Console(), Console(stderr=True)


def table(title: str, columns: list[str], rows: list[list[str]]) -> Table:
    result = Table(title=title, title_justify="left")
    for column in columns:
        result.add_column(column, overflow="fold")
    for row in rows:
        result.add_row(*row)
    return result


def calibrate_command(gpu: int | None, device: str | None, models: str | None, quick: bool, out: Path | None,
                      dtype: str, workdir: Path | None, threads: int | None = None) -> Path:
    """Measure this host and write its profile; returns the path written."""
    target = resolve_device(gpu, device)
    torch_dtype(dtype)  # refuse an unsupported dtype before minutes of measuring
    names = [n.strip() for n in models.split(",") if n.strip()] if models else list(QUICK_MODELS if quick else FULL_MODELS)
    specs = tuple(get_model(name) for name in dict.fromkeys(names))
    plan = plan_for(target.type, quick)
    folder = workdir or (out.parent if out else Path.cwd())
    folder.mkdir(parents=True, exist_ok=True)
    request = Request(target, specs, dtype, "quick" if quick else "full", folder, threads)
    started = time.perf_counter()
    columns = (TextColumn("[bold]calibrating[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.description}"))
    with Progress(*columns, console=stderr, transient=False) as progress:
        task = progress.add_task("starting", total=total_steps(plan, request))
        data = run_calibration(request, plan, lambda what: progress.update(task, advance=1, description=what))
    path = out or Path.cwd() / f"{data['name']}.json"
    profile = write_profile(data, path)
    elapsed = time.perf_counter() - started
    rows = []
    for spec in specs:
        cost = profile.models[spec.name]
        rows.append([spec.name, f"{cost.gpu.decode_base_s * 1e3:.3f}", f"{cost.gpu.decode_per_seq_s * 1e6:.2f}",
                     f"{cost.gpu.decode_per_context_token_s * 1e9:.2f}", f"{cost.gpu.prefill_per_token_s * 1e6:.2f}",
                     f"{cost.head_gpu_s * 1e3:.2f}"])
    console.print(table(f"Per-layer costs on {profile.hardware.gpu.name}",
                        ["model", "decode base ms", "per seq us", "per ctx token ns", "prefill per token us", "head ms"], rows))
    link, weights = profile.link, profile.weights
    console.print(f"link: host->device {link.host_to_device.bandwidth_bytes_per_s / 1e9:.2f} GB/s, "
                  f"device->host {link.device_to_host.bandwidth_bytes_per_s / 1e9:.2f} GB/s; "
                  f"load: disk {weights.from_disk.bandwidth_bytes_per_s / 1e9:.2f} GB/s + {weights.from_disk.fixed_s:.3f} s, "
                  f"host {weights.from_host.bandwidth_bytes_per_s / 1e9:.2f} GB/s; "
                  f"unload {weights.unload.fixed_s:.3f} s + {weights.unload.seconds_per_gib:.4f} s/GiB", highlight=False)
    console.print(profile.hardware.software["interconnect"], highlight=False)
    if "cpu_dtype" in profile.hardware.software:
        console.print(f"[bold yellow]note:[/] {profile.hardware.software['cpu_dtype']}", highlight=False)
    console.print(f"wrote {path} in {elapsed:.1f} s", highlight=False)
    return path


def validate_command(profile_ref: str, model: str | None, device: str | None, shape: LoopShape, repeats: int,
                     as_json: bool, record: bool, threads: int | None = None) -> dict:
    """Compare the profile's predicted decode tokens/s with a real torch loop on this machine."""
    profile = load_profile(profile_ref)
    if record and not os.path.isfile(profile_ref):
        raise MmsimError(f"--record writes into a profile file; {profile_ref!r} is a built-in profile")
    calibrated_on = profile.hardware.software.get("calibrated_device")
    target = resolve_device(None, device or calibrated_on or "cuda")
    spec = choose_model(profile, model)
    with stderr.status(f"running {shape.layers} layers of {spec.name} on {target} ({repeats} runs)"):
        result = validate(profile, spec, target, shape, repeats, threads)
    if record:
        _record(Path(profile_ref), result)
    if as_json:
        print(json.dumps(result, indent=2))  # plain text: no colour codes, so it pipes into jq
        return result
    verdict = "[green]within[/]" if result["within_target"] else "[red]outside[/]"
    console.print(table(f"Validation of {profile.name}: {spec.name}, {shape.layers} layers ({shape.cpu_layers} on CPU), "
                        f"batch {shape.batch}, {shape.prompt_tokens}-token prompts, {shape.new_tokens} new tokens",
                        ["", "measured", "predicted", "error"],
                        [["decode tokens/s", f"{result['measured_tokens_per_s']:.2f}", f"{result['predicted_tokens_per_s']:.2f}",
                          f"{result['error_pct']:+.1f}%"],
                         ["prefill s (one prompt)", f"{result['measured_prefill_s']:.4f}", f"{result['predicted_prefill_s']:.4f}",
                          f"{result['prefill_error_pct']:+.1f}%"]]))
    console.print(f"decode error {result['error_pct']:+.1f}% is {verdict} the ±{result['target_pct']:.0f}% target")
    return result


def interconnect_command(path: Path, cpu_ranks: int, repeats: int, timeout_s: float) -> dict | None:
    """Measure the interconnect between this node's GPUs into the profile file at ``path``; returns the section
    written, or None where fewer than two GPUs leave the profile as it is. With ``cpu_ranks`` the same benchmark
    runs over that many CPU processes with gloo instead (a check of the benchmark, not of a GPU link)."""
    if not os.path.isfile(path):
        raise MmsimError("is not a profile file; write one first (mmsim calibrate, or mmsim profiles show NAME "
                         "--json > FILE)", source=str(path))
    load_profile(str(path))  # a bad profile is refused before any measuring
    sizes = activation_sizes_bytes()
    section: dict | None
    if cpu_ranks:
        samples = measure_interconnect(cpu_ranks, "gloo", "cpu", sizes, repeats, timeout_s)
        section = fit_interconnect(samples, "loopback", f"gloo over {cpu_ranks} CPU processes (not a GPU link)")
        line = describe(section)
    else:
        import torch
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        with stderr.status("timing all-reduce and send/recv between the GPUs"):
            section, line = node_interconnect(device, sizes, repeats, timeout_s)
    console.print(line, highlight=False)
    if section is not None:
        data = load_json(path)
        assert isinstance(data, dict)  # load_profile above refused anything else
        data["hardware"]["interconnect"] = section
        write_profile(data, path)
        console.print(f"wrote hardware.interconnect into {path}", highlight=False)
    else:
        console.print(f"{path} is left as it was", highlight=False)
    return section


def _record(path: Path, result: dict) -> None:
    """Store the result under the profile's ``validation`` (keyed by model and layer split), rewriting it atomically."""
    data = json.loads(path.read_text())
    key = f"{result['model']}:{result['layers']}layers:{result['cpu_layers']}cpu:{result['device']}"
    data.setdefault("validation", {})[key] = result
    write_profile(data, path)
