"""``mmsim calibrate``: measure this host into a profile; ``mmsim calibrate validate``: check a profile for real.

The work lives in the ``calibrate`` package, imported inside the commands so
that ``mmsim --help`` (and every other command) never imports torch.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from sim.cli import app
from sim.cli.common import comma_list
from sim.errors import MmsimError

calibrate_app = typer.Typer(help="Measure this machine (torch microbenchmarks) into a hardware profile.",
                            invoke_without_command=True)
app.add_typer(calibrate_app, name="calibrate")

THREADS_PER_CORE = 4
"""Most torch threads per core --threads may ask for: beyond a few per core they only contend, and a huge count
(100,000) crashed torch's thread pool (a segmentation fault, no message)."""


def max_threads() -> int:
    """The largest --threads this machine takes: THREADS_PER_CORE per core, or 1024 where the cores are unknown."""
    cores = os.cpu_count()
    return THREADS_PER_CORE * cores if cores else 1024


def check_threads(threads: int | None) -> None:
    """Refuse a --threads above max_threads() before torch is loaded (the minimum, 1, is typer's)."""
    if threads is not None and threads > max_threads():
        raise MmsimError(f"--threads {threads:,} is more than this machine can use: give 1 to {max_threads():,} "
                         f"(at most {THREADS_PER_CORE} per core)")


@calibrate_app.callback(invoke_without_command=True)
def calibrate(
    ctx: typer.Context,
    gpu: int = typer.Option(None, "--gpu", help="CUDA GPU index to calibrate (the default is GPU 0)"),
    device: str = typer.Option(None, "--device", help="cpu (CPU-only machines), cuda or cuda:N"),
    models: str = typer.Option(None, "--models", help="comma-separated catalogue models "
                               "(default: qwen2.5-3b with --quick, else qwen2.5-3b,qwen3-8b,qwen2.5-14b); "
                               "with --engine vllm one model (default on the CPU: a 2-layer random-weight Qwen2)"),
    quick: bool = typer.Option(False, "--quick", help="small grids: under a minute on a CPU-only machine"),
    out: Path = typer.Option(None, "--out", help="profile JSON to write (default: ./calibrated-<device>.json)"),
    dtype: str = typer.Option("fp16", "--dtype", help="weight and KV dtype: fp16, bf16 or fp32"),
    workdir: Path = typer.Option(None, "--workdir", help="folder for scratch checkpoints (default: the --out folder)"),
    threads: int = typer.Option(None, "--threads", min=1, help="torch CPU threads (default: the cores not busy with "
                                "other work; with --engine vllm: 1)"),
    engine: str = typer.Option("torch", "--engine", help="torch: time mmsim's own layers; vllm: probe a real vLLM engine"),
    config: Path = typer.Option(None, "--config", help="with --engine vllm: a Hugging Face config.json to calibrate instead of a catalogue "
                                "model (--models then names it; default: its folder's name)"),
    base: Path = typer.Option(None, "--base", help="with --engine vllm: a profile (from mmsim calibrate) to add the "
                              "model to, for its measured link and weight figures"),
    max_num_seqs: int = typer.Option(None, "--max-num-seqs", min=1, help="with --engine vllm: the engine's batch "
                                     "limit (default 16)"),
    max_num_batched_tokens: int = typer.Option(None, "--max-num-batched-tokens", min=16, help="with --engine vllm "
                                               "(default 2048)"),
    block_size: int = typer.Option(None, "--block-size", min=1, help="with --engine vllm (default 32; a multiple of 32 "
                                   "on the CPU)"),
    kv_cache_gib: int = typer.Option(None, "--kv-cache-gib", min=1, max=1024, help="with --engine vllm on the CPU: KV "
                                     "pool in whole GiB (default 1; vLLM's VLLM_CPU_KVCACHE_SPACE takes no fractions)"),
) -> None:
    """Measure a GPU (or the CPU), or a real vLLM engine on it, and write a profile that `mmsim run` can use."""
    if ctx.invoked_subcommand is not None:
        return
    if engine not in ("torch", "vllm"):
        raise MmsimError(f"unknown --engine {engine!r}; expected torch or vllm")
    check_threads(threads)
    if models is not None:  # "" calibrated the default models, and a model given twice was measured twice
        comma_list(models, "--models", str, "model", "comma-separated catalogue model names")
    engine_only = {"--config": config, "--base": base, "--max-num-seqs": max_num_seqs,
                   "--max-num-batched-tokens": max_num_batched_tokens, "--block-size": block_size,
                   "--kv-cache-gib": kv_cache_gib}
    if engine == "torch":  # silently ignored, they let a calibration of other models run for minutes
        ignored = [flag for flag, value in engine_only.items() if value is not None]
        if ignored:
            raise MmsimError(f"{', '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} for --engine vllm; "
                             "the torch calibration measures catalogue models (--models)")
    target = _check_outputs(out or Path.cwd() / "calibrated.json", workdir)
    if engine == "vllm":
        from calibrate.vllm_engine import EngineLimits, check_device, require_vllm
        if gpu is not None and device is not None:
            raise MmsimError("give either --gpu N or --device, not both")
        where = check_device(device or ("cpu" if gpu is None else f"cuda:{gpu}"))
        require_vllm()
        from calibrate.vllm_commands import calibrate_engine_command
        given = {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens,
                 "block_size": block_size, "kv_cache_gib": kv_cache_gib}
        limits = EngineLimits(**{key: value for key, value in given.items() if value is not None}, threads=threads or 1)
        calibrate_engine_command(models, config, dtype, where, limits, quick, out or Path.cwd() / "calibrated-vllm.json",
                                 workdir or target.parent, base)
        return
    _require_calibrate()
    from calibrate.commands import calibrate_command
    calibrate_command(gpu, device, models, quick, out, dtype, workdir, threads)


@calibrate_app.command("validate")
def validate(
    profile: str = typer.Argument(..., help="profile JSON (or a built-in profile name)"),
    model: str = typer.Option(None, "--model", help="catalogue model (default: the smallest measured one)"),
    layers: int = typer.Option(4, "--layers", help="decoder layers to run"),
    cpu_layers: int = typer.Option(0, "--cpu-layers", help="of those, how many run on the CPU (tests the offload formula)"),
    batch: int = typer.Option(4, "--batch", help="sequences decoded together; the LM head cost is quoted at the middle "
                              "batch of the calibration grid (4 on CPU, 16 for a full GPU calibration)"),
    prompt_tokens: int = typer.Option(128, "--prompt-tokens", help="prompt length per sequence"),
    new_tokens: int = typer.Option(32, "--new-tokens", help="decode steps"),
    repeats: int = typer.Option(5, "--repeats", help="runs of the loop (each step counts its best run on the CPU, its median on a GPU)"),
    device: str = typer.Option(None, "--device", help="cpu, cuda or cuda:N (default: the device the profile was calibrated on)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    record: bool = typer.Option(False, "--record", help="also store the result in the profile's validation section"),
    threads: int = typer.Option(None, "--threads", min=1, help="torch CPU threads (default: as many as the profile was measured with)"),
) -> None:
    """Run a real torch decode loop and compare its tokens/s with the profile's prediction."""
    check_threads(threads)
    _require_calibrate()
    from calibrate.commands import validate_command
    from calibrate.validate import LoopShape
    validate_command(profile, model, device, LoopShape(layers, cpu_layers, batch, prompt_tokens, new_tokens),
                     repeats, as_json, record, threads)


@calibrate_app.command("interconnect")
def interconnect(
    profile: Path = typer.Argument(..., help="profile JSON to write the measured hardware.interconnect into"),
    repeats: int = typer.Option(5, "--repeats", min=1, help="timed runs of each collective and size"),
    cpu_ranks: int = typer.Option(0, "--cpu-ranks", min=0, help="instead of the GPUs, this many CPU processes over "
                                  "gloo: a check of the benchmark itself, whose figures are no GPU link's"),
    timeout_s: float = typer.Option(600.0, "--timeout-s", min=1.0, help="give up after this many seconds"),
) -> None:
    """Time all-reduce and send/recv of a step's activations between this node's GPUs (NCCL) and fit the
    profile's interconnect; with one GPU or none, keep the default and say so."""
    _require_calibrate()
    from calibrate.commands import interconnect_command
    interconnect_command(profile, cpu_ranks, repeats, timeout_s)


def _check_outputs(out: Path, workdir: Path | None) -> Path:
    """Before minutes of measuring: the profile's folder and the scratch folder must be writable (one line, exit 2)."""
    from sim.outputs import check_output_dir, check_output_file

    check_output_file(out)  # a folder, or a name the file system refuses: before the measuring, not after it
    if workdir is not None:
        check_output_dir(workdir)
    return out


def _require_calibrate() -> None:
    """Stop with one line (exit 2, via the CLI's error handler) when the calibration extras are missing."""
    from calibrate import require_torch
    require_torch()
