"""The prefix-cache section of a report: hit rate over time, TTFT with and without a cache hit, and each
instance's hit rate.

Shown only when some run found prompt tokens in a prefix cache. The hit rate of
a time bin is the share of prompt tokens, of requests first scheduled in that
bin, that their first prefill found cached (requests' ``cached_prompt_tokens``);
an instance's is over every admission (``per_instance`` in summary.json).
"""

from __future__ import annotations

import warnings
from html import escape

import numpy as np

from sim.reports.data import RunData
from sim.reports.svg import figure, to_svg

TIME_BINS = 60
PANEL = (4.4, 3.0)


def has_cache_hits(groups: dict[str, list[RunData]]) -> bool:
    return any("cached_prompt_tokens" in r.requests and r.requests["cached_prompt_tokens"].sum() > 0
               for runs in groups.values() for r in runs)


def _edges(groups: dict[str, list[RunData]]) -> np.ndarray:
    end = max((float(r.requests["first_scheduled_s"].max()) for runs in groups.values() for r in runs
               if r.requests["first_scheduled_s"].notna().any()), default=0.0)
    return np.linspace(0.0, max(end, 1e-6), TIME_BINS + 1)


def _hit_rate(run: RunData, edges: np.ndarray) -> np.ndarray:
    started = run.requests[run.requests["first_scheduled_s"].notna()]
    at = started["first_scheduled_s"].to_numpy(float)
    cached, _ = np.histogram(at, bins=edges, weights=started["cached_prompt_tokens"].to_numpy(float))
    prompt, _ = np.histogram(at, bins=edges, weights=started["prompt_tokens"].to_numpy(float))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(prompt > 0, cached / prompt, np.nan)


def hit_rate_panel(groups: dict[str, list[RunData]], colours: dict[str, str]) -> str:
    """Prefix-cache hit rate over time, one line per policy (mean over seeds)."""
    edges = _edges(groups)
    centres = (edges[:-1] + edges[1:]) / 2
    fig, axes = figure(*PANEL)
    ax = axes[0][0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # bins where no seed started a request stay NaN
        for policy, runs in groups.items():
            rate = np.nanmean([_hit_rate(r, edges) for r in runs], axis=0)
            shown = np.isfinite(rate)
            ax.plot(centres[shown], 100 * rate[shown], color=colours[policy], lw=1.2, label=policy)
    ax.set_ylim(0, 100)
    ax.set_xlim(0, edges[-1])
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("prompt tokens from cache (%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return to_svg(fig)


def ttft_by_hit(run_groups: dict[str, list[RunData]]) -> dict[str, tuple[float, float, int, int]]:
    """Per policy: mean TTFT of completed requests whose first prefill found cached tokens, of those that did
    not, and how many of each (seeds pooled)."""
    out = {}
    for policy, runs in run_groups.items():
        hit_ttft, miss_ttft = [], []
        for r in runs:
            done = r.requests[r.requests["status"].eq("completed")]
            hit = done["cached_prompt_tokens"].to_numpy() > 0
            hit_ttft.append(done["ttft_s"].to_numpy(float)[hit])
            miss_ttft.append(done["ttft_s"].to_numpy(float)[~hit])
        hits, misses = np.concatenate(hit_ttft), np.concatenate(miss_ttft)
        out[policy] = (float(hits.mean()) if len(hits) else float("nan"),
                       float(misses.mean()) if len(misses) else float("nan"), len(hits), len(misses))
    return out


def ttft_panel(groups: dict[str, list[RunData]], colours: dict[str, str]) -> str:
    """Mean TTFT with and without a cache hit, a pair of bars per policy."""
    table = ttft_by_hit(groups)
    fig, axes = figure(*PANEL)
    ax = axes[0][0]
    x = np.arange(len(table))
    for k, (policy, (hit, miss, _, _)) in enumerate(table.items()):
        ax.bar(x[k] - 0.2, 0 if np.isnan(miss) else miss, 0.38, color=colours[policy], alpha=0.45)
        ax.bar(x[k] + 0.2, 0 if np.isnan(hit) else hit, 0.38, color=colours[policy])
    ax.set_xticks(x, list(table), fontsize=8)
    ax.set_ylabel("mean TTFT (s)")
    ax.set_title("pale: no cache hit; solid: cache hit", fontsize=8, loc="left")
    fig.tight_layout()
    return to_svg(fig)


def caption(groups: dict[str, list[RunData]]) -> str:
    parts = []
    for policy, (hit, miss, hits, misses) in ttft_by_hit(groups).items():
        if hits and misses:
            change = f", {100 * (1 - hit / miss):.0f}% lower" if 0 < hit < miss else ""
            parts.append(f"{policy}: {hit:.3g} s with a hit ({hits:,} requests) vs {miss:.3g} s without ({misses:,}){change}")
    return ("Share of prompt tokens that requests first scheduled in each time bin found in a prefix cache, and "
            "mean TTFT of completed requests with and without such a hit"
            + (": " + "; ".join(parts) if parts else "")
            + "." + (" The table: each instance's prompt tokens looked up at every admission and found cached (first "
                     "seed of each policy)." if instance_table(groups) else ""))


def instance_table(groups: dict[str, list[RunData]]) -> str:
    """Each instance that looked prompt tokens up, per policy (its first seed: instances differ between seeds):
    tokens looked up at every admission, those found (prefill tokens saved) and their share."""
    rows = []
    for policy, runs in groups.items():
        for item in runs[0].summary.get("per_instance") or []:  # runs written before it existed have none
            if not item["prefix_queried_tokens"]:
                continue
            label = "unloaded ones" if item["instance"] is None else f"#{item['instance']}"
            gpus = ", ".join(str(g) for g in item["gpus"]) or "–"
            cells = [policy, label, item["model"], gpus, f"{item['prefix_queried_tokens']:,}",
                     f"{item['prefix_hit_tokens']:,}", f"{item['prefix_hit_rate']:.1%}"]
            rows.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    if not rows:
        return ""
    head = "".join(f"<th>{h}</th>" for h in ("Policy", "Instance", "Model", "GPU", "Prompt tokens looked up",
                                              "Found cached (prefill saved)", "Hit rate"))
    return (f'<div class="table-wrap prefix-instances"><table><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table></div>")
