"""What ``mmsim run`` prints when a run ends: the summary with each figure explained in its label, the drops per
model and reason, warnings when the profile or load cannot serve the scenario, and the next command to try."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.table import Table

from sim.files import counted

if TYPE_CHECKING:
    import pandas as pd

DROP_MEANINGS = {
    "model_not_served": "the policy gave the model no GPU",
    "model_exceeds_gpu": "the model's weights and activation reserve leave no KV room on any GPU",
    "exceeds_max_model_len": "prompt + output longer than max_model_len",
    "exceeds_kv_capacity": "needs more KV cache than a GPU holds",
    "not_placed": "the policy never gave the model an instance",
    "not_scheduled": "an instance held it but never ran it before the run ended",
    "exceeds_instance_max_model_len": "prompt + output longer than the KV room of the instance it was given "
                                      "(a GPU smaller than the largest, a larger GPU share, or another model's "
                                      "weights beside it)",
}
LOW_ATTAINMENT = 0.5
"""Below this SLO attainment the run is flagged: the profile or the load cannot serve the scenario."""
BACKLOG_SHARE = 0.05
"""A larger share of requests still waiting at the end is flagged as more load than the cluster serves."""
FOLLOW_UPS = ("swap-aware", "slo-aware", "static")
PREFIX_TABLE_ROWS = 8
"""More instances than this and their prefix-cache figures stay in summary.json (``per_instance``) only."""
SLO_CLASS_TABLE_ROWS = 20
"""More SLO classes than this and the table shows those with the most requests; summary.json has every one."""


def _percentiles(stat: dict | None) -> str:
    if not stat or stat.get("p50") is None:
        return "– (no request completed)"
    return f"{stat['p50']:.3f} / {stat['p90']:.3f} / {stat['p99']:.3f}"


def _share(value: float) -> str:
    return f"{value:.0%}" if value >= 0.1 else f"{value:.1%}"


def _fleet_rows(fleet: dict | None) -> list[tuple[str, str]]:
    """GPU-hours and cost, and what an autoscaler did (see sim.fleet.cost)."""
    if not fleet:
        return []
    per_k = fleet.get("cost_per_1k_requests_usd")
    rows = [("GPU cost: GPU-hours billed, US$, US$ per 1,000 completed requests",
             f"{fleet['gpu_hours']:.2f} GPU-h, ${fleet['cost_usd']:.2f}, "
             f"{'-' if per_k is None else f'${per_k:.4f}'} per 1k")]
    if fleet.get("autoscaler", "none") != "none":
        rows.append((f"autoscaler {fleet['autoscaler']}: scale-ups / downs, cold starts, nodes added / released",
                     f"{fleet['scale_up']} / {fleet['scale_down']}, {fleet['cold_starts']}, "
                     f"{fleet['nodes_provisioned']} / {fleet['nodes_released']}"))
        # The GPU busy share above counts every GPU the pools may have, idle while its node is down.
        rows.append(("GPU busy share of the GPU time billed", f"{fleet.get('busy_share_of_billed', 0.0):.1%}"))
    return rows


def _trace_rows(rows: dict | None) -> list[tuple[str, str]]:
    """The trace rows ``skip_bad`` dropped, when there were any."""
    if not rows or not rows.get("skipped_malformed"):
        return []
    return [("trace rows skipped as malformed (skip_bad)",
             f"{rows['skipped_malformed']:,} of {rows['rows_read']:,} (first: {rows['first_skipped']})")]


def summary_table(summary: dict) -> Table:
    """The run's headline figures, one per row, each label saying what the figure means."""
    lost = summary.get("lost_seconds") or {}
    kv = float(lost.get("kv_out", 0.0)) + float(lost.get("kv_in", 0.0))
    # With SLO classes a request is held to its class's limits (each one the class leaves unset its model's).
    held = "limit of their SLO class (else their model's)" if summary.get("per_slo_class") else "SLO"
    rows = [
        ("requests: completed / dropped", f"{summary['requests_completed']:,} completed, "
                                          f"{summary['requests_dropped']:,} dropped"),
        ("throughput: output tokens/s, completed req/s",
         f"{summary['throughput_tokens_per_s']:.1f} tok/s, {summary['throughput_requests_per_s']:.3f} req/s"),
        (f"goodput: req/s meeting every {held}", f"{summary['goodput_requests_per_s']:.3f} req/s"),
        (f"SLO attainment: share meeting every {held} (drops are misses)", f"{summary['slo_attainment']:.1%}"),
        ("time to first token, s: p50 / p90 / p99", _percentiles(summary.get("ttft_s"))),
        ("time per output token, s: p50 / p90 / p99", _percentiles(summary.get("tpot_s"))),
        ("end-to-end latency, s: p50 / p90 / p99", _percentiles(summary.get("e2e_s"))),
        ("preemptions: times a running request was paused", f"{summary.get('preemptions', 0):,}"),
        ("seconds paused", f"reload {lost.get('reload', 0.0):.1f}, unload {lost.get('unload', 0.0):.1f}, "
                           f"KV {kv:.2f}, recompute {lost.get('recompute', 0.0):.1f}"),
        ("model loads / unloads", f"{summary.get('loads', 0)} / {summary.get('unloads', 0)}"),
        ("GPU busy share: time the GPUs were computing (all the cluster may have)",
         f"{summary.get('gpu_busy_share', 0.0):.1%}"),
        *_fleet_rows(summary.get("fleet")),
        *_trace_rows(summary.get("trace_rows")),
        ("simulated / wall time", f"{summary.get('simulated_seconds', 0.0):.1f} s / "
                                  f"{summary.get('sim_wall_seconds', 0.0):.2f} s"),
    ]
    table = Table(title=f"{summary['scenario']} — policy {summary['policy']} (seed {summary['seed']}, profile "
                        f"{summary.get('profile', '?')})", title_justify="left")
    table.add_column("what", overflow="fold")
    table.add_column("value", overflow="fold")
    for label, value in rows:
        table.add_row(escape(label), escape(value))
    return table


def drops_by_model(summary: dict, requests: pd.DataFrame | None = None) -> dict[str, dict[str, int]]:
    """Model → {drop reason: count}, from the summary's per-model figures or, for runs that lack them, from the
    per-request table."""
    per_model = summary.get("per_model") or {}
    found = {m: dict(figures["drop_reasons"]) for m, figures in per_model.items() if figures.get("drop_reasons")}
    if found or requests is None or "drop_reason" not in requests:
        return found
    dropped = requests[requests["status"].ne("completed")]
    counts = dropped.groupby([dropped["model"].astype(str), dropped["drop_reason"].astype(str)]).size()
    for (model, reason), count in counts.items():
        if count:
            found.setdefault(model, {})[reason] = int(count)
    return found


def drops_table(summary: dict, by_model: dict[str, dict[str, int]]) -> Table | None:
    """Requests, completed and dropped per model, with the drop reasons (None when nothing was dropped)."""
    if not summary.get("requests_dropped"):
        return None
    table = Table(title="dropped requests by model and reason", title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("model", "left"), ("requests", "right"), ("completed", "right"), ("dropped", "right"), ("why", "left"))
    for name, justify in columns:
        table.add_column(name, justify=justify, overflow="fold")
    for model, figures in (summary.get("per_model") or {}).items():
        reasons = by_model.get(model, {})
        dropped = sum(reasons.values()) if reasons else figures.get("requests", 0) - figures.get("completed", 0)
        why = ", ".join(f"{reason} {count:,}" for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1]))
        table.add_row(escape(model), f"{figures.get('requests', 0):,}", f"{figures.get('completed', 0):,}",
                      f"{dropped:,}", escape(why))
    used = sorted({reason for reasons in by_model.values() for reason in reasons})
    table.caption = "; ".join(f"{reason}: {DROP_MEANINGS.get(reason, reason)}" for reason in used) or None
    table.caption_justify = "left"
    return table


def prefix_table(summary: dict) -> Table | None:
    """Each instance's prefix-cache hit rate, when some instance found prompt tokens there and there are few (a
    workload without prefix ids looks every prompt up and finds nothing: a table of 0% says nothing)."""
    rows = [r for r in summary.get("per_instance") or [] if r["prefix_queried_tokens"]]
    if not any(r["prefix_hit_tokens"] for r in rows) or len(rows) > PREFIX_TABLE_ROWS:
        return None
    table = Table(title="prefix cache by instance (prompt tokens, every admission)", title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("instance", "left"), ("model", "left"), ("GPU", "left"), ("looked up", "right"),
        ("found (prefill saved)", "right"), ("hit rate", "right"))
    for name, justify in columns:
        table.add_column(name, justify=justify, overflow="fold")
    for r in rows:
        table.add_row("unloaded ones" if r["instance"] is None else f"#{r['instance']}", escape(r["model"]),
                      ", ".join(str(g) for g in r["gpus"]) or "–", f"{r['prefix_queried_tokens']:,}",
                      f"{r['prefix_hit_tokens']:,}", f"{r['prefix_hit_rate']:.1%}")
    return table


def _class_row(table: Table, label: str, figures: dict) -> None:
    attainment = figures.get("slo_attainment")
    table.add_row(label, f"{figures['requests']:,}", f"{figures['completed']:,}",
                  "–" if attainment is None else f"{attainment:.1%}", _percentiles(figures.get("ttft_s")),
                  _percentiles(figures.get("e2e_s")))


def _met(figures: dict) -> int:
    """The requests of a class that met their SLO (its attainment is that count over its requests)."""
    return round((figures.get("slo_attainment") or 0.0) * figures["requests"])


def slo_class_table(summary: dict) -> Table | None:
    """Each SLO class's requests, SLO attainment and latencies, when trace rows carried classes, then the requests
    without one. Beyond SLO_CLASS_TABLE_ROWS classes, those with the most requests (ties: the worst attainment
    first, then label order) and a line for the rest: summary.json's per_slo_class has every class."""
    classes = summary.get("per_slo_class") or {}
    if not classes:
        return None
    shown, hidden = list(classes.items()), []
    if len(shown) > SLO_CLASS_TABLE_ROWS:
        # A stable sort of the classes in label order: equal ones stay in label order.
        ranked = sorted(shown, key=lambda item: (-item[1]["requests"], item[1].get("slo_attainment") or 0.0))
        shown, hidden = ranked[:SLO_CLASS_TABLE_ROWS], ranked[SLO_CLASS_TABLE_ROWS:]
    which = f": the {len(shown)} of {len(classes):,} with the most requests" if hidden else ""
    table = Table(title=f"by SLO class{which} (each request held to its class's limits, else its model's)",
                  title_justify="left")
    for name in ("class", "requests", "completed", "SLO attainment", "TTFT p50 / p90 / p99 s", "E2E p50 / p90 / p99 s"):
        table.add_column(name, justify="left" if name == "class" else "right", overflow="fold")
    for label, figures in shown:
        _class_row(table, escape(label), figures)
    unclassed = summary.get("slo_unclassed")
    if unclassed:
        _class_row(table, "[italic](no class)[/]", unclassed)
    if hidden:
        requests = sum(figures["requests"] for _, figures in hidden)
        met = sum(_met(figures) for _, figures in hidden)
        table.caption = (f"{len(hidden):,} more classes not shown ({requests:,} requests, {met:,} of them meeting "
                         "their SLO); summary.json's per_slo_class has every class")
        table.caption_justify = "left"
    return table


SWAPPING_POLICIES = frozenset({"fcfs-swap", "time-slice", "swap-aware", "offload-aware", "prefix-swap-aware"})
"""The built-in policies that load and unload models themselves (placement an autoscaler would also set)."""


def warnings(summary: dict, by_model: dict[str, dict[str, int]]) -> list[str]:
    """Plain sentences for what makes the scenario unservable on this profile and load, worst first."""
    found = [] if summary.get("requests_total") else [no_requests(summary.get("trace_rows"))]
    per_model = summary.get("per_model") or {}
    for model, reasons in by_model.items():
        total = (per_model.get(model) or {}).get("requests") or 0
        too_long = reasons.get("exceeds_max_model_len", 0)
        if too_long and total:
            limit = (per_model.get(model) or {}).get("max_model_len")
            limit_text = f"max_model_len {limit:,} tokens" if isinstance(limit, (int, float)) else "max_model_len"
            found.append(f"{model}: {_share(too_long / total)} of requests exceed {limit_text} (prompt + output); "
                         "raise the model's max_model_len in the scenario if its GPU has room, or use GPUs with more memory")
        too_long_there = reasons.get("exceeds_instance_max_model_len", 0)
        if too_long_there:
            found.append(f"{model}: {counted(too_long_there, 'request')} within the deployment's max_model_len (sized "
                         "on the largest GPU) but not the KV room of the instance given them, on a smaller GPU; "
                         "route them to the larger GPUs (e.g. a policy file's route hook) or place the model there")
        if reasons.get("model_exceeds_gpu"):
            found.append(f"{model}: its weights and activation reserve (which grows with engine.max_num_batched_tokens) "
                         f"leave no KV room on any GPU of profile {summary.get('profile', '?')}; "
                         f"{reasons['model_exceeds_gpu']:,} requests dropped (lower max_num_batched_tokens, raise "
                         "gpu_memory_utilization, or use GPUs with more memory or a smaller dtype)")
        waited = reasons.get("not_scheduled", 0)
        if waited and not (per_model.get(model) or {}).get("completed"):
            # not_scheduled: the model held an instance, so "no GPU" would be wrong; what it lacked was KV room
            # (often a deployment pinned to the same GPUs) or turns on the GPU.
            found.append(f"{model}: no request ever ran under policy {summary.get('policy')} ({waited:,} waited to "
                         "the end): its instance never had the KV room or the GPU time to start one, e.g. beside "
                         "another deployment on its GPUs (a swapping policy such as swap-aware serves every model)")
        unplaced = reasons.get("model_not_served", 0) + reasons.get("not_placed", 0)
        fleet = summary.get("fleet") or {}
        if unplaced and fleet.get("autoscaler", "none") != "none" and fleet.get("scale_blocked"):
            # Under an autoscaler the pools' size, not the policy, decides who gets a GPU.
            found.append(f"{model}: never given a GPU, {counted(unplaced, 'request')} dropped; the autoscaler "
                         f"{fleet['autoscaler']} was blocked {counted(fleet['scale_blocked'], 'time')} (no free GPU and "
                         "every pool at max_nodes): raise max_nodes, or see the events' scale_blocked rows")
        elif unplaced:
            found.append(f"{model}: policy {summary.get('policy')} gave it no GPU; {unplaced:,} requests dropped "
                         "(a swapping policy such as swap-aware serves every model)")
    # Models that never ran are named above; the backlog is what served models left waiting.
    waiting = sum(reasons.get("not_scheduled", 0) for model, reasons in by_model.items()
                  if (per_model.get(model) or {}).get("completed"))
    total = summary.get("requests_total") or 0
    if total and waiting / total > BACKLOG_SHARE:
        found.append(f"{waiting:,} requests ({waiting / total:.0%}) were still waiting when the run ended: more load "
                     "than this cluster serves under this policy, or requests it left where they cannot start")
    scaler = (summary.get("fleet") or {}).get("autoscaler", "none")
    if scaler != "none" and summary.get("policy") in SWAPPING_POLICIES:
        found.append(f"the autoscaler {scaler} sets each model's replicas, and policy {summary.get('policy')} loads and "
                     "unloads models on its own: they fight over the GPUs; combine autoscalers with static or "
                     "slo-aware (docs/fleet.md)")
    attainment = summary.get("slo_attainment")
    unfit = sum(reasons.get("model_exceeds_gpu", 0) for reasons in by_model.values())
    if attainment is not None and attainment < LOW_ATTAINMENT and unfit < total:  # else the cause is named above
        found.append(f"SLO attainment is {attainment:.1%}: profile {summary.get('profile', '?')} cannot meet the "
                     "scenario's SLOs at this load (lower the arrival rate, add GPUs or relax the SLOs)")
    return found


def no_requests(trace_rows: dict | None) -> str:
    """Why a run may have had no request at all, from its trace's row counts (None: a generator made the requests):
    a run of nothing succeeds with every figure 0, which reads as a result unless it is said."""
    if trace_rows is None:
        why = ("its arrivals start none within duration_s (rate-series windows that all start after duration_s or "
               "all have rate 0, or a servegen file whose windows are all idle)")
    elif not trace_rows.get("rows_read"):
        why = "the trace file holds no rows (a header only, or an empty file)"
    elif trace_rows.get("skipped_malformed") == trace_rows.get("rows_read"):
        why = f"every one of the trace's {counted(trace_rows['rows_read'], 'row')} was malformed (skipped by skip_bad)"
    else:
        why = (f"none of the trace's {counted(trace_rows['rows_read'], 'row')} falls in the window: start_s past the "
               "trace's end, or end_s before its first request (both in seconds from the trace's start)")
    return f"the workload gave no requests, so every figure is 0: {why}"


def next_command(summary: dict, scenario_path: Path, profile: str | None = None, autoscaler: str | None = None,
                 seed: int | None = None) -> str:
    """The ``mmsim compare`` that puts this run's policy beside two others (on three seeds, from this run's seed,
    unless a trace fixes the requests whatever the seed), on its profile and autoscaler (the run's overrides),
    quoted for a POSIX shell."""
    policy = str(summary.get("policy"))
    others = [p for p in FOLLOW_UPS if p != policy][:2]
    words = ["mmsim", "compare", str(scenario_path), "--policies", ",".join([policy, *others])]
    if summary.get("trace_rows") is None:
        words += ["--seeds", "3"]
    for flag, value in (("--seed", seed), ("--profile", profile), ("--autoscaler", autoscaler)):
        if value is not None:
            words += [flag, str(value)]
    return shlex.join(words)


def print_run_summary(console: Console, summary: dict, requests: pd.DataFrame | None, scenario_path: Path,
                      out_dir: Path, next_step: str | None = None) -> None:
    """Everything ``mmsim run`` prints after the progress bar, ending with the next command to try (``next_step``,
    else :func:`next_command` of the summary)."""
    console.print(summary_table(summary))
    by_model = drops_by_model(summary, requests)
    for table in (drops_table(summary, by_model), prefix_table(summary), slo_class_table(summary)):
        if table is not None:
            console.print(table)
    for sentence in warnings(summary, by_model):
        console.print(f"[bold yellow]warning:[/] {escape(sentence)}", highlight=False)
    console.print(f"results: [bold]{escape(str(out_dir))}[/]", soft_wrap=True, highlight=False)
    console.print(f"next: [bold]{escape(next_step or next_command(summary, scenario_path))}[/]", soft_wrap=True,
                  highlight=False)
