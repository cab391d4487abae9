"""SLO classes in every view beyond the run itself: the figures of the requests without a class, many classes (a
label per request) in the summary and the run's table, the comparison report's table by class (in headless
Chromium too) and ``trace stats``.

Every run here is a few requests on one GPU, under a wall-clock bound."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO, wall_clock_limit
from sim.scenario import parse_scenario
from sim.simulation import simulate
from tests.test_bad_input import cli, write_yaml
from tests.test_slo_classes import MODEL, chunk, one_model, run_worked_example


@pytest.fixture(autouse=True)
def bounded():
    with wall_clock_limit(120):
        yield


# -- the requests without a class, and many classes ------------------------------------------------------------
def test_the_requests_without_a_class_have_their_own_figures(tmp_path):
    """docs/slo.md's worked example: its one request without a class (id 2, held to the model's 5 s and 0.1 s; TTFT
    2.337 s in the docs' table) meets its SLO. slo_unclassed gives it, and with per_slo_class the counts add up to
    the run's: 2 + 1 + 1 + 1 = 5 requests, 1 + 1 + 1 + 1 = 4 meeting their SLO (0.8)."""
    _, summary, output = run_worked_example(tmp_path)
    unclassed = summary["slo_unclassed"]
    assert {key: unclassed[key] for key in ("requests", "completed", "dropped", "slo_attainment")} == \
        {"requests": 1, "completed": 1, "dropped": 0, "slo_attainment": 1.0}
    assert round(unclassed["ttft_s"]["p50"], 3) == 2.337 and unclassed["ttft_s"]["p99"] == unclassed["ttft_s"]["p50"]
    assert list(summary).index("slo_unclassed") == list(summary).index("per_slo_class") + 1
    requests = [figures["requests"] for figures in summary["per_slo_class"].values()]
    assert requests == [1, 1, 2] and sum(requests) + unclassed["requests"] == summary["requests_total"] == 5
    assert "(no class)" in output  # the run's table has its row


def test_a_run_without_classes_or_without_unclassed_requests_has_no_unclassed_entry(tmp_path):
    plain = simulate(parse_scenario(one_model(), "plain"), chunks=chunk([0.0, 0.1], [100] * 2, [5] * 2, None))
    assert "per_slo_class" not in plain.summary and "slo_unclassed" not in plain.summary
    classed = simulate(parse_scenario(one_model(), "all"), chunks=chunk([0.0, 0.1], [100] * 2, [5] * 2, ["a", "b"]))
    assert set(classed.summary["per_slo_class"]) == {"a", "b"} and "slo_unclassed" not in classed.summary


def test_grouped_percentiles_give_what_percentiles_gives_each_group_alone():
    """Groups of every size from 0 to 300 (the matrix path up to GROUPED_SIZES, one call each beyond), NaNs among the
    values, groups interleaved: each group's figures are those of its values taken alone, bit for bit."""
    from sim.summary import GROUPED_SIZES, grouped_percentiles, percentiles

    rng = np.random.default_rng(11)
    sizes = [*range(0, 40), *range(40, 301, 7), GROUPED_SIZES, GROUPED_SIZES + 1, *[1] * 500, *[2] * 300, *[3] * 50]
    groups = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    values = rng.lognormal(0, 2, len(groups))
    values[rng.random(len(groups)) < 0.05] = np.nan
    found = grouped_percentiles(values, groups, len(sizes))
    for group in range(len(sizes)):
        assert found[group] == percentiles(values[groups == group]), group


def test_grouped_percentiles_of_a_small_hand_case():
    from sim.summary import grouped_percentiles

    values = np.array([4.0, 1.0, np.nan, 2.0, 10.0, 3.0])
    groups = np.array([0, 1, 1, 0, 2, 0])
    found = grouped_percentiles(values, groups, 4)
    # Group 0 holds 4, 2, 3: mean 3, p50 3, p90 at rank 1.8 of the sorted 2, 3, 4: 3 + 0.8 = 3.8, p99 3.98.
    assert found[0]["mean"] == 3.0 and found[0]["p50"] == 3.0
    assert found[0]["p90"] == pytest.approx(3.8, abs=1e-12) and found[0]["p99"] == pytest.approx(3.98, abs=1e-12)
    assert found[1] == {"mean": 1.0, "p50": 1.0, "p90": 1.0, "p99": 1.0}  # its NaN left out
    assert found[2] == {"mean": 10.0, "p50": 10.0, "p90": 10.0, "p99": 10.0}
    assert found[3] == {"mean": None, "p50": None, "p90": None, "p99": None}  # no value


class LabelledTable:
    """What the per-class figures read of a RequestTable: the labels, the class codes and the latency columns."""

    def __init__(self, codes: np.ndarray, labels: list[str], latencies: dict[str, np.ndarray]):
        self.slo_class_names, self.codes, self.latencies = labels, codes, latencies

    def column(self, name):
        return self.codes.copy() if name == "slo_class" else self.latencies[name].copy()


def test_a_label_per_request_costs_no_scan_per_class():
    """100,000 requests, each its own class (as in a trace labelled by user): the per-class figures took 9.5 s here
    (three percentile calls per class) and took a minute before the grouping by code; now they take a fraction of a
    second. Hand figures: request i (code n-1-i) has TTFT (n-1-i) ms; every fourth (i % 4 == 0) was dropped, and of
    the others the even ones met their SLO."""
    from sim.summary import _per_slo_class

    n = 100_000
    labels = [f"user{i:06d}" for i in range(n)]
    codes = np.arange(n, dtype=np.int32)[::-1].copy()  # labels in reverse order of first arrival
    ttft = codes.astype(float) / 1000
    table = LabelledTable(codes, labels[::-1], {"ttft_s": ttft, "tpot_s": np.full(n, np.nan), "e2e_s": ttft * 2})
    completed = np.arange(n) % 4 != 0
    met = (np.arange(n) % 2 == 0) & completed
    import sim.summary

    calls = []
    real = np.percentile

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    sim.summary.np.percentile = counted  # the work, counted: a percentile call per class was the defect
    try:
        per_class, unclassed = _per_slo_class(table, completed, met)
    finally:
        sim.summary.np.percentile = real
    assert len(calls) <= 3 * 2, len(calls)  # one per latency for each group size (here all groups are of 1 or 0)
    assert unclassed is None and len(per_class) == n and list(per_class)[:2] == ["user000000", "user000001"]
    # Request 2 (code n-3) completed and met its SLO; request 4 (code n-5) was dropped.
    second = per_class[labels[::-1][n - 3]]
    assert second == {"requests": 1, "completed": 1, "dropped": 0, "slo_attainment": 1.0,
                      "ttft_s": {"mean": (n - 3) / 1000, "p50": (n - 3) / 1000, "p90": (n - 3) / 1000,
                                 "p99": (n - 3) / 1000},
                      "tpot_s": {"mean": None, "p50": None, "p90": None, "p99": None},
                      "e2e_s": {"mean": (n - 3) / 500, "p50": (n - 3) / 500, "p90": (n - 3) / 500,
                                "p99": (n - 3) / 500}}
    dropped = per_class[labels[::-1][n - 5]]
    assert (dropped["completed"], dropped["dropped"], dropped["slo_attainment"]) == (0, 1, 0.0)
    assert dropped["ttft_s"]["p50"] is None
    assert sum(figures["slo_attainment"] for figures in per_class.values()) == n / 4  # i % 4 == 2: even, completed


def class_summary(classes: dict, unclassed: dict | None = None) -> dict:
    """A run summary holding only what the run's tables read, with these classes: label -> (requests, met)."""
    def figures(requests, met):
        return {"requests": requests, "completed": requests, "dropped": 0, "slo_attainment": met / requests,
                "ttft_s": {"mean": 0.5, "p50": 0.5, "p90": 0.5, "p99": 0.5},
                "tpot_s": {"mean": 0.01, "p50": 0.01, "p90": 0.01, "p99": 0.01},
                "e2e_s": {"mean": 1.0, "p50": 1.0, "p90": 1.0, "p99": 1.0}}
    summary = {"per_slo_class": {label: figures(*pair) for label, pair in sorted(classes.items())}}
    if unclassed:
        summary["slo_unclassed"] = figures(*unclassed)
    return summary


def printed(table) -> str:
    from rich.console import Console

    console = Console(file=__import__("io").StringIO(), width=200)
    console.print(table)
    return console.file.getvalue()


def test_the_runs_class_table_shows_the_20_classes_with_the_most_requests():
    """25 classes: k01..k05 with 10 requests, k06..k25 with one each (k06..k10 missed, the rest met). Shown: the five
    large ones, then of the one-request ones the five that missed (worst first), then k11..k20 (label order); the
    line below counts the other five (k21..k25): 5 requests, all 5 meeting their SLO."""
    from sim.cli.run_summary import slo_class_table

    classes = {f"k{i:02d}": (10, 7) for i in range(1, 6)}
    classes |= {f"k{i:02d}": (1, 0 if i <= 10 else 1) for i in range(6, 26)}
    text = printed(slo_class_table(class_summary(classes, unclassed=(4, 3))))
    rows = [line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│")]
    assert rows == [*(f"k{i:02d}" for i in range(1, 21)), "(no class)"]
    assert "the 20 of 25 with the most requests" in text
    assert "5 more classes not shown (5 requests, 5 of them meeting their SLO); summary.json's per_slo_class has " \
           "every class" in " ".join(text.split())
    few = printed(slo_class_table(class_summary({"b": (2, 1), "a": (1, 1)})))
    assert [line.split("│")[1].strip() for line in few.splitlines() if line.startswith("│")] == ["a", "b"]
    assert "more classes" not in few and "(no class)" not in few


def test_mmsim_run_prints_a_bounded_table_for_many_classes(tmp_path):
    """A trace of 60 requests, each its own class: the run prints 20 class rows and a line for the other 40."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,model,prompt_tokens,output_tokens,slo_class\n"
                     + "".join(f"{i / 10},{MODEL},100,4,user{i:02d}\n" for i in range(60)))
    data = one_model(workload={"trace": {"path": str(trace), "format": "mmsim"}})
    code, text = cli("run", write_yaml(tmp_path / "s.yaml", data), "--out", tmp_path / "o")
    assert code == 0, text
    assert len(json.loads((tmp_path / "o" / "summary.json").read_text())["per_slo_class"]) == 60
    assert sum(f"user{i:02d}" in text for i in range(60)) == 20
    assert "40 more classes not shown" in text.replace("\n", " ")


def test_the_headline_labels_say_whose_limits_a_request_is_held_to():
    from sim.cli.run_summary import summary_table

    base = {"scenario": "s", "policy": "static", "seed": 1, "requests_completed": 1, "requests_dropped": 0,
            "throughput_tokens_per_s": 1.0, "throughput_requests_per_s": 1.0, "goodput_requests_per_s": 1.0,
            "slo_attainment": 1.0}
    plain = printed(summary_table(base))
    assert "meeting every SLO" in plain and "SLO class" not in plain
    classed = " ".join(printed(summary_table({**base, **class_summary({"a": (1, 1)})})).split())
    assert "SLO attainment: share meeting every limit of their SLO class (else their model's)" in \
        classed.replace(" │ ", " ").replace("│", "")


# -- the comparison report -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def classes_report(tmp_path_factory):
    """docs/slo.md's worked example compared under static and swap-aware (one seed: a trace's requests are the same
    under every seed)."""
    from sim.reports.compare import compare

    root = tmp_path_factory.mktemp("classes-report")
    text = (REPO / "docs" / "slo.md").read_text().split("## A worked example", 1)[1]
    trace, scenario = (block.split("\n", 1)[1] for block in text.split("```")[1:4:2])
    (root / "trace.csv").write_text(trace)
    (root / "classes.yaml").write_text(scenario)
    with wall_clock_limit(120):
        out, runs = compare(root / "classes.yaml", ["static", "swap-aware"], out=root / "classes.html",
                            runs_dir=root / "runs", show_progress=False)
    return out, runs


def class_table_rows(page: str) -> list[list[str]]:
    """The cells' text of the page's SLO-class table, row by row (body, then foot), interval notes left out."""
    import re
    from html import unescape

    found = re.search(r'<table id="slo-class-table".*?</table>', page, re.S)
    assert found, "no SLO class table"
    rows = re.findall(r"<tr>(.*?)</tr>", found.group(0), re.S)
    cells = [re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", re.sub(r"<small[^>]*>.*?</small>", "", row)) for row in rows]
    return [[unescape(re.sub(r"<[^>]+>", "", cell)).strip() for cell in row] for row in cells]


def test_the_report_shows_slo_attainment_per_class_and_policy(classes_report):
    """By hand, under either policy (one model, which must load before its first token): interactive's request at
    0 s waits out the load (past its 1 s TTFT) and the one at 3 s does not: 50%; batch (60 s), gold (the model's 5 s)
    and the request without a class (the model's 5 s) meet theirs: 100%. Requests per run: 1, 1, 2 and 1."""
    out, _ = classes_report
    page = out.read_text(encoding="utf-8")
    import html5lib

    html5lib.HTMLParser(strict=True).parse(page)
    rows = class_table_rows(page)
    assert rows[0] == ["SLO class", "Requests", "static", "swap-aware"] or \
        rows[0] == ["SLO class", "Requests", "swap-aware", "static"]  # policies best first
    assert rows[1:] == [["batch", "1", "100.0%", "100.0%"], ["gold", "1", "100.0%", "100.0%"],
                        ["interactive", "2", "50.0%", "50.0%"], ["(no class)", "1", "100.0%", "100.0%"]]
    from html import unescape

    assert "meeting every limit they are held to: their SLO class's" in unescape(page)
    assert "every SLO of their model" not in unescape(page)


def test_the_report_has_no_class_table_without_classes(classes_report):
    from sim.reports.html import render

    _, runs = classes_report
    plain = [copy_without_classes(run) for run in runs]
    page = render(plain)
    assert "slo-class-table" not in page and "SLO attainment by SLO class" not in page
    from html import unescape

    assert "meeting every limit they are held to: their model's SLO" in unescape(page)


def copy_without_classes(run):
    import copy

    other = copy.copy(run)
    other.summary = {k: v for k, v in run.summary.items() if k not in ("per_slo_class", "slo_unclassed")}
    return other


def test_the_report_shows_30_classes_and_pools_the_rest(classes_report):
    """35 classes added to both runs' summaries: c00..c29 with 10 requests (7 met), c30..c34 with one each, of which
    c30 and c31 missed: the pooled row holds 5 requests, 3 meeting their SLO (60.0%)."""
    from sim.reports.html import render

    _, runs = classes_report
    many = {f"c{i:02d}": (10, 7) for i in range(30)} | {f"c{i}": (1, 0 if i < 32 else 1) for i in range(30, 35)}
    changed = []
    for run in runs:
        other = copy_without_classes(run)
        other.summary = {**other.summary, **class_summary(many, unclassed=(2, 1))}
        changed.append(other)
    rows = class_table_rows(render(changed))
    assert [row[0] for row in rows[1:31]] == [f"c{i:02d}" for i in range(30)]
    assert all(row[1:] == ["10", "70.0%", "70.0%"] for row in rows[1:31])
    assert rows[31:] == [["(no class)", "2", "50.0%", "50.0%"], ["5 more classes", "5", "60.0%", "60.0%"]]


CLASS_PROBE = """<script>
var seenErrors = [];
window.addEventListener('error', function (e) { seenErrors.push(String(e.message)); });
window.addEventListener('load', function () {
  var out = {errors: seenErrors, innerWidth: window.innerWidth};
  var table = document.getElementById('slo-class-table');
  function labels() {
    return Array.prototype.map.call(table.tBodies[0].rows, function (tr) { return tr.cells[0].textContent; });
  }
  if (table) {
    table.scrollIntoView();
    var box = table.getBoundingClientRect();
    out.box = {left: box.left, right: box.right, width: box.width, height: box.height};
    out.sortable = table.getAttribute('data-sortable');
    out.rows = Array.prototype.map.call(table.querySelectorAll('tbody tr, tfoot tr'), function (tr) {
      return Array.prototype.map.call(tr.cells, function (c) { return c.textContent.trim(); }); });
    var head = table.tHead.rows[0].cells[2];  // the first policy's attainment
    head.click();
    out.descending = labels();
    head.click();
    out.ascending = labels();
    out.foot = table.tFoot.rows[0].cells[0].textContent;
  }
  var pre = document.createElement('pre');
  pre.id = 'measure';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def test_the_class_table_in_headless_chromium(classes_report, tmp_path):
    """The table is on the page, within its width, sorts by a policy's attainment (interactive's 50% last, then
    first) and keeps the requests without a class below the classes; no script error."""
    from tests.test_browser import probe_section

    out, _ = classes_report
    seen = probe_section(out, CLASS_PROBE, tmp_path)
    assert seen["errors"] == [] and seen["sortable"] == "ready"
    assert seen["box"]["width"] > 200 and seen["box"]["height"] > 60
    assert 0 <= seen["box"]["left"] and seen["box"]["right"] <= seen["innerWidth"]
    assert [row[0] for row in seen["rows"]] == ["batch", "gold", "interactive", "(no class)"]
    assert seen["descending"][-1] == "interactive" and seen["ascending"][0] == "interactive"
    assert seen["foot"] == "(no class)"


# -- trace stats -----------------------------------------------------------------------------------------------
def test_trace_stats_counts_the_requests_of_each_class(tmp_path):
    """17 rows: a ×3, b ×2, c..l once each, two without a class. The table shows a, b and c..j (the ten with the most
    requests, equal counts in label order), k and l as "2 more classes", and the two without; --json every class."""
    labels = ["a"] * 3 + ["b"] * 2 + list("cdefghijkl") + ["", ""]
    order = np.random.default_rng(3).permutation(len(labels))
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,model,prompt_tokens,output_tokens,slo_class\n"
                     + "".join(f"{i / 10},{MODEL},100,4,{labels[k]}\n" for i, k in enumerate(order)))
    code, text = cli("trace", "stats", trace, "--json")
    assert code == 0, text
    stats = json.loads(text)
    assert stats["slo_class_requests"] == {"a": 3, "b": 2, **{label: 1 for label in "cdefghijkl"}}
    code, text = cli("trace", "stats", trace)
    assert code == 0, text
    lines = [" ".join(line.replace("│", " ").split()) for line in text.splitlines()]
    shown = [line for line in lines if line.startswith("slo_class")]
    assert shown == ["slo_class a 3 requests (17.6%)", "slo_class b 2 requests (11.8%)",
                     *(f"slo_class {label} 1 request (5.9%)" for label in "cdefghij"),
                     "slo_class: 2 more classes 2 requests (--json lists every class)",
                     "slo_class none (empty cell) 2 requests (11.8%)"]
    plain = tmp_path / "p.csv"
    plain.write_text(f"arrival_s,model,prompt_tokens,output_tokens\n0.0,{MODEL},100,4\n")
    code, text = cli("trace", "stats", plain, "--json")
    assert code == 0 and "slo_class" not in text


EDGE_VALUES = st.sampled_from([0.0, -0.0, 5e-324, 1.5, 2.0, 1e308, np.inf, -np.inf, np.nan])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=True, width=64), EDGE_VALUES), min_size=0, max_size=300))
def test_percentiles_are_numpys_bit_for_bit(values):
    """The summary's percentiles are numpy's ``percentile`` (linear method) of the non-NaN values, to the last bit
    and sign of zero: the same neighbours, the same interpolation, infinities and subnormals included."""
    from sim.summary import percentiles

    data = np.array(values, dtype=np.float64)
    kept = data[~np.isnan(data)]
    with np.errstate(invalid="ignore", over="ignore"):
        found = percentiles(data.copy())
        expected = np.percentile(kept, [50, 90, 99]) if kept.size else None
    if expected is None:
        assert found == {"mean": None, "p50": None, "p90": None, "p99": None}
        return
    assert np.array([found["p50"], found["p90"], found["p99"]]).tobytes() == expected.tobytes()
