"""Per-instance prefix-cache figures in summary.json, the terminal summary and the report, worked out by hand:
two replicas of one model behind prefix-aware routing, each tenant's prefix of known length, and an instance
that is unloaded and loaded again."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import numpy as np
from rich.console import Console

from sim import simulation
from sim.cli.run_summary import PREFIX_TABLE_ROWS, prefix_table, print_run_summary
from sim.reports.data import RunData
from sim.reports.prefix import instance_table
from sim.scenario import parse_scenario
from sim.simulation import simulate
from sim.workload.chunk import RequestChunk
from tests.conftest import scenario_dict
from tests.test_prefix_cache import BLOCK, ID_TOKENS, UnloadBetween

MODEL = "qwen2.5-3b"
A, B, A_FORK = (1, 2, 3), (7, 8, 9), (1, 2, 9)  # 64 tokens per id: 3 ids = 192 tokens = 12 blocks of 16
# (arrival s, prompt tokens, prefix ids): A1 and B1 at once, then one at a time long after both finish.
ROWS = [(0.0, 250, A), (0.0, 250, B), (60.0, 250, A), (70.0, 300, A_FORK), (80.0, 192, B)]


def two_replicas() -> dict:
    scenario = parse_scenario(scenario_dict(
        cluster={"nodes": 1, "gpus_per_node": 2, "gpu_memory_gb": 24}, models=[{"name": MODEL, "replicas": 2}],
        engine={"block_size": BLOCK}, routing={"rule": "prefix-aware"},
        workload={"generator": {"max_requests": 1, "arrivals": {"process": "poisson", "rate_per_s": 1.0},
                                "mix": {MODEL: 1.0}, "prompt_tokens": {"dist": "constant", "value": 10},
                                "output_tokens": {"dist": "constant", "value": 10}}, "prefix_block_tokens": ID_TOKENS}),
        "test")
    arrivals, prompts, ids = zip(*ROWS)
    prefix_ids = np.empty(len(ROWS), object)
    prefix_ids[:] = ids
    chunk = RequestChunk(np.array(arrivals), np.array([MODEL] * len(ROWS), object), np.array(prompts, np.int64),
                         np.full(len(ROWS), 4, np.int64), prefix_ids=prefix_ids)
    result = simulate(scenario, chunks=[chunk])
    return {"summary": result.summary, "requests": result.requests.sort_values("id")}


def test_each_instance_counts_its_own_lookups_and_hits():
    run = two_replicas()
    frame = run["requests"]
    # A1 -> GPU 0, B1 -> GPU 1; A2 finds A's 12 blocks (192 tokens) on GPU 0; the fork shares A's first two
    # ids (8 blocks, 128 tokens) there; B2 (192 tokens, all cached) computes its last token: 11 blocks, 176.
    assert list(frame["gpu"]) == [0, 1, 0, 0, 1]
    assert list(frame["cached_prompt_tokens"]) == [0, 0, 192, 128, 176]
    rows = {tuple(r["gpus"]): r for r in run["summary"]["per_instance"]}
    assert set(rows) == {(0,), (1,)}
    gpu0, gpu1 = rows[(0,)], rows[(1,)]
    assert (gpu0["prefix_queried_tokens"], gpu0["prefix_hit_tokens"]) == (250 + 250 + 300, 192 + 128)
    assert (gpu1["prefix_queried_tokens"], gpu1["prefix_hit_tokens"]) == (250 + 192, 176)
    assert gpu0["prefix_hit_rate"] == 320 / 800 and gpu1["prefix_hit_rate"] == 176 / 442
    assert gpu0["prefill_tokens_saved"] == 320 and gpu1["prefill_tokens_saved"] == 176
    assert {gpu0["model"], gpu1["model"]} == {MODEL} and gpu0["instance"] != gpu1["instance"]
    whole = run["summary"]["per_model"][MODEL]
    assert whole["prefix_queried_tokens"] == 1242 and whole["prefix_hit_tokens"] == 496


def test_an_unloaded_instance_is_counted_in_one_row_per_model():
    # Request 0 (320 tokens) runs on the first instance, which is unloaded with its cache; request 1 (the same
    # prompt) on the second finds nothing: 320 looked up on each, none found.
    scenario = parse_scenario(scenario_dict(
        cluster={"nodes": 1, "gpus_per_node": 1, "gpu_memory_gb": 24}, models=[{"name": MODEL}],
        engine={"block_size": BLOCK, "max_num_batched_tokens": 512}), "test")
    scenario.workload.prefix_block_tokens = ID_TOKENS
    ids = np.empty(2, object)
    ids[:] = [(1, 2, 3, 4, 5)] * 2
    chunk = RequestChunk(np.array([0.0, 100.0]), np.array([MODEL] * 2, object), np.array([320, 320], np.int64),
                         np.array([1, 1], np.int64), prefix_ids=ids)
    with mock.patch.object(simulation, "make_policy", lambda name, params: UnloadBetween(keep=False)):
        summary = simulation.simulate(scenario, chunks=[chunk]).summary
    live, gone = summary["per_instance"]
    assert live["instance"] is not None and live["gpus"] == [0]
    assert gone == {"instance": None, "model": MODEL, "gpus": [], "prefix_queried_tokens": 320, "prefix_hit_tokens": 0,
                    "prefix_hit_rate": 0.0, "prefill_tokens_saved": 0}
    assert (live["prefix_queried_tokens"], live["prefix_hit_tokens"]) == (320, 0)


def test_the_terminal_and_the_report_show_each_instance():
    summary = two_replicas()["summary"]
    console = Console(record=True, width=160)
    print_run_summary(console, summary, None, Path("scenarios/prefix-sharing.yaml"), Path("reports/runs/x"))
    text = console.export_text()
    assert "prefix cache by instance" in text and "found (prefill saved)" in text
    assert "800" in text and "320" in text and "40.0%" in text and f"{176 / 442:.1%}" in text
    many = dict(summary, per_instance=summary["per_instance"] * PREFIX_TABLE_ROWS)
    assert prefix_table(many) is None  # too many for a terminal: summary.json has them
    # Without prefix ids every prompt is looked up and nothing found: a table of 0% would say nothing.
    unnamed = [dict(row, prefix_hit_tokens=0, prefix_hit_rate=0.0) for row in summary["per_instance"]]
    assert prefix_table(dict(summary, per_instance=unnamed)) is None
    page = instance_table({"static": [RunData(summary, None, None, None)]})
    assert page.count("<tr>") == 3 and "40.0%" in page and "442" in page
