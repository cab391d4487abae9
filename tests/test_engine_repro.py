"""The engine defects found in review, each from its minimal reproducer in ``../shared/repro/engine/``.

The reproducers predate the activation reserve an instance now keeps beside its weights (vLLM's peak
activation and non-torch memory, ``sim.engine.memory``); on their GPUs as written, the model no longer fits
at all. Each test therefore runs the reproducer with its GPU enlarged by exactly that reserve, which gives the
KV room its author had, and asserts the fixed behaviour; one test keeps the as-written case.
Every run is a real ``mmsim run`` in a subprocess with a wall-clock bound, so a hang fails.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from sim.catalogue import get_model
from sim.engine.memory import reserve_bytes

from conftest import MMSIM_CLI

RUN_LIMIT_S = 120
GIB = 2**30


def prepare(shared: Path, tmp_path: Path, name: str, scenario_file: str = "scenario.yaml", as_written: bool = False) -> Path:
    """Copy a reproducer into ``tmp_path``; unless ``as_written``, enlarge its GPU by the largest model's reserve."""
    source = shared / "repro" / "engine" / name
    target = tmp_path / name.replace("/", "-")
    target.mkdir(parents=True)
    shutil.copy(source / "trace.csv", target / "trace.csv")
    data = yaml.safe_load((source / scenario_file).read_text())
    if not as_written:
        engine = data.get("engine", {})
        reserve = max(reserve_bytes(get_model(m["name"]), engine.get("max_num_batched_tokens", 8192),
                                    engine.get("max_num_seqs", 256)) for m in data["models"])
        utilization = engine.get("gpu_memory_utilization", 0.9)
        data["cluster"]["gpu_memory_gb"] += reserve / utilization / GIB
    path = target / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run(scenario: Path, mode: str = "fast") -> tuple[dict, pd.DataFrame]:
    out = scenario.parent / f"out-{mode}"
    done = subprocess.run([*MMSIM_CLI, "run", str(scenario), "--mode", mode, "--json", "--out", str(out)],
                          capture_output=True, text=True, timeout=RUN_LIMIT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout), pd.read_parquet(out / "requests.parquet")


def assert_same_times(fast: pd.DataFrame, exact: pd.DataFrame) -> None:
    assert list(fast["status"]) == list(exact["status"])
    for column in ("first_token_s", "finish_s"):
        a, b = fast[column].to_numpy(), exact[column].to_numpy()
        assert (np.isnan(a) == np.isnan(b)).all()
        both = ~np.isnan(a)
        np.testing.assert_allclose(a[both], b[both], rtol=1e-9, atol=1e-9)


def test_fcfs_swap_no_longer_evicts_an_older_request_for_a_younger_one(shared, tmp_path):
    # Both requests fit: the qwen head waits for mistral's older request instead of evicting it.
    summary, requests = run(prepare(shared, tmp_path, "fcfs_swap_livelock", as_written=True))
    assert summary["requests_completed"] == 2 and summary["requests_dropped"] == 0
    assert summary["loads"] <= 3  # the two models at most once each after the initial placement
    mistral, qwen = requests.sort_values("arrival_s")["finish_s"]
    assert mistral < qwen  # FIFO over the whole system


def test_swap_aware_drops_the_unfittable_prompt_and_serves_the_rest(shared, tmp_path):
    summary, requests = run(prepare(shared, tmp_path, "swap_aware_unfittable_livelock"))
    assert set(summary["drop_reasons"]) == {"exceeds_max_model_len"}
    limit = summary["per_model"]["qwen3-8b"]["max_model_len"]
    too_long = (requests["prompt_tokens"] + requests["output_tokens"] > limit) & requests["model"].eq("qwen3-8b")
    assert (requests.loc[too_long, "drop_reason"] == "exceeds_max_model_len").all()
    assert (requests.loc[~too_long, "status"] == "completed").all()
    assert summary["loads"] < 10


def test_a_request_longer_than_max_model_len_is_rejected_at_arrival_and_blocks_nobody(shared, tmp_path):
    summary, requests = run(prepare(shared, tmp_path, "kv_too_small_head_of_line"))
    assert summary["drop_reasons"] == {"exceeds_max_model_len": 1}
    assert summary["per_model"]["qwen2.5-3b"]["drop_reasons"] == {"exceeds_max_model_len": 1}
    big, small_1, small_2 = requests.sort_values("arrival_s").itertuples()
    assert big.prompt_tokens == 20_000 and big.drop_reason == "exceeds_max_model_len" and np.isnan(big.first_scheduled_s)
    assert small_1.status == small_2.status == "completed"
    assert small_1.ttft_s < 1.0  # served at once, not after the long one


def test_a_request_that_would_outgrow_the_kv_room_is_rejected_up_front(shared, tmp_path):
    summary, requests = run(prepare(shared, tmp_path, "kv_outgrows_capacity"))
    long, short = requests.sort_values("arrival_s").itertuples()
    assert long.prompt_tokens + long.output_tokens > summary["per_model"]["qwen2.5-3b"]["max_model_len"] >= long.prompt_tokens
    assert long.drop_reason == "exceeds_max_model_len" and long.preemptions == 0
    assert short.status == "completed"


def test_as_written_the_reproducer_gpu_cannot_hold_the_model_and_says_so(shared, tmp_path):
    summary, _ = run(prepare(shared, tmp_path, "kv_too_small_head_of_line", as_written=True))
    assert summary["drop_reasons"] == {"model_exceeds_gpu": 3}
    assert summary["per_model"]["qwen2.5-3b"]["max_model_len"] == 0


@pytest.mark.parametrize("case", ["swapped_blocks_arrival", "fast_exact_divergence/case-5050",
                                  "fast_exact_divergence/case-5071", "fast_exact_divergence/case-5100"])
def test_fast_forward_equals_per_iteration_mode(shared, tmp_path, case):
    scenario = prepare(shared, tmp_path, case)
    (_, fast), (_, exact) = run(scenario, "fast"), run(scenario, "exact")
    assert_same_times(fast, exact)


def test_a_swapped_request_holds_back_a_new_arrival_in_both_modes(shared, tmp_path):
    # vLLM admits nothing new while a preempted request waits to come back; fast-forward now agrees.
    scenario = prepare(shared, tmp_path, "swapped_blocks_arrival")
    for mode in ("fast", "exact"):
        summary, requests = run(scenario, mode)
        events = pd.read_parquet(scenario.parent / f"out-{mode}" / "events.parquet")
        (swap_in,) = events.loc[events["kind"] == "swap_in", "time_s"]
        late = requests.sort_values("arrival_s").iloc[-1]
        assert summary["preemptions"] == 1 and late["arrival_s"] < swap_in
        assert late["first_scheduled_s"] == pytest.approx(swap_in, abs=1e-9)
