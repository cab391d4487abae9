"""SLOs per request class: a trace row's ``slo_class`` holds its request to the scenario's ``slo_classes`` entry of
that name (each limit it leaves unset the model's), in the summary, the requests table and the slo-aware policy.

Every run here is a few requests on one GPU, under a wall-clock bound."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import REPO, scenario_dict, wall_clock_limit
from sim.results import write_run
from sim.scenario import parse_scenario
from sim.simulation import simulate
from sim.workload.chunk import RequestChunk
from tests.test_bad_input import cli, refused, write_yaml

MODEL = "qwen2.5-3b"
FIELDS = ("ttft_s", "tpot_s", "e2e_s")


@pytest.fixture(autouse=True)
def bounded():
    with wall_clock_limit(120):
        yield


def one_model(**overrides) -> dict:
    """One small model on one GPU; keyword arguments replace top-level sections."""
    return scenario_dict(cluster={"nodes": 1, "gpus_per_node": 1, "host_memory_gb": 64}, models=[{"name": MODEL}],
                         **overrides)


def chunk(arrival_s, prompt_tokens, output_tokens, classes, models=None) -> list[RequestChunk]:
    """One chunk of requests (of MODEL unless ``models`` says otherwise) with these SLO classes (None: none)."""
    n = len(arrival_s)
    return [RequestChunk(np.asarray(arrival_s, float), np.array(models or [MODEL] * n, object),
                         np.asarray(prompt_tokens), np.asarray(output_tokens),
                         slo_class=None if classes is None else np.array(classes, object))]


def limits(slo) -> tuple:
    """An SLO's (ttft_s, tpot_s, e2e_s)."""
    return tuple(getattr(slo, field) for field in FIELDS)


# -- the hand-computed case ------------------------------------------------------------------------------------
def test_two_requests_one_held_to_a_tight_ttft_the_other_to_a_loose_one():
    """Both requests arrive together and get their first token together, some seconds in (the model loads first):
    within the model's 5 s, past interactive's 0.01 s, within batch's 100 s. So interactive's misses, batch's meets,
    and half the run meets its SLO; without the classes both meet theirs."""
    classes = {"interactive": {"ttft_s": 0.01}, "batch": {"ttft_s": 100.0}}
    data = one_model(slo={"default": {"ttft_s": 5.0}}, slo_classes=classes)
    requests = chunk([0.0, 0.0], [1000, 1000], [20, 20], ["interactive", "batch"])
    result = simulate(parse_scenario(data, "hand"), chunks=requests)
    frame = result.requests
    assert list(frame["status"]) == ["completed", "completed"]
    assert ((frame["ttft_s"] > 0.01) & (frame["ttft_s"] < 5.0)).all(), frame["ttft_s"]
    summary = result.summary
    assert summary["slo_attainment"] == 0.5 and summary["per_model"][MODEL]["slo_attainment"] == 0.5
    span = float(frame["finish_s"].max())
    assert summary["goodput_requests_per_s"] == 1 / span
    per_class = summary["per_slo_class"]
    assert list(per_class) == ["batch", "interactive"]  # label order
    assert per_class["interactive"]["slo_attainment"] == 0.0 and per_class["batch"]["slo_attainment"] == 1.0
    assert per_class["interactive"]["ttft_s"]["p50"] == float(frame["ttft_s"][0])

    plain = simulate(parse_scenario(one_model(slo={"default": {"ttft_s": 5.0}}), "plain"), chunks=requests)
    assert plain.summary["slo_attainment"] == 1.0  # no slo_classes: both held to the model's 5 s
    unclassed = simulate(parse_scenario(data, "unclassed"), chunks=chunk([0.0, 0.0], [1000, 1000], [20, 20], None))
    assert unclassed.summary["slo_attainment"] == 1.0 and "per_slo_class" not in unclassed.summary


# -- fallback rules --------------------------------------------------------------------------------------------
FALLBACK = {
    "models": [{"name": MODEL}, {"name": "qwen3-8b"}],
    "slo": {"default": {"ttft_s": 5.0, "e2e_s": 7.0}, MODEL: {"tpot_s": 0.5}},
    "slo_classes": {"gold": {"ttft_s": 1.0}, "silver": {"e2e_s": 3.0}},
}


def test_a_limit_a_class_leaves_unset_is_the_models_then_the_defaults():
    scenario = parse_scenario(scenario_dict(**FALLBACK), "fallback")
    small, large = scenario.slo_for(MODEL), scenario.slo_for("qwen3-8b")
    assert limits(small.for_class("gold")) == (1.0, 0.5, 7.0)
    assert limits(large.for_class("gold")) == (1.0, None, 7.0)
    assert limits(small.for_class("silver")) == (5.0, 0.5, 3.0)
    for label in ("bronze", None, ""):  # a class the scenario does not name, or none: the model's own
        assert limits(small.for_class(label)) == (5.0, 0.5, 7.0) and limits(large.for_class(label)) == (5.0, None, 7.0)
    default = scenario.slo["default"]
    assert default.for_class("gold") is default  # the scenario's own entry is not given the classes


def test_slo_met_holds_each_request_to_its_own_limits():
    """Two models, classes named and not, some requests without: the summary's attainment per run, model and class
    is what each request's own limits (looked up one by one) give."""
    rng = np.random.default_rng(5)
    n = 48
    models = list(rng.choice([MODEL, "qwen3-8b"], n))
    classes = list(rng.choice(np.array(["gold", "silver", "bronze", None], object), n))
    data = scenario_dict(**{**FALLBACK, "slo": {"default": {"ttft_s": 3.0, "e2e_s": 9.0}, MODEL: {"tpot_s": 0.05}}})
    scenario = parse_scenario(data, "mixed")
    arrivals = np.sort(rng.uniform(0, 20, n))
    requests = chunk(arrivals, rng.integers(50, 1500, n), rng.integers(1, 200, n), classes, models)
    result = simulate(scenario, chunks=requests)
    frame, summary = result.requests, result.summary
    met = []
    for row in frame.itertuples():
        slo = scenario.slo_for(row.model).for_class(None if pd.isna(row.slo_class) else row.slo_class)
        values = {"ttft_s": row.ttft_s, "tpot_s": 0.0 if np.isnan(row.tpot_s) else row.tpot_s, "e2e_s": row.e2e_s}
        met.append(row.status == "completed" and all(getattr(slo, f) is None or values[f] <= getattr(slo, f)
                                                     for f in FIELDS))
    met = pd.Series(met)
    assert 0 < met.mean() < 1  # the case holds both kinds
    assert summary["slo_attainment"] == float(met.mean())
    for model, figures in summary["per_model"].items():
        assert figures["slo_attainment"] == float(met[frame["model"] == model].mean())
    for label in ("bronze", "gold", "silver"):
        rows = frame["slo_class"] == label
        figures = summary["per_slo_class"][label]
        assert figures["requests"] == int(rows.sum()) and figures["slo_attainment"] == float(met[rows].mean())
    assert set(summary["per_slo_class"]) == {"bronze", "gold", "silver"}


# -- the requests table and the summary ------------------------------------------------------------------------
def test_the_requests_table_names_each_requests_class(tmp_path):
    classes = ["gold", None, "silver", "gold"]
    result = simulate(parse_scenario(one_model(slo_classes={"gold": {"ttft_s": 1.0}}), "table"),
                      chunks=chunk([0.0, 0.1, 0.2, 0.3], [100] * 4, [5] * 4, classes))
    frame = result.requests
    assert [None if pd.isna(label) else label for label in frame["slo_class"]] == classes
    write_run(result, tmp_path)
    schema = pq.read_schema(tmp_path / "requests.parquet")
    assert schema.field("slo_class").type == pa.dictionary(pa.int8(), pa.string())
    assert pq.read_table(tmp_path / "requests.parquet").column("slo_class").null_count == 1
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "requests.parquet"), frame, check_exact=True)

    plain = simulate(parse_scenario(one_model(), "plain"), chunks=chunk([0.0, 0.1], [100] * 2, [5] * 2, None))
    assert plain.requests["slo_class"].isna().all()  # the column is there, empty, for a run without classes
    write_run(plain, tmp_path / "plain")
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "plain" / "requests.parquet"), plain.requests)


def test_the_per_class_summary_figures_are_the_classes_requests(tmp_path):
    """From a trace file through ``mmsim run``: the classes reach requests.parquet and summary.json."""
    trace = tmp_path / "t.csv"
    rows = [(0.0, 800, 30, "interactive"), (0.2, 300, 1, ""), (0.4, 600, 12, "batch"), (0.6, 900, 40, "interactive"),
            (0.8, 200, 8, "batch"), (1.0, 500, 3, "interactive")]
    trace.write_text("arrival_s,model,prompt_tokens,output_tokens,slo_class\n"
                     + "".join(f"{a},{MODEL},{p},{o},{c}\n" for a, p, o, c in rows))
    data = one_model(workload={"trace": {"path": str(trace), "format": "mmsim"}},
                     slo_classes={"interactive": {"ttft_s": 4.0}, "batch": {"ttft_s": 60.0}})
    code, text = cli("run", write_yaml(tmp_path / "s.yaml", data), "--out", tmp_path / "o")
    assert code == 0, text
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    frame = pd.read_parquet(tmp_path / "o" / "requests.parquet")
    assert list(frame["slo_class"].astype(object).where(frame["slo_class"].notna(), None)) == \
        [c or None for *_, c in rows]
    per_class = summary["per_slo_class"]
    assert list(per_class) == ["batch", "interactive"]
    for label, figures in per_class.items():
        part = frame[frame["slo_class"] == label]
        done = part[part["status"] == "completed"]
        assert (figures["requests"], figures["completed"], figures["dropped"]) == \
            (len(part), len(done), len(part) - len(done))
        for name in FIELDS:
            values = done[name].dropna().to_numpy()
            p50, p90, p99 = map(float, np.percentile(values, [50, 90, 99]))
            assert figures[name] == {"mean": float(values.mean()), "p50": p50, "p90": p90, "p99": p99}
    assert per_class["interactive"]["requests"] == 3 and per_class["batch"]["requests"] == 2
    assert "by SLO class" in text and "interactive" in text and "batch" in text  # and the run prints them


# -- validation ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("classes, expected", [
    ({"": {"ttft_s": 1.0}}, ("slo_classes: a class label must be non-empty text, not ''",)),
    ({"  ": {"ttft_s": 1.0}}, ("slo_classes: a class label must be non-empty text, not '  '",)),
    ({1: {"ttft_s": 1.0}}, ("slo_classes: a class label must be non-empty text, not 1",)),
    ({"x" * 201: {"ttft_s": 1.0}}, ("slo_classes: a class label is at most 200 characters, not 201",)),
    ({"gold": {"ttft_s": -1.0}}, ("slo_classes.gold.ttft_s", "greater than 0")),
    ({"gold": {"tpot_s": "fast"}}, ("slo_classes.gold.tpot_s",)),
    ({"gold": {"e2e_s": 1e9}}, ("slo_classes.gold.e2e_s", "less than or equal to 1000000")),
    ({"gold": {"ttfts": 1.0}}, ("slo_classes.gold.ttfts", "unknown field")),
    ({"gold": 3}, ("slo_classes.gold",)),
    ([{"ttft_s": 1.0}], ("slo_classes",)),
])
def test_a_bad_slo_class_is_refused_in_one_line(tmp_path, classes, expected):
    scenario = write_yaml(tmp_path / "s.yaml", one_model(slo_classes=classes))
    refused(["run", scenario, "--out", tmp_path / "o"], *expected, out=tmp_path / "o")


def test_slo_still_takes_only_default_and_model_names(tmp_path):
    scenario = write_yaml(tmp_path / "s.yaml", one_model(slo={"gold": {"ttft_s": 1.0}}))
    refused(["run", scenario, "--out", tmp_path / "o"], "slo.gold: not a model of this scenario", out=tmp_path / "o")


# -- policies --------------------------------------------------------------------------------------------------
RECORDER_POLICY = '''
import json
from sim.policies.static import StaticPolicy


class Records(StaticPolicy):
    """Static, writing down each arrival's class and limits as its view gives them."""

    name = "records"

    def on_arrival(self, request, view):
        slo = view.slo_of(request)
        label = view.slo_classes[request.slo_class] if request.slo_class >= 0 else None
        with open(PATH, "a") as out:
            out.write(json.dumps([request.id, label, slo.ttft_s, slo.tpot_s, slo.e2e_s]) + "\\n")
'''


def test_the_view_gives_each_request_its_own_limits(tmp_path):
    path = tmp_path / "records.py"
    path.write_text(RECORDER_POLICY.replace("PATH", repr(str(tmp_path / "seen.jsonl"))))
    scenario = parse_scenario(scenario_dict(**FALLBACK), "view")
    simulate(scenario, policy=f"{path}:Records",
             chunks=chunk([0.0, 0.1, 0.2, 0.3], [50] * 4, [2] * 4, ["gold", "bronze", None, "silver"],
                          [MODEL, MODEL, "qwen3-8b", "qwen3-8b"]))
    seen = [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]
    assert seen == [[0, "gold", 1.0, 0.5, 7.0], [1, "bronze", 5.0, 0.5, 7.0], [2, None, 5.0, None, 7.0],
                    [3, "silver", 5.0, None, 3.0]]


def first_started(classes: dict, labels: list) -> list[int]:
    """Under slo-aware, one request at a time: the ids of a blocker (no class) and two requests of the ``labels``
    classes arriving just after it, in the order they were first scheduled."""
    data = one_model(slo={"default": {"ttft_s": 50.0}}, slo_classes=classes, engine={"max_num_seqs": 1},
                     policy={"name": "slo-aware"})
    result = simulate(parse_scenario(data, "order"), chunks=chunk([0.0, 0.01, 0.02], [100] * 3, [30, 5, 5],
                                                                  [None, *labels]))
    frame = result.requests
    assert (frame["status"] == "completed").all() and (frame["ttft_s"] < 20).all()  # no deadline passed
    return list(frame.sort_values("first_scheduled_s", kind="stable")["id"])


def test_slo_aware_starts_the_request_whose_class_deadline_comes_first():
    """Held to the model's TTFT, the earlier arrival (id 1) is due first; its class's loose TTFT makes the later
    interactive one (id 2, due at 20.02 s) go before it (due at 100.01 s), and before the blocker (due at 50 s)."""
    classes = {"interactive": {"ttft_s": 20.0}, "batch": {"ttft_s": 100.0}}
    assert first_started({}, ["batch", "interactive"]) == [0, 1, 2]
    assert first_started(classes, ["batch", "interactive"]) == [2, 0, 1]
    assert first_started(classes, ["interactive", "batch"]) == [1, 0, 2]


def run_worked_example(tmp_path) -> tuple[str, dict, str]:
    """docs/slo.md's worked example (its trace and scenario), run: the example's text, the run's summary and what
    it printed."""
    text = (REPO / "docs" / "slo.md").read_text().split("## A worked example", 1)[1]
    trace, scenario = (block.split("\n", 1)[1] for block in text.split("```")[1:4:2])
    (tmp_path / "trace.csv").write_text(trace)
    (tmp_path / "classes.yaml").write_text(scenario)
    code, output = cli("run", tmp_path / "classes.yaml", "--out", tmp_path / "out")
    assert code == 0, output
    return text, json.loads((tmp_path / "out" / "summary.json").read_text()), output


def test_the_worked_example_of_docs_slo_md_gives_what_it_says(tmp_path):
    """docs/slo.md's trace and scenario, run: the attainment per run and per class its text gives."""
    text, summary, _ = run_worked_example(tmp_path)
    assert summary["slo_attainment"] == 0.8 and "`slo_attainment` is 0.8 (4 of 5)" in text
    attainment = {label: figures["slo_attainment"] for label, figures in summary["per_slo_class"].items()}
    assert attainment == {"batch": 1.0, "gold": 1.0, "interactive": 0.5}
    assert round(summary["per_slo_class"]["interactive"]["ttft_s"]["p50"], 3) == 1.454
