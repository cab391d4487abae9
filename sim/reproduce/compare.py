"""Simulated versus published: comparison rows and the fidelity targets of the paper reproduction.

A row is ``{experiment, platform, model, quantity, simulated, published, relative_error}``;
``published`` is None where the paper prints no number. The published values come
from the package's copy of the paper's reference file (``sim/data/paper_reference.yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import numpy as np
import yaml

from sim.catalogue import get_model
from sim.reproduce.experiments import CHECKPOINTS, OFFLOAD_SHARES, OUTPUT_LENGTHS, PAIRINGS, PlatformResult

MIB = 2**20
TABLE_II_KEYS = ("kv_gpu_to_cpu_s", "unload_s", "reload_s", "kv_cpu_to_gpu_s", "total_s",
                 "model_swap_pct", "kv_transfer_pct", "overhead_vs_baseline_pct")
KV_FIT_KEYS = ("kv_gpu_to_cpu_s", "kv_cpu_to_gpu_s", "kv_transfer_pct")
"""Table II cells the KV link model is fitted to together with Table III's points: reported, not targets (the
paper's KV points disagree with any one link model by up to ~23%; KV is ~1% of a pause)."""
TABLE_II_TARGET_KEYS = tuple(key for key in TABLE_II_KEYS if key not in KV_FIT_KEYS)
TABLE_II_TOLERANCE, SPREAD_LIMIT, KV_SIZE_TOLERANCE, E2E_TOLERANCE = 0.03, 0.03, 0.005, 0.03
KV_FIT_TOLERANCE = 0.25
"""Every published KV transfer time (Table II means, Table III points) within this of the fitted link model."""
FIG4_SHARE, FIG4_MAX_LENGTH = 0.8, 1000


def reference() -> dict:
    """The published numbers shipped with the package."""
    return yaml.safe_load(resources.files("sim").joinpath("data/paper_reference.yaml").read_text())


def _row(experiment: str, platform: str, model: str, quantity: str, simulated: float, published: float | None) -> dict:
    error = None if published in (None, 0) else (simulated - published) / published
    return {"experiment": experiment, "platform": platform, "model": model, "quantity": quantity,
            "simulated": float(simulated), "published": None if published is None else float(published),
            "relative_error": error}


def table_ii(result: PlatformResult) -> dict[str, dict[str, float]]:
    """Per job-A model: the charged pause components averaged over checkpoints and pairings, as Table II."""
    out = {}
    for model in dict.fromkeys(a for a, _ in PAIRINGS):
        runs = [r for r in result.runs if r.model_a == model]
        kv_out, unload = np.mean([r.kv_out_s for r in runs]), np.mean([r.unload_s for r in runs])
        reload, kv_in = np.mean([r.reload_s for r in runs]), np.mean([r.kv_in_s for r in runs])
        total = kv_out + unload + reload + kv_in
        figures = {"kv_gpu_to_cpu_s": kv_out, "unload_s": unload, "reload_s": reload, "kv_cpu_to_gpu_s": kv_in,
                   "total_s": total, "model_swap_pct": 100 * (unload + reload) / total,
                   "kv_transfer_pct": 100 * (kv_out + kv_in) / total,
                   "overhead_vs_baseline_pct": 100 * total / result.baselines[model]}
        out[model] = {key: float(value) for key, value in figures.items()}
    return out


def figure_5(result: PlatformResult) -> dict[tuple[str, str], list[float]]:
    """Total pause of job A per checkpoint N, per pairing (A, B)."""
    return {(a, b): [next(r.overhead_s for r in result.runs if (r.model_a, r.model_b, r.checkpoint) == (a, b, n))
                     for n in CHECKPOINTS] for a, b in PAIRINGS}


def spread(values: list[float]) -> float:
    """(max - min) / mean: how far a curve is from flat."""
    return (max(values) - min(values)) / float(np.mean(values))


def end_to_end(result: PlatformResult) -> dict[str, tuple[float, float]]:
    """Per job-A model: uninterrupted service time, and the mean service time with one preemption
    less the time job B held the GPU (= baseline + the charged pause)."""
    return {model: (base, float(np.mean([r.e2e_with_preemption_s for r in result.runs if r.model_a == model])))
            for model, base in result.baselines.items()}


def kv_sizes(result: PlatformResult) -> dict[str, float]:
    """MiB of KV job A swapped out at N=5000 (71 + 5000 tokens), per model, from the runs."""
    return {r.model_a: r.kv_tokens * get_model(r.model_a).kv_bytes_per_token() / MIB
            for r in result.runs if r.checkpoint == 5000}


def rows(result: PlatformResult, ref: dict) -> list[dict]:
    """Every compared quantity of one platform."""
    p, out = result.platform, []
    for model, cells in table_ii(result).items():
        published = ref["table_ii"][p][model]
        for key in TABLE_II_KEYS:
            row = _row("table_ii", p, model, key, cells[key], published[key])
            row["relative_error"] = (at_printed_precision(cells[key], published[key], key) - published[key]) / published[key]
            out.append(row)
    for (a, b), curve in figure_5(result).items():
        pairing = f"{a}->{b}"
        out += [_row("figure_5", p, pairing, f"pause_s_N{n}", v, None) for n, v in zip(CHECKPOINTS, curve)]
        out.append(_row("figure_5", p, pairing, "pause_mean_s", float(np.mean(curve)), ref["figure_5_mean_overhead_s"][p][a]))
        out.append(_row("figure_5", p, pairing, "spread", spread(curve), None))
    for model, mib in kv_sizes(result).items():
        out.append(_row("table_iii", p, model, "kv_cache_mib_at_5000_tokens", mib, ref["table_iii"]["kv_cache_mb_at_5000_tokens"][model]))
    for model, given in ref["table_iii"].get(p, {}).items():
        for label, cells in given.items():
            n = int(label.split("_")[1])
            run = next(r for r in result.runs if r.model_a == model and r.checkpoint == n)
            out.append(_row("table_iii", p, model, f"gpu_to_cpu_ms_at_{n}", 1000 * run.kv_out_s, cells["gpu_to_cpu_ms"]))
            out.append(_row("table_iii", p, model, f"cpu_to_gpu_ms_at_{n}", 1000 * run.kv_in_s, cells["cpu_to_gpu_ms"]))
    for model, (base, preempted) in end_to_end(result).items():
        published = ref["end_to_end_s"][model] if p == "rtx5000" else {}
        out.append(_row("end_to_end", p, model, "baseline_s", base, published.get("baseline")))
        out.append(_row("end_to_end", p, model, "one_preemption_s", preempted, published.get("one_preemption")))
    for (model, length), curve in result.curves.items():
        out += [_row("figure_4", p, model, f"norm_throughput_g{share:g}_out{length}", v, None)
                for share, v in zip(OFFLOAD_SHARES, curve)]
    return out


@dataclass(frozen=True)
class Target:
    """One fidelity target and whether the simulation meets it."""

    name: str
    passed: bool
    detail: str


def at_printed_precision(value: float, published: float, key: str) -> float:
    """Percentages are compared at the decimals the paper prints (0.6 % of a total is 0.55-0.65 %):
    the paper's own components give 0.576 % for a printed 0.6 %, which is not a 4 % error."""
    if not key.endswith("_pct"):
        return value
    decimals = len(repr(float(published)).split(".")[1])
    return round(value, decimals)


def kv_fit_errors(result: PlatformResult, ref: dict) -> list[tuple[str, float]]:
    """Relative error of the simulated KV transfer time at every published KV point of the platform."""
    out = []
    for model, cells in table_ii(result).items():
        for key in ("kv_gpu_to_cpu_s", "kv_cpu_to_gpu_s"):
            published = ref["table_ii"][result.platform][model][key]
            out.append((f"Table II {model} {key}", (cells[key] - published) / published))
    for model, given in ref["table_iii"].get(result.platform, {}).items():
        for label, cells in given.items():
            n = int(label.split("_")[1])
            run = next(r for r in result.runs if r.model_a == model and r.checkpoint == n)
            for key, seconds in (("gpu_to_cpu_ms", run.kv_out_s), ("cpu_to_gpu_ms", run.kv_in_s)):
                out.append((f"Table III {model} {key} at {n}", (1000 * seconds - cells[key]) / cells[key]))
    return out


def figure_4_at(result: PlatformResult, model: str, length: int, share: float = FIG4_SHARE) -> float:
    """Normalised decode throughput of ``model`` at ``share`` GPU layers for ``length``-token outputs."""
    return result.curves[(model, length)][OFFLOAD_SHARES.index(share)]


def targets(results: list[PlatformResult], ref: dict) -> list[Target]:
    """The reproduction's targets (DESIGN.md) checked on the simulated results."""
    out = []
    for result in results:
        p = result.platform
        for model, cells in table_ii(result).items():
            for key in TABLE_II_TARGET_KEYS:
                published = ref["table_ii"][p][model][key]
                error = abs(at_printed_precision(cells[key], published, key) - published) / published
                out.append(Target(f"{p} Table II {model} {key}", error <= TABLE_II_TOLERANCE,
                                  f"{cells[key]:.4g} vs {published} ({error:.1%})"))
        worst, where = max((abs(error), label) for label, error in kv_fit_errors(result, ref))
        out.append(Target(f"{p} KV link fit within {KV_FIT_TOLERANCE:.0%}", worst <= KV_FIT_TOLERANCE,
                          f"largest error {worst:.1%} ({where})"))
        for (a, b), curve in figure_5(result).items():
            s = spread(curve)
            out.append(Target(f"{p} Figure 5 {a}->{b} flat", s < SPREAD_LIMIT, f"spread {s:.2%} of mean"))
        for model, mib in kv_sizes(result).items():
            published = ref["table_iii"]["kv_cache_mb_at_5000_tokens"][model]
            error = abs(mib - published) / published
            out.append(Target(f"{p} Table III KV {model}", error <= KV_SIZE_TOLERANCE, f"{mib:.1f} vs {published} MiB ({error:.2%})"))
        if p == "rtx5000":
            for model, values in end_to_end(result).items():
                for value, key in zip(values, ("baseline", "one_preemption")):
                    published = ref["end_to_end_s"][model][key]
                    error = abs(value - published) / published
                    out.append(Target(f"{p} end-to-end {model} {key}", error <= E2E_TOLERANCE, f"{value:.1f} vs {published} s ({error:.1%})"))
        for length in (n for n in OUTPUT_LENGTHS if n <= FIG4_MAX_LENGTH):
            low, high = figure_4_at(result, "llama-3-8b", length), figure_4_at(result, "llama-2-70b", length)
            out.append(Target(f"{p} Figure 4 Llama-3-8B < 0.60 at 80% (out {length})", low < 0.60, f"{low:.3f}"))
            out.append(Target(f"{p} Figure 4 Llama-2-70B > 0.85 at 80% (out {length})", high > 0.85, f"{high:.3f}"))
        out += _orderings(result)
    by_platform = {r.platform: r for r in results}
    if {"rtx5000", "a6000"} <= set(by_platform):
        rtx, a6000 = by_platform["rtx5000"], by_platform["a6000"]
        below = all(a6000.curves[key][i] <= rtx.curves[key][i] + 1e-12
                    for key in rtx.curves for i, share in enumerate(OFFLOAD_SHARES) if share < 1.0)
        out.append(Target("Figure 4 A6000 curves below RTX 5000", below, "every model, length and share < 100%"))
    return out


def _orderings(result: PlatformResult) -> list[Target]:
    """Llama-3-8B below Qwen3-32B below Llama-2-70B at every partial share and length."""
    ordered = all(figure_4_at(result, "llama-3-8b", n, s) < figure_4_at(result, "qwen3-32b", n, s) < figure_4_at(result, "llama-2-70b", n, s)
                  for n in OUTPUT_LENGTHS for s in OFFLOAD_SHARES if s < 1.0)
    return [Target(f"{result.platform} Figure 4 order 8B < 32B < 70B", ordered, "every length and share < 100%")]
