"""The fleet section of a report: GPUs billed and money spent over time, and each run's cost figures.

GPUs billed start from each pool's nodes at time 0 (``fleet.pools`` in summary.json) and change at every
``billing`` event (a node provisioned or released); the cost to date integrates them at each pool's price.
Shown whenever the runs carry fleet figures, i.e. every run of this version.
"""

from __future__ import annotations

from html import escape

import numpy as np

from sim.reports.data import RunData
from sim.reports.svg import figure, to_svg
from sim.reports.validate import billing_fields

PANEL = (4.4, 3.0)


def has_fleet(groups: dict[str, list[RunData]]) -> bool:
    return all(r.summary.get("fleet") for runs in groups.values() for r in runs)


def billed_gpus(run: RunData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(times, GPUs billed from each time on, US$ per hour from each time on): a step function from 0 to the
    run's end."""
    pools = run.summary["fleet"]["pools"]
    gpus = {name: pool["nodes_at_start"] * pool["gpus_per_node"] for name, pool in pools.items()}
    price = {name: pool["price_per_gpu_hour"] for name, pool in pools.items()}
    times, counts, rates = [0.0], [sum(gpus.values())], [sum(gpus[n] * price[n] for n in gpus)]
    events = run.events[run.events["kind"] == "billing"]
    for at, detail in zip(events["time_s"].to_numpy(float), events["detail"]):
        fields = billing_fields(detail)  # load_run checked each names a pool and a whole number of GPUs
        gpus[fields["pool"]] += int(fields["gpus"])
        times.append(at)
        counts.append(sum(gpus.values()))
        rates.append(sum(gpus[n] * price[n] for n in gpus))
    times.append(float(run.summary.get("simulated_seconds", times[-1])))
    counts.append(counts[-1])
    rates.append(rates[-1])
    return np.array(times), np.array(counts), np.array(rates)


def cost_to_date(times: np.ndarray, rates: np.ndarray) -> np.ndarray:
    """US$ spent by each time of a step function of US$ per hour."""
    return np.concatenate([[0.0], np.cumsum(rates[:-1] * np.diff(times) / 3600)])


def panels(groups: dict[str, list[RunData]], colours: dict[str, str]) -> list[str]:
    """GPUs billed over time and cost to date, one line per policy (its first seed)."""
    out = []
    for ylabel in ("GPUs billed", "US$ spent to date"):
        fig, axes = figure(*PANEL)
        ax = axes[0][0]
        for label, runs in groups.items():
            times, counts, rates = billed_gpus(runs[0])
            if ylabel == "GPUs billed":
                ax.step(times, counts, where="post", color=colours[label], lw=1.2, label=label)
            else:  # piecewise linear: straight between the moments the hourly rate changes
                ax.plot(times, cost_to_date(times, rates), color=colours[label], lw=1.2, label=label)
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
        fig.tight_layout()
        out.append(to_svg(fig))
    return out


def table(groups: dict[str, list[RunData]]) -> str:
    """Each policy's cost figures, the mean over its seeds."""
    heads = ("Policy", "GPU-hours", "Cost (US$)", "US$ per 1k requests", "US$ per M output tokens", "Busy share of billed",
             "Cold starts", "Peak nodes")
    rows = []
    for label, runs in groups.items():
        fleets = [r.summary["fleet"] for r in runs]

        def mean(key: str) -> float:
            values = [f[key] for f in fleets if f.get(key) is not None]
            return float(np.mean(values)) if values else float("nan")

        peak = max(sum(pool["nodes_peak"] for pool in f["pools"].values()) for f in fleets)
        cells = [label, f"{mean('gpu_hours'):.2f}", f"{mean('cost_usd'):.2f}", f"{mean('cost_per_1k_requests_usd'):.4f}",
                 f"{mean('cost_per_million_output_tokens_usd'):.3f}", f"{mean('busy_share_of_billed'):.1%}",
                 f"{mean('cold_starts'):.0f}", str(peak)]
        rows.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in heads)
    return f'<div class="table-wrap fleet-cost"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'


def caption(groups: dict[str, list[RunData]]) -> str:
    prices = {name: pool["price_per_gpu_hour"] for runs in groups.values() for r in runs[:1]
              for name, pool in r.summary["fleet"]["pools"].items()}
    listed = ", ".join(f"{name} ${price:.2f}" for name, price in prices.items())
    return ("GPUs billed over time (each node from its provisioning to its release) and the money spent by then, "
            f"first seed of each policy; per GPU-hour: {listed}. The table: means over seeds; cost per request "
            "counts completed requests only.")
