"""``mmsim models ...`` and ``mmsim profiles ...``: browse the model catalogue and built-in profiles."""

from __future__ import annotations

import typer

from sim.catalogue import bits_per_weight, catalogue, get_model
from sim.cli import app
from sim.cli.common import console, print_json, table
from sim.profile import builtin_profile_names, load_profile

models_app = typer.Typer(help="Browse the model catalogue.", no_args_is_help=True)
profiles_app = typer.Typer(help="Browse hardware profiles.", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(profiles_app, name="profiles")


@models_app.command("list")
def models_list(dtype: str = typer.Option("fp16", help="weight dtype: fp16, bf16, fp8, int8, int4, q4")) -> None:
    """List catalogue models with their sizes at DTYPE."""
    bits_per_weight(dtype)
    rows = [[m.name, m.num_layers, f"{m.params / 1e9:.2f}B", f"{m.weight_bytes(dtype) / 2**30:.2f}",
             f"{m.kv_bytes_per_token() / 2**20:.4f}", m.hf_id] for m in catalogue().values()]
    console.print(table(f"Models ({dtype} weights, fp16 KV)", ["name", "layers", "params", "weights GiB", "KV MiB/token", "config"], rows))


@models_app.command("show")
def models_show(name: str, dtype: str = typer.Option("fp16", help="weight dtype"),
                kv_dtype: str = typer.Option("fp16", help="KV cache dtype"),
                as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Show one model's architecture and sizes."""
    data = get_model(name).describe(dtype, kv_dtype)
    if as_json:
        print_json(data)
    else:
        console.print(table(name, ["field", "value"], [[k, v] for k, v in data.items()]))


@profiles_app.command("list")
def profiles_list() -> None:
    """List built-in profiles."""
    rows = []
    for name in builtin_profile_names():
        profile = load_profile(name)
        gpu = profile.hardware.gpu
        rows.append([name, gpu.name, f"{gpu.memory_bytes / 2**30:.0f}", gpu.gpus_per_node, gpu.source, profile.description])
    console.print(table("Built-in profiles", ["name", "GPU", "GiB", "GPUs/node", "source", "description"], rows))


@profiles_app.command("show")
def profiles_show(name: str = typer.Argument(..., help="built-in profile name or path to a profile JSON"),
                  as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Show a profile (built-in or a file)."""
    profile = load_profile(name)
    if as_json:
        print_json(profile.model_dump(mode="json"))
        return
    console.print(f"[bold]{profile.name}[/]: {profile.description}")
    rows = [[group, source] for group, source in profile.provenance().items()]
    console.print(table("Provenance", ["numbers", "source"], rows))
