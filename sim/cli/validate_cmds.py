"""``mmsim validate vllm``: replay a trace through a real vLLM engine and through mmsim, and compare.

The work lives in ``calibrate.vllm_commands``, imported inside the command so that no other command
imports vLLM or torch.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from sim.cli import app
from sim.cli.common import comma_list
from sim.errors import MmsimError

validate_app = typer.Typer(help="Check mmsim against a real serving engine.", no_args_is_help=True)
app.add_typer(validate_app, name="validate")


def parse_loads(text: str) -> list[float]:
    return comma_list(text, "--loads", _load, "load", "comma-separated positive numbers, e.g. 0.5,1,2")


def _load(item: str) -> float:
    load = float(item)
    if not 0 < load < 1e6:
        raise ValueError(item)
    return load


@validate_app.command("vllm")
def vllm(
    source: Path = typer.Argument(..., help="a scenario YAML (one model) or a trace CSV in mmsim's format"),
    profile: Path = typer.Option(..., "--profile", help="the profile to simulate with (from calibrate --engine vllm)"),
    loads: str = typer.Option("1", "--loads", help="load levels: factors on the arrival rate, e.g. 0.2,0.6,1.5"),
    model: str = typer.Option(None, "--model", help="a trace's model: a catalogue name, or the name for --config"),
    config: Path = typer.Option(None, "--config", help="a Hugging Face config.json of the model"),
    dtype: str = typer.Option(None, "--dtype", help="fp32, fp16 or bf16 (default: the scenario's, else fp16)"),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda:N"),
    max_num_seqs: int = typer.Option(16, "--max-num-seqs", min=1, help="for a trace (a scenario's engine section wins)"),
    max_num_batched_tokens: int = typer.Option(2048, "--max-num-batched-tokens", min=16),
    block_size: int = typer.Option(32, "--block-size", min=1),
    kv_cache_gib: int = typer.Option(1, "--kv-cache-gib", min=1, max=1024, help="KV pool in whole GiB (vLLM on the CPU)"),
    threads: int = typer.Option(1, "--threads", min=1, help="OMP threads of the CPU engine"),
    out: Path = typer.Option(None, "--out", help="folder for validation.json and validation.html"),
    max_error: float = typer.Option(None, "--max-error", min=0, help="exit 1 when any |error| exceeds PCT percent"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    seed: int = typer.Option(0, "--seed", min=0, help="seed of a scenario's generated workload"),
    repeats: int = typer.Option(1, "--repeats", min=1, max=10, help="replays of each level: errors against their "
                                "mean, and how far apart they came (the engine's own spread)"),
) -> None:
    """Replay SOURCE at real arrival times through vLLM, simulate it with mmsim, print the errors per load."""
    from calibrate.vllm_engine import EngineLimits, check_device, require_vllm
    from sim.outputs import check_output_dir

    levels = parse_loads(loads)  # a typo in a flag is named before what the machine lacks
    check_device(device)
    require_vllm()
    if not os.path.isfile(source):
        raise MmsimError("no such file", source=str(source))
    if out is not None:
        check_output_dir(out)
    from calibrate.vllm_commands import validate_vllm_command

    limits = EngineLimits(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, block_size=block_size,
                          kv_cache_gib=kv_cache_gib, threads=threads)
    validate_vllm_command(source, profile, levels, model, config, dtype, device, limits, out, max_error, as_json, seed,
                          repeats)
