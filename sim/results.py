"""Run results: the summary figures and the files a run writes (atomically)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from sim.engine import build as engine_build
from sim.engine.request import LOSS_CAUSES

LATENCIES = ("ttft_s", "tpot_s", "e2e_s", "queue_s")


def percentiles(values: pd.Series) -> dict:
    data = values.dropna().to_numpy()
    if data.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(data, [50, 90, 99])
    return {"mean": float(data.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def slo_met(requests: pd.DataFrame, scenario) -> pd.Series:
    """True for completed requests within every SLO that applies to their model."""
    met = requests["status"].eq("completed")
    for model in requests["model"].cat.categories:
        slo = scenario.slo_for(model)
        rows = requests["model"].eq(model)
        for field in ("ttft_s", "tpot_s", "e2e_s"):
            limit = getattr(slo, field)
            if limit is not None:
                # A completed one-token output has no TPOT (NaN): nothing of it can miss a TPOT limit.
                values = requests[field].fillna(0.0 if field == "tpot_s" else np.inf)
                met &= ~rows | (values <= limit)
    return met


def _rates(requests: pd.DataFrame, met: pd.Series) -> dict:
    done = requests[requests["status"].eq("completed")]
    start = float(requests["arrival_s"].min()) if len(requests) else 0.0
    end = float(done["finish_s"].max()) if len(done) else start
    span = max(end - start, 1e-12)
    return {
        "throughput_tokens_per_s": float(done["output_tokens"].sum()) / span,
        "throughput_requests_per_s": len(done) / span,
        "goodput_requests_per_s": float(met.sum()) / span,
        "makespan_s": end - start,
    }


def summarize(requests: pd.DataFrame, timeseries: pd.DataFrame, scenario, engine, profile, policy: str, seed: int,
              mode: str, wall_s: float) -> dict:
    met = slo_met(requests, scenario)
    completed = requests["status"].eq("completed")
    summary = {
        "scenario": scenario.name, "policy": policy, "seed": seed, "mode": mode, "profile": profile.name,
        "requests_total": len(requests),
        "requests_completed": int(completed.sum()),
        "requests_dropped": int((~completed).sum()),
        "drop_reasons": _drop_reasons(requests),
        **_rates(requests, met),
        "slo_attainment": float(met.mean()) if len(requests) else 0.0,
        **{name: percentiles(requests.loc[completed, name]) for name in LATENCIES},
        "preemptions": int(requests["preemptions"].sum()),
        "lost_seconds": {cause: float(requests[f"lost_{cause}_s"].sum()) for cause in LOSS_CAUSES},
        "simulated_seconds": float(engine.env.now),
        "sim_wall_seconds": wall_s,
        "requests_per_wall_second": len(requests) / wall_s if wall_s > 0 else None,
        "engine_build": engine_build(),  # compiled or pure-python: the wall figures depend on it
        "gpu_busy_share": _busy_share(engine),
        "loads": sum(1 for e in engine.recorder.events if e[1] == "load"),
        "unloads": sum(1 for e in engine.recorder.events if e[1] == "unload"),
        "mean_resident_models_per_gpu": _mean_resident(timeseries, engine),
        "per_model": _per_model(requests, met, engine),
        "provenance": profile.provenance(),
    }
    return summary


def _busy_share(engine) -> float:
    now = engine.env.now
    if now <= 0 or not engine.gpus:
        return 0.0
    return float(np.mean([min(1.0, g.busy_s / now) for g in engine.gpus]))


def _mean_resident(timeseries: pd.DataFrame, engine) -> float:
    """Models resident per GPU, averaged over the samples (a GPU with none counts as 0)."""
    rows = timeseries[(timeseries["gpu"] >= 0) & (timeseries["model"] != "")]
    if rows.empty:
        return float(np.mean([len(g.instances) for g in engine.gpus]))
    every = pd.MultiIndex.from_product([rows["time_s"].unique(), [g.index for g in engine.gpus]])
    return float(rows.groupby(["time_s", "gpu"]).size().reindex(every, fill_value=0).mean())


def _drop_reasons(requests: pd.DataFrame) -> dict[str, int]:
    dropped = requests.loc[requests["status"].eq("dropped"), "drop_reason"]
    return {str(k): int(v) for k, v in dropped.value_counts().items() if v}


def _per_model(requests: pd.DataFrame, met: pd.Series, engine) -> dict:
    out = {}
    for model in requests["model"].cat.categories:
        rows = requests["model"].eq(model)
        if not rows.any():
            continue
        part = requests[rows]
        done = part["status"].eq("completed")
        index = engine.model_index.get(str(model))
        out[str(model)] = {
            "requests": int(rows.sum()), "completed": int(done.sum()), "dropped": int((~done).sum()),
            "drop_reasons": _drop_reasons(part),
            "max_model_len": engine.max_model_len[index] if index is not None else None,
            "slo_attainment": float(met[rows].mean()),
            **_rates(part, met[rows]),
            **{name: percentiles(part.loc[done, name]) for name in ("ttft_s", "tpot_s", "e2e_s")},
            "preemptions": int(part["preemptions"].sum()),
        }
    return out


def atomic_write(path: Path, write) -> None:
    """Write through a temporary file in the same folder, then rename: never a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes owner-only files; results are ordinary files
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_run(result, out_dir: Path, scenario_data: dict | None = None) -> Path:
    """Write summary.json, requests/events/timeseries Parquet (and the scenario) into ``out_dir``."""
    out_dir = Path(out_dir)
    atomic_write(out_dir / "requests.parquet", lambda p: result.requests.to_parquet(p, index=False))
    atomic_write(out_dir / "events.parquet", lambda p: result.events.to_parquet(p, index=False))
    atomic_write(out_dir / "timeseries.parquet", lambda p: result.timeseries.to_parquet(p, index=False))
    if scenario_data is not None:
        atomic_write(out_dir / "scenario.json", lambda p: Path(p).write_text(json.dumps(scenario_data, indent=1, default=str)))
    # The summary goes last: its presence marks a finished run (sweeps resume on it).
    atomic_write(out_dir / "summary.json", lambda p: Path(p).write_text(json.dumps(result.summary, indent=1, default=float)))
    return out_dir
