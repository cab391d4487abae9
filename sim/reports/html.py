"""Assemble the comparison report: verdict, summary table, plots and provenance in one self-contained HTML file."""

from __future__ import annotations

import datetime
import json
from html import escape
from pathlib import Path

import yaml

from sim.reports import plots, timelines
from sim.reports.data import RunData, by_policy, model_names
from sim.reports.page import CSS, SORT_JS
from sim.reports.svg import MODEL_COLOURS, POLICY_COLOURS, colour_map
from sim.reports.tables import summary_table, verdict
from sim.results import atomic_write

SECTIONS = (("verdict", "Verdict"), ("summary", "Summary"), ("plots", "Plots"), ("reproduce", "Reproduce"))


def _figure(svg: str, title: str, caption: str) -> str:
    return f'<figure><h3>{escape(title)}</h3>{svg}<figcaption>{escape(caption)}</figcaption></figure>'


def _plots(groups: dict[str, list[RunData]], models: list[str], colours: dict, model_colours: dict) -> str:
    figures = [
        _figure(plots.latency_cdfs(groups, colours), "Latency CDFs",
                "Share of completed requests at or below each latency; all seeds pooled. Further left is better."),
        _figure(plots.slo_per_model(groups, models, colours), "SLO attainment per model",
                "Share of requests (dropped ones count as misses) meeting every SLO of their model; whiskers: 95% CI over seeds."),
        _figure(plots.throughput_and_queue(groups, colours), "Throughput and queue depth over time",
                "Output tokens completed per second and requests waiting (in model queues and instance queues), mean over seeds."),
        _figure(timelines.memory_stacked(groups, models, model_colours), "GPU memory by model",
                "Weights plus KV cache of each model, summed over all GPUs (first seed of each policy)."),
        _figure(timelines.residency_timeline(groups, models, model_colours), "Model residency per GPU",
                "Which model is loaded on which GPU (one lane per model); hatched: loading or unloading; "
                "marks: KV swaps and recompute preemptions (first seed)."),
        _figure(plots.overhead_bars(groups), "Where the overhead goes",
                "Request-seconds lost to weight reloads, unloads, KV transfers (swap out + in) and recomputation, "
                "mean over seeds: the split that decides which preemption mode pays off."),
    ]
    return '<div class="grid">' + "".join(figures) + "</div>"


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
    seed_text = ", ".join(str(s) for s in seeds)
    command = f"mmsim compare scenarios/{name}.yaml --policies {','.join(groups)} --seeds {len(seeds)}"
    folders = [str(r.path) for r in runs if r.path is not None]
    facts = [("Scenario", escape(str(name))), ("Profile", escape(str(first.summary.get("profile", "?")))),
             ("Seeds", escape(seed_text)), ("Mode", escape(str(first.summary.get("mode", "?")))),
             ("Requests per run", escape(", ".join(sorted({str(r.summary.get("requests_total")) for r in runs}))))]
    body = "<dl class=\"facts\">" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>"
    body += (f'<h3>Command</h3><pre>{escape(command)}</pre><p class="note">Seeds run from the scenario\'s '
             f"<code>seed</code> upward (<code>--seeds N</code> runs seed … seed+N−1).</p>")
    body += "<h3>Profile provenance</h3>" + _provenance(runs)
    if first.scenario is not None:
        scenario_text = yaml.safe_dump(json.loads(json.dumps(first.scenario, default=str)), sort_keys=False)
        body += f"<details><summary>Scenario as run</summary><pre>{escape(scenario_text)}</pre></details>"
    if folders:
        body += ("<details><summary>Run folders</summary><pre>" + escape("\n".join(folders)) + "</pre></details>")
    return body


def render(runs: list[RunData], title: str | None = None) -> str:
    """The whole report page as a string."""
    groups = by_policy(runs)
    models = model_names(runs)
    colours = colour_map(list(groups), POLICY_COLOURS)
    model_colours = colour_map(models, MODEL_COLOURS)
    scenario = str(runs[0].summary.get("scenario", "scenario"))
    title = title or f"{scenario}: policy comparison"
    seeds = sorted({r.seed for r in runs})
    legend = "".join(f'<span><span class="chip" style="background:{c}"></span>{escape(p)}</span>' for p, c in colours.items())
    nav = "".join(f'<a href="#{key}">{label}</a>' for key, label in SECTIONS)
    ci_note = ("Cells show the mean over seeds ± the 95% confidence half-width (Student's t)."
               if len(seeds) > 1 else "One seed per policy: run with --seeds N for confidence intervals.")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    sections = [
        ("verdict", f'<p class="verdict">{verdict(groups)}</p><div class="legend">{legend}</div>'),
        ("summary", summary_table(groups, models, colours) +
         f'<p class="note">{ci_note} Best value per column in green (↑ higher is better, ↓ lower is better); '
         "click a header to sort. Latency percentiles cover completed requests; SLO attainment counts dropped "
         "requests as misses. Seconds lost are summed over requests.</p>"),
        ("plots", _plots(groups, models, colours, model_colours)),
        ("reproduce", _reproduce(groups, runs)),
    ]
    body = "".join(f'<section id="{key}"><h2>{label}</h2>{html}</section>'
                   for (key, label), (_, html) in zip(SECTIONS, sections))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
            f'<header><div class="wrap"><h1>{escape(title)}</h1><p>{len(groups)} policies × {len(seeds)} seed'
            f'{"s" if len(seeds) != 1 else ""} · profile {escape(str(runs[0].summary.get("profile", "?")))}'
            f" · generated {stamp} by mmsim</p></div></header>"
            f'<nav><div class="wrap">{nav}</div></nav><main class="wrap">{body}</main>'
            '<footer>mmsim policy-comparison report · self-contained, works offline</footer>'
            f"<script>{SORT_JS}</script></body></html>\n")


def build_report(runs: list[RunData], out: Path, title: str | None = None) -> Path:
    """Render the report for ``runs`` and write it atomically to ``out``."""
    from sim.errors import MmsimError

    if not runs:
        raise MmsimError("no runs to report on")
    text = render(runs, title)
    out = Path(out)
    atomic_write(out, lambda path: Path(path).write_text(text, encoding="utf-8"))
    out.chmod(0o644)  # the temporary file behind atomic_write is private; a report is meant to be shared
    return out
