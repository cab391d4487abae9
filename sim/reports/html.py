"""Assemble the comparison report: verdict, summary tables, plots and provenance in one self-contained HTML file.
Only comparable runs are ranked together; ``allow_mixed`` shows each comparable group on its own instead."""

from __future__ import annotations

import datetime
import json
from html import escape
from pathlib import Path

import yaml

from sim.errors import MmsimError
from sim.reports import fleet, plots, prefix, slo_classes, timelines
from sim.reports.comparable import check_comparable, check_unique, comparable_groups
from sim.reports.data import RunData, by_policy, model_names
from sim.reports.metrics import DROP_THRESHOLD
from sim.reports.page import CSS, SORT_JS
from sim.reports.stats import MIN_SEEDS, no_interval_text
from sim.reports.colours import MODEL_COLOURS, colour_map, policy_colours
from sim.reports.tables import summary_tables
from sim.reports.verdict import verdict
from sim.results import atomic_write

SECTIONS = (("verdict", "Verdict"), ("summary", "Summary"), ("plots", "Plots"), ("reproduce", "Reproduce"))


def _figure(title: str, body: str, caption: str) -> str:
    return f'<figure><h3>{escape(title)}</h3>{body}<figcaption>{escape(caption)}</figcaption></figure>'


def _panels(svgs: list[str], wide: bool = False) -> str:
    klass = "panels wide-panels" if wide else "panels"
    return f'<div class="{klass}">' + "".join(f'<div class="panel">{svg}</div>' for svg in svgs) + "</div>"


def _wide(svg: str) -> str:
    return f'<div class="wide">{svg}</div>'


def _chips(colours: dict[str, str]) -> str:
    return ('<div class="legend">' + "".join(f'<span><span class="chip" style="background:{c}"></span>{escape(n)}</span>'
                                             for n, c in colours.items()) + "</div>")


def _seeds_text(groups: dict[str, list[RunData]]) -> str:
    """``one seed`` / ``mean over 3 seeds`` / ``mean over 2–3 seeds``: what a time series shows."""
    counts = sorted({len(runs) for runs in groups.values()})
    if counts == [1]:
        return "one seed"
    span = str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"
    return f"mean over {span} seeds"


def _interval_caption(groups: dict[str, list[RunData]]) -> str:
    fewest = min(len(runs) for runs in groups.values())
    if fewest >= MIN_SEEDS:
        return "whiskers: 95% Wilson interval over seeds"
    return f"{no_interval_text(fewest)} (whiskers need {MIN_SEEDS} or more seeds)"


def _plots(groups: dict[str, list[RunData]], models: list[str], colours: dict, model_colours: dict) -> str:
    seeds = _seeds_text(groups)
    several = any(len(runs) > 1 for runs in groups.values())
    pooled = "seeds pooled" if several else "one seed"
    first = "first seed of each policy" if several else "one seed"
    return "".join([
        _figure("Latency CDFs", _panels(plots.latency_cdfs(groups, colours)),
                f"Share of completed requests at or below each latency ({pooled}); the legend gives the share "
                "of requests each policy served (dropped ones have no latency). Further left is better."),
        _figure("SLO attainment per model", _wide(plots.slo_per_model(groups, models, colours)),
                "Share of requests (dropped ones count as misses) meeting every limit they are held to: "
                + ("their SLO class's, each one the class leaves unset (or a class the scenario does not name) their "
                   "model's (by class: the summary's last table); " if slo_classes.has_classes(groups)
                   else "their model's SLO; ")
                + (f"{seeds}; " if several else "") + f"{_interval_caption(groups)}."),
        _figure("Throughput and queue depth over time", _panels(plots.throughput_panels(groups, colours)),
                f"One panel per policy, same axes: output tokens completed per second (moving average over "
                f"{plots.SMOOTH_BINS} of {plots.TIME_BINS} time bins) and requests waiting, {seeds}"
                + ("; shaded: range over seeds." if several else ".")),
        _figure("GPU memory by model", _chips(model_colours) + _panels(timelines.memory_stacked(groups, models,
                                                                                               model_colours)),
                f"Weights plus KV cache of each model, summed over all GPUs; one panel per policy, same axes "
                f"({first})."),
        _figure("Model residency per GPU", _chips(model_colours) + _panels(
            timelines.residency_timeline(groups, models, model_colours), wide=True),
                "Which model is loaded on which GPU (one lane per model); hatched: loading or unloading; "
                f"marks: KV swaps and recompute preemptions ({first})."),
        _figure("Where the overhead goes", _wide(plots.overhead_bars(groups)),
                f"Request-seconds lost to weight reloads, unloads, KV transfers (swap out + in) and recomputation, "
                f"{seeds}: the split that decides which preemption mode pays off."),
        _prefix_cache(groups, colours),
        _fleet(groups, colours),
    ])


def _prefix_cache(groups: dict[str, list[RunData]], colours: dict) -> str:
    if not prefix.has_cache_hits(groups):
        return ""
    panels = _panels([prefix.hit_rate_panel(groups, colours), prefix.ttft_panel(groups, colours)])
    return _figure("Prefix cache", panels + prefix.instance_table(groups), prefix.caption(groups))


def _fleet(groups: dict[str, list[RunData]], colours: dict) -> str:
    if not fleet.has_fleet(groups):
        return ""
    return _figure("Fleet and cost", _panels(fleet.panels(groups, colours)) + fleet.table(groups), fleet.caption(groups))


def _provenance(runs: list[RunData]) -> str:
    provenance = runs[0].summary.get("provenance") or {}
    if not provenance:
        return '<p class="note">The runs recorded no profile provenance.</p>'
    counts: dict[str, int] = {}
    for source in provenance.values():
        counts[str(source)] = counts.get(str(source), 0) + 1
    badges = "".join(f'<span class="prov prov-{escape(k)}">{escape(k)}: {n}</span>' for k, n in sorted(counts.items()))
    rows = "".join(f'<tr><td style="text-align:left"><code>{escape(k)}</code></td>'
                   f'<td style="text-align:left"><span class="prov prov-{escape(str(v))}">{escape(str(v))}</span></td></tr>'
                   for k, v in provenance.items())
    return (f"<div>{badges}</div><details><summary>Every profile number and its source</summary>"
            f'<div class="table-wrap"><table><tbody>{rows}</tbody></table></div></details>')


def _reproduce(groups: dict[str, list[RunData]], runs: list[RunData]) -> str:
    first = runs[0]
    seeds = sorted({r.seed for r in runs})
    name = first.summary.get("scenario", "scenario")
    command = f"mmsim compare scenarios/{name}.yaml --policies {','.join(groups)} --seeds {len(seeds)}"
    folders = [str(r.path) for r in runs if r.path is not None]
    facts = [("Scenario", name), ("Profile", first.summary.get("profile", "?")),
             ("Engine build", first.summary.get("engine_build", "?")), ("Seeds", ", ".join(str(s) for s in seeds)),
             ("Mode", first.summary.get("mode", "?")),
             ("Requests per run", ", ".join(sorted({str(r.summary.get("requests_total")) for r in runs})))]
    body = '<dl class="facts">' + "".join(f"<dt>{k}</dt><dd>{escape(str(v))}</dd>" for k, v in facts) + "</dl>"
    body += (f'<h3>Command</h3><pre>{escape(command)}</pre><p class="note">Seeds run from the scenario\'s '
             f"<code>seed</code> upward (<code>--seeds N</code> runs seed … seed+N−1).</p>")
    body += "<h3>Profile provenance</h3>" + _provenance(runs)
    if first.scenario is not None:
        scenario_text = yaml.safe_dump(json.loads(json.dumps(first.scenario, default=str)), sort_keys=False)
        body += f"<details><summary>Scenario as run</summary><pre>{escape(scenario_text)}</pre></details>"
    if folders:
        body += "<details><summary>Run folders</summary><pre>" + escape("\n".join(folders)) + "</pre></details>"
    return body


def _table_note(groups: dict[str, list[RunData]], threshold: float) -> str:
    fewest = min(len(runs) for runs in groups.values())
    if fewest >= MIN_SEEDS:
        intervals = ("Under each mean: its 95% interval over seeds (Wilson for proportions, Student's t clipped at 0 "
                     "for rates and times; see docs/reports.md).")
    else:
        intervals = f"{no_interval_text(fewest)}: intervals need {MIN_SEEDS} or more seeds (--seeds 3)."
    return (f'<p class="note">Rows best first (goodput, then SLO attainment; dropped requests count as misses). '
            f"{intervals} Best value per column in green (↑ higher is better, ↓ lower is better); click a header to "
            f"sort. Latency percentiles cover completed requests only; † marks a policy that dropped more than "
            f"{threshold:.0%} of its requests, which is never marked best on latency or overhead.</p>")


def _group_html(runs: list[RunData], threshold: float, prefix: str, heading: str) -> str:
    """The four sections (verdict, summary, plots, reproduce) for one comparable set of runs."""
    groups = by_policy(runs)
    models = model_names(runs)
    colours = policy_colours(list(groups))
    model_colours = colour_map(models, MODEL_COLOURS)
    bodies = {
        "verdict": f'<p class="verdict">{verdict(groups, threshold)}</p>' + _chips(colours),
        "summary": summary_tables(groups, models, colours, threshold, prefix) + _table_note(groups, threshold)
                   + slo_classes.table(groups, colours, prefix),
        "plots": _plots(groups, models, colours, model_colours),
        "reproduce": _reproduce(groups, runs),
    }
    return "".join(f'<section id="{prefix}{key}"><h2>{escape(heading)}{label}</h2>{bodies[key]}</section>'
                   for key, label in SECTIONS)


def render(runs: list[RunData], title: str | None = None, *, threshold: float = DROP_THRESHOLD,
           allow_mixed: bool = False) -> str:
    """The whole report page as a string; raises MmsimError for runs that must not be ranked together."""
    if not allow_mixed:
        check_comparable(runs)
    parts = comparable_groups(runs) if allow_mixed else [("", runs)]
    for _, members in parts:
        check_unique(members)
    scenario = str(runs[0].summary.get("scenario", "scenario"))
    title = title or f"{scenario}: policy comparison"
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if len(parts) == 1:
        groups = by_policy(runs)
        seeds = sorted({r.seed for r in runs})
        subtitle = (f'{len(groups)} policies × {len(seeds)} seed{"s" if len(seeds) != 1 else ""} · profile '
                    f'{escape(str(runs[0].summary.get("profile", "?")))} · engine '
                    f'{escape(str(runs[0].summary.get("engine_build", "?")))}')
        body = _group_html(runs, threshold, "", "")
        nav = "".join(f'<a href="#{key}">{label}</a>' for key, label in SECTIONS)
    else:
        subtitle = (f"mixed runs: {len(parts)} groups that differ in scenario, profile or engine build, each ranked "
                    "on its own and never against another")
        body = "".join(f'<div class="group"><h2 class="group-title">Group {i}: {escape(label)}</h2>'
                       f'{_group_html(members, threshold, f"g{i}-", f"Group {i} · ")}</div>'
                       for i, (label, members) in enumerate(parts, 1))
        nav = "".join(f'<a href="#g{i}-verdict">Group {i}</a>' for i in range(1, len(parts) + 1))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
            f'<header><div class="wrap"><h1>{escape(title)}</h1><p>{subtitle} · generated {stamp} by mmsim</p></div>'
            f'</header><nav><div class="wrap">{nav}</div></nav><main class="wrap">{body}</main>'
            '<footer>mmsim policy-comparison report · self-contained, works offline</footer>'
            f"<script>{SORT_JS}</script></body></html>\n")


def build_report(runs: list[RunData], out: Path, title: str | None = None, *, threshold: float = DROP_THRESHOLD,
                 allow_mixed: bool = False) -> Path:
    """Render the report for ``runs`` and write it atomically to ``out``."""
    if not runs:
        raise MmsimError("no runs to report on")
    text = render(runs, title, threshold=threshold, allow_mixed=allow_mixed)
    out = Path(out)
    atomic_write(out, lambda path: Path(path).write_text(text, encoding="utf-8"))
    out.chmod(0o644)  # the temporary file behind atomic_write is private; a report is meant to be shared
    return out
