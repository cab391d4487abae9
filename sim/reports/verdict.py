"""The verdict: policies ranked on goodput, then SLO attainment (dropped requests count as misses in both), told in
one short paragraph for the page or the terminal, and the compact ranking table ``compare`` prints."""

from __future__ import annotations

from html import escape
from typing import Callable

from sim.reports.data import RunData
from sim.reports.metrics import DROP_THRESHOLD, GOODPUT, SLO, TPOT_P90, TTFT_P90, Column, drops, estimate, fmt_value
from sim.reports.stats import MIN_SEEDS, Estimate, no_interval_text, overlap


def html_strong(name: str) -> str:
    """A policy name in bold on the HTML page."""
    return f"<b>{escape(name)}</b>"


def ranking(groups: dict[str, list[RunData]]) -> list[str]:
    """Policies best first: by mean goodput, ties broken by mean SLO attainment."""
    def key(policy: str) -> tuple[float, float]:
        good, slo = estimate(GOODPUT, groups[policy]).mean, estimate(SLO, groups[policy]).mean
        return (-(good if good is not None else -1.0), -(slo if slo is not None else -1.0))
    return sorted(groups, key=key)


def seeds_agree(groups: dict[str, list[RunData]]) -> bool:
    """Whether the seeds gave each policy the same goodput and SLO attainment (a trace replays the same requests
    whatever the seed): then an interval over them has no width and says nothing about a lead."""
    return all(len({col.read(run.summary) for run in runs}) == 1 for runs in groups.values() for col in (GOODPUT, SLO)
               if len(runs) >= MIN_SEEDS)


def _significance(lead: Estimate, runner: Estimate, agree: bool) -> str:
    if agree:
        return ""
    apart = overlap(lead, runner)
    if apart is None:
        return ""
    return "; the 95% intervals overlap, so the lead is not significant" if apart else "; beyond the 95% intervals"


def _lead(groups: dict[str, list[RunData]], col: Column, strong: Callable[[str], str],
          agree: bool = False) -> tuple[str, str]:
    """The leader on one column and the text of its lead over the runner-up."""
    estimates = {p: estimate(col, runs) for p, runs in groups.items()}
    means = {p: e.mean for p, e in estimates.items() if e.mean is not None}
    ranked = sorted(means, key=lambda p: -means[p])
    if not ranked:
        return "", "no figure"
    winner = ranked[0]
    mean = means[winner]
    text = fmt_value(col, mean) + (" req/s" if col is GOODPUT else "")
    if len(ranked) > 1:
        runner = ranked[1]
        other = means[runner]
        if mean == other:
            tied = [p for p in ranked[1:] if means[p] == mean]
            return winner, text + ", tied with " + ", ".join(strong(p) for p in tied)
        if col is GOODPUT:
            relative = f" ({100 * (mean - other) / other:+.1f}%)" if other else ""
            text += f", {mean - other:+.3f} req/s{relative} over {strong(runner)}"
        else:
            text += f", {100 * (mean - other):+.1f} points over {strong(runner)}"
        text += _significance(estimates[winner], estimates[runner], agree)
    return winner, text


def _drops_sentence(groups: dict[str, list[RunData]], threshold: float, strong: Callable[[str], str]) -> str:
    """Which policies dropped more than ``threshold``, and what that does to their latency figures."""
    over = {p: drops(runs).share for p, runs in groups.items() if drops(runs).share > threshold}
    limit = f"{threshold:.0%}" if threshold >= 0.01 else f"{threshold:.1%}"
    if not over:
        return ""
    if len(over) == 1:
        (policy, share), = over.items()
        return (f" {strong(policy)} dropped {share:.1%} of its requests (more than {limit}): its latency figures "
                "cover only the requests it served and are never marked best (reasons in the table).")
    listed = ", ".join(f"{strong(p)} {share:.1%}" for p, share in over.items())
    if len(over) == len(groups):
        return (f" Every policy dropped more than {limit} of its requests ({listed}): no latency figure is marked "
                "best (reasons in the table).")
    return (f" Some policies dropped more than {limit} of their requests ({listed}): their latency figures cover "
            "only the requests they served and are never marked best (reasons in the table).")


def verdict(groups: dict[str, list[RunData]], threshold: float = DROP_THRESHOLD,
            strong: Callable[[str], str] = html_strong) -> str:
    """A few sentences: the best policy on goodput and on SLO attainment with the margin over the runner-up,
    how drops were counted, which policies dropped more than ``threshold``, and whether intervals exist."""
    if not groups:
        return "No runs to compare."
    seeds = min(len(runs) for runs in groups.values())
    agree = seeds >= MIN_SEEDS and seeds_agree(groups)
    good_winner, good = _lead(groups, GOODPUT, strong, agree)
    slo_winner, slo = _lead(groups, SLO, strong, agree)
    if len(groups) == 1:
        sentence = f"Only one policy, {strong(good_winner)}, was run: goodput {good}, SLO attainment {slo}."
    elif good_winner == slo_winner:
        sentence = f"{strong(good_winner)} is best on goodput ({good}) and on SLO attainment ({slo})."
    else:
        sentence = (f"{strong(good_winner)} has the best goodput ({good}); "
                    f"{strong(slo_winner)} has the best SLO attainment ({slo}).")
    sentence += " Both count every request, dropped ones as misses."
    sentence += _drops_sentence(groups, threshold, strong)
    if agree:
        sentence += (f" The {seeds} seeds gave every policy the same figures (a trace replays the same requests "
                     "whatever the seed), so they tell nothing of how far a lead would hold on other traffic.")
    elif seeds < MIN_SEEDS:
        sentence += (f" {no_interval_text(seeds)}: run with --seeds {MIN_SEEDS} or more to know whether a lead is "
                     "significant.")
    return sentence


def ranking_rows(groups: dict[str, list[RunData]], threshold: float = DROP_THRESHOLD) -> list[list[str]]:
    """One row per policy, best first: rank, policy, goodput, SLO attainment, completed / dropped, TTFT p90, TPOT p90
    (latencies of a policy that dropped more than ``threshold`` carry a dagger)."""
    rows = []
    for rank, policy in enumerate(ranking(groups), 1):
        runs = groups[policy]
        counted = drops(runs)
        mark = " †" if counted.share > threshold else ""
        rows.append([str(rank), policy, fmt_value(GOODPUT, estimate(GOODPUT, runs).mean),
                     fmt_value(SLO, estimate(SLO, runs).mean), f"{counted.per_run()} ({counted.share:.1%})",
                     fmt_value(TTFT_P90, estimate(TTFT_P90, runs).mean) + mark,
                     fmt_value(TPOT_P90, estimate(TPOT_P90, runs).mean) + mark])
    return rows
