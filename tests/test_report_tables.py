"""Summary tables, verdict and colours from hand-made run summaries: drops count, and never win on latency."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from sim.policies.registry import BUILTIN_MODULES, get_policy_class
from sim.reports.colours import BUILTIN_POLICY_COLOURS, EXTRA_POLICY_COLOURS, policy_colours
from sim.reports.data import RunData, by_policy
from sim.reports.tables import summary_tables
from sim.reports.verdict import ranking_rows, verdict


def make_run(policy: str, seed: int, *, good: float, slo: float, dropped: int = 0, ttft: float = 1.0,
             reasons: dict | None = None, total: int = 1000) -> RunData:
    """A run with only a summary: all the tables and the verdict read."""
    summary = {
        "scenario": "syn", "policy": policy, "seed": seed, "profile": "paper-rtx5000", "engine_build": "pure-python",
        "requests_total": total, "requests_completed": total - dropped, "requests_dropped": dropped,
        "drop_reasons": reasons or ({"model_not_served": dropped} if dropped else {}),
        "goodput_requests_per_s": good, "slo_attainment": slo, "throughput_tokens_per_s": 100.0,
        "throughput_requests_per_s": 1.0, "preemptions": 5,
        "ttft_s": {"p50": ttft / 2, "p90": ttft, "p99": ttft * 2}, "tpot_s": {"p50": 0.04, "p90": 0.05, "p99": 0.06},
        "e2e_s": {"p50": 5.0, "p90": 9.0, "p99": 12.0}, "queue_s": {"p50": 0.1, "p90": 0.5, "p99": 1.0},
        "lost_seconds": {"reload": 1.0, "unload": 0.5, "kv_out": 0.1, "kv_in": 0.1, "recompute": 2.0},
        "gpu_busy_share": 0.5, "mean_resident_models_per_gpu": 1.0, "per_model": {},
    }
    empty = pd.DataFrame()
    return RunData(summary, empty, empty, empty, {"name": "syn"}, Path(f"/runs/syn-{policy}-s{seed}"))


def groups_of(*runs: RunData) -> dict[str, list[RunData]]:
    return by_policy(list(runs))


def deciding_cells(html: str, policy: str) -> list[str]:
    """The <td> cells of one policy's row in the deciding table."""
    table = re.search(r'<table id="summary-table".*?</table>', html, re.S).group(0)
    row = next(r for r in re.findall(r"<tr>.*?</tr>", table, re.S) if f'data-v="{policy}"' in r)
    return re.findall(r"<td[^>]*>.*?</td>", row, re.S)


# A drops 20% and is fastest on what it kept; C drops 0.5% (under the 1% threshold); B drops nothing.
RUNS = (make_run("A", 1, good=2.0, slo=0.70, dropped=200, ttft=0.5),
        make_run("B", 1, good=1.5, slo=0.80, ttft=1.0),
        make_run("C", 1, good=1.0, slo=0.75, dropped=5, ttft=0.8))
TTFT = 3  # goodput, SLO attainment, completed / dropped, TTFT p90, TPOT p90


def test_a_dropping_policy_is_never_best_on_latency():
    html = summary_tables(groups_of(*RUNS), [], policy_colours(["A", "B", "C"]))
    a, c = deciding_cells(html, "A"), deciding_cells(html, "C")
    assert 'class="best"' not in a[TTFT] and "†" in a[TTFT]
    assert 'class="best"' in c[TTFT] and "†" not in c[TTFT]
    assert 'class="best"' in a[0]  # goodput counts drops as misses already: A may win it
    assert a[2].startswith('<td data-v="0.2" class="warn">') and "200 / 200" not in a[2]
    assert "800 / 200" in a[2] and "model_<wbr>not_<wbr>served 200" in a[2]


def test_drop_reasons_over_several_seeds_say_they_are_summed_beside_the_per_run_means():
    runs = (make_run("A", 1, good=2.0, slo=0.7, dropped=170), make_run("A", 2, good=2.0, slo=0.7, dropped=190))
    cell = deciding_cells(summary_tables(groups_of(*runs), [], policy_colours(["A"])), "A")[2]
    assert "820 / 180" in cell  # per run
    assert "model_<wbr>not_<wbr>served 360 over 2 runs" in cell


def test_the_drop_threshold_is_a_setting():
    html = summary_tables(groups_of(*RUNS), [], policy_colours(["A", "B", "C"]), threshold=0.001)
    assert 'class="best"' not in deciding_cells(html, "C")[TTFT]
    assert 'class="best"' in deciding_cells(html, "B")[TTFT]


def test_deciding_columns_come_first_and_the_rest_fold_away():
    html = summary_tables(groups_of(*RUNS), ["m1"], policy_colours(["A", "B", "C"]))
    deciding = re.search(r'<table id="summary-table".*?</thead>', html, re.S).group(0)
    heads = [re.sub(r"<[^>]+>|&shy;", "", h) for h in re.findall(r"<th[^>]*>.*?</th>", deciding, re.S)]
    assert [h.split(" ")[0] for h in heads] == ["Policy", "Goodputreq/s", "SLO", "Requestscompleted", "TTFT", "TPOT"]
    detail = html[html.index("<details"):]
    assert 'id="detail-table"' in detail and "E2E s" in detail and "Seconds paused" in detail and ">m1 ↑<" in detail
    rows = re.findall(r'<th scope="row" data-v="([^"]+)"', html[:html.index("<details")])
    assert rows == ["A", "B", "C"]  # best goodput first


def test_verdict_ranks_on_goodput_and_attainment_and_says_drops_are_misses():
    sentence = verdict(groups_of(*RUNS))
    assert sentence.startswith("<b>A</b> has the best goodput (2.000 req/s, +0.500 req/s (+33.3%) over <b>B</b>)")
    assert "<b>B</b> has the best SLO attainment (80.0%, +5.0 points over <b>C</b>)" in sentence
    assert "dropped ones as misses" in sentence
    assert "<b>A</b> dropped 20.0% of its requests (more than 1%)" in sentence and "<b>C</b> dropped" not in sentence
    assert "1 seed: no interval" in sentence


def test_verdict_with_three_seeds_judges_the_margin():
    runs = [make_run("A", s, good=g, slo=0.8) for s, g in ((1, 1.0), (2, 1.1), (3, 1.2))]
    runs += [make_run("B", s, good=g, slo=0.8) for s, g in ((1, 1.05), (2, 1.15), (3, 1.25))]
    sentence = verdict(groups_of(*runs))
    assert "<b>B</b> has the best goodput" in sentence and "intervals overlap" in sentence
    assert "no interval" not in sentence


def test_verdict_on_seeds_that_changed_nothing_claims_no_significance():
    # A trace replays the same requests whatever the seed: three identical runs per policy have zero-width
    # intervals, and "beyond the 95% intervals" would be read as a lead that holds.
    runs = [make_run("A", s, good=3.714, slo=0.9) for s in (3, 4, 5)]
    runs += [make_run("B", s, good=3.712, slo=0.9) for s in (3, 4, 5)]
    sentence = verdict(groups_of(*runs))
    assert sentence.startswith("<b>A</b> is best on goodput (3.714 req/s, +0.002 req/s (+0.1%) over <b>B</b>)")
    assert "beyond the 95% intervals" not in sentence and "not significant" not in sentence
    assert "The 3 seeds gave every policy the same figures" in sentence


def test_ranking_rows_for_the_terminal():
    rows = ranking_rows(groups_of(*RUNS))
    assert [r[1] for r in rows] == ["A", "B", "C"]
    assert rows[0] == ["1", "A", "2.000", "70.0%", "800 / 200 (20.0%)", "0.500 †", "0.0500 †"]
    assert rows[2][5] == "0.800"


def test_every_builtin_policy_has_its_own_fixed_colour():
    builtins = [get_policy_class(module.replace("_", "-")).name for module in BUILTIN_MODULES]
    assert set(builtins) == set(BUILTIN_POLICY_COLOURS)
    assert len(set(BUILTIN_POLICY_COLOURS.values())) == len(BUILTIN_POLICY_COLOURS)
    # The same colour whatever else is compared and in whatever order.
    alone = policy_colours(["slo-aware"])["slo-aware"]
    assert policy_colours(["static", "fcfs-swap", "slo-aware"])["slo-aware"] == alone
    assert policy_colours(["my.py:Mine", "slo-aware", "other"]) == {
        "my.py:Mine": EXTRA_POLICY_COLOURS[0], "slo-aware": alone, "other": EXTRA_POLICY_COLOURS[1]}
    assert not set(EXTRA_POLICY_COLOURS) & set(BUILTIN_POLICY_COLOURS.values())
