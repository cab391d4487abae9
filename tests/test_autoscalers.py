"""Each built-in autoscaler's decision on crafted signals, against Kubernetes' HPA rule and Holt's forecast worked
out by hand; and every bad fleet input is one line, exit 2."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.fleet.autoscalers import ModelSignals, make_autoscaler
from sim.fleet.window import WindowMax

from conftest import scenario_dict, wall_clock_limit
from test_bad_input import cli


def signals(**given) -> ModelSignals:
    base = dict(model="m", now=100.0, interval_s=10.0, replicas=2, ready=2, queued=0, running=0, kv_utilisation=0.0,
                utilisation=0.0, arrival_rate_per_s=0.0, lead_time_s=90.0)
    return ModelSignals(**{**base, **given})


def test_utilisation_is_capped_at_a_busy_gpu_however_long_the_queue():
    scaler = make_autoscaler("utilisation", {"target": 0.6})
    # Busy all the time: ceil(2 x 1.0 / 0.6) = 4, whether 10 or 10,000 requests wait.
    assert scaler.desired(signals(utilisation=1.0, queued=10))[0] == 4
    assert scaler.desired(signals(utilisation=1.0, queued=10_000))[0] == 4
    assert scaler.desired(signals(utilisation=0.63))[0] == 2  # 1.05 x the target: within HPA's 10% tolerance
    assert scaler.desired(signals(utilisation=0.15))[0] == 1  # ceil(2 x 0.25)


def test_queue_depth_scales_with_the_queue():
    scaler = make_autoscaler("queue-depth", {"target": 4.0})
    assert scaler.desired(signals(queued=10_000))[0] == 2500  # ceil(2 x (10,000 / 2) / 4)
    assert scaler.desired(signals(queued=17))[0] == 5  # 8.5 per replica: ceil(2 x 2.125)
    assert scaler.desired(signals(queued=0))[0] == 0
    assert scaler.desired(signals(replicas=0, ready=0, queued=3))[0] == 1  # from zero: ceil(1 x 3 / 4)


def test_kv_utilisation_follows_the_kv_cache_use():
    scaler = make_autoscaler("kv-utilisation", {"target": 0.7})
    assert scaler.desired(signals(replicas=3, ready=3, kv_utilisation=0.95))[0] == 5  # ceil(3 x 0.95 / 0.7) = ceil(4.07)


def test_predictive_provisions_for_the_forecast_rate_a_cold_start_ahead():
    scaler = make_autoscaler("predictive", {"target_in_flight": 10.0, "alpha": 0.5, "beta": 0.5})
    # A ramp of 1, 2, 3 req/s with 20 requests in system at 2 and 3 req/s (10 s and 6.67 s in system).
    scaler.desired(signals(arrival_rate_per_s=1.0))  # level 1, trend 0
    scaler.desired(signals(arrival_rate_per_s=2.0, queued=20))
    wanted, reason = scaler.desired(signals(arrival_rate_per_s=3.0, queued=20))
    # Holt: level 0.5*2 + 0.5*(1+0) = 1.5, trend 0.5*0.5 + 0 = 0.25; then level 0.5*3 + 0.5*1.75 = 2.375,
    # trend 0.5*0.875 + 0.5*0.25 = 0.5625. Ahead (90 + 10) / 10 = 10 intervals: 2.375 + 5.625 = 8 req/s.
    # Seconds in system: 10, then 0.5*6.667 + 0.5*10 = 8.333. In flight then 8 x 8.333 = 66.7: 7 replicas.
    assert wanted == math.ceil(8.0 * (0.5 * 20 / 3 + 0.5 * 10) / 10.0) == 7
    assert "forecast 8.00 req/s" in reason


def test_a_users_autoscaler_file(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("from sim.fleet.autoscalers import Autoscaler\n\n"
                    "class Twice(Autoscaler):\n    name = 'twice'\n"
                    "    def desired(self, signals):\n        return 2 * max(signals.replicas, 1), 'twice'\n")
    assert make_autoscaler(f"{path}:Twice").desired(signals(replicas=3))[0] == 6


def test_the_window_holds_the_highest_count_asked_for_within_it():
    window = WindowMax(30.0, 0.0, 1)
    # 4 at 10 s outlasts the 2 after it and is held through 40 s (the window's edge counts); then the 2 at 20 s,
    # then the 1 at 41 s.
    held = [window.push(now, count) for now, count in [(10.0, 4), (20.0, 2), (40.0, 1), (41.0, 1), (51.0, 0)]]
    assert held == [4, 4, 4, 2, 1]
    window.clear()  # scaled to zero: nothing asked for before counts
    assert window.push(60.0, 0) == 0


STEPS = st.lists(st.one_of(st.just("clear"), st.tuples(st.sampled_from([0.0, 0.001, 0.1, 1.0, 14.9, 15.0, 15.1, 300.0]),
                                                       st.integers(0, 12))), max_size=200)


@settings(max_examples=300, deadline=None)
@given(span_s=st.sampled_from([0.0, 0.001, 15.0, 300.0]), start=st.integers(0, 12), steps=STEPS)
def window_is_the_brute_force_maximum(span_s, start, steps):
    window = WindowMax(span_s, 0.0, start)
    asked = [(0.0, start)]  # every count since the last clear: the whole window the controller once kept
    now = 0.0
    for step in steps:
        if step == "clear":
            window.clear()
            asked.clear()
            continue
        gap_s, count = step
        now += gap_s
        asked.append((now, count))
        assert window.push(now, count) == max(c for t, c in asked if not t < now - span_s)
        kept = [c for _, c in window.kept]
        assert kept == sorted(set(kept), reverse=True)  # falling: at most one entry a distinct count


def test_the_windows_maximum_is_the_brute_force_maximum_on_random_decisions():
    with wall_clock_limit(120):
        window_is_the_brute_force_maximum()


def test_a_window_of_many_decisions_keeps_one_entry_a_distinct_count():
    # Decisions every 1 ms in the 300 s window (interval_s at its minimum): 100,000 asks, all within the window, of 5
    # counts (2, 4, 1, 3, 0 over and over). A window that kept them all took the maximum over 100,000 each time.
    window = WindowMax(300.0, 0.0, 1)
    held = [window.push(i * 0.001, i * 7 % 5) for i in range(1, 100_001)]
    assert held[:3] == [2, 4, 4] and held[-1] == 4
    assert [count for _, count in window.kept] == [4, 3, 0]


def _pools(*pools, **cluster):
    return {"pools": list(pools), **cluster}


POOL = {"name": "a", "nodes": 1, "max_nodes": 2, "gpus_per_node": 2}


@pytest.mark.parametrize("overrides, expected", [
    ({"cluster": _pools({**POOL, "gpus_per_node": 0})}, "cluster.pools.0.gpus_per_node"),
    ({"cluster": _pools({**POOL, "min_nodes": 3, "max_nodes": 2})}, "min_nodes 3 is more than max_nodes 2"),
    ({"cluster": _pools({**POOL, "nodes": 3})}, "nodes 3 must lie between"),
    ({"cluster": _pools({**POOL, "price_per_gpu_hour": -1})}, "cluster.pools.0.price_per_gpu_hour"),
    ({"cluster": _pools(POOL, POOL)}, "pools named twice: a"),
    ({"cluster": _pools(POOL, nodes=2)}, "give nodes per pool"),
    ({"cluster": _pools({**POOL, "profile": "no-such-gpu"})}, "unknown profile"),
    ({"cluster": _pools()}, "cluster.pools"),
    ({"cold_start": {"provision_s": -5}}, "cold_start.provision_s"),
    ({"cold_start": {"registry_gb_per_s": 0}}, "cold_start.registry_gb_per_s"),
    ({"autoscaler": {"name": "no-such-scaler"}}, "unknown autoscaler 'no-such-scaler'"),
    ({"autoscaler": {"name": "queue-depth", "params": {"bogus": 1}}}, "bogus"),
    ({"autoscaler": {"name": "queue-depth", "params": {"target": "four"}}}, "autoscaler.params.target"),
    ({"autoscaler": {"name": "predictive", "min_replicas": 4, "max_replicas": 2}}, "min_replicas 4 is more than"),
    ({"autoscaler": {"name": "predictive", "scale_to_zero_idle_s": {"nope": 60}}}, "not a model of this scenario"),
    ({"autoscaler": {"name": "predictive", "scale_to_zero_idle_s": -1}}, "positive number of seconds"),
])
def test_bad_fleet_input_is_one_line_and_exit_2(tmp_path, overrides, expected):
    scenario = tmp_path / "bad.yaml"
    scenario.write_text(json.dumps(scenario_dict(**overrides)))
    code, output = cli("run", scenario, "--out", tmp_path / "out")
    assert code == 2, output
    assert expected in output and "Traceback" not in output and len(output.strip().splitlines()) == 1, output
    assert not (tmp_path / "out").exists()


def test_an_unknown_autoscaler_on_the_command_line_is_exit_2(tmp_path):
    scenario = tmp_path / "ok.yaml"
    scenario.write_text(json.dumps(scenario_dict()))
    code, output = cli("run", scenario, "--autoscaler", "sometimes", "--out", tmp_path / "out")
    assert code == 2 and "unknown autoscaler 'sometimes'" in output and "Traceback" not in output


def test_an_autoscaler_file_named_in_a_scenario_needs_permission(tmp_path):
    scenario = tmp_path / "ok.yaml"
    scenario.write_text(json.dumps(scenario_dict(autoscaler={"name": f"{tmp_path}/mine.py:Mine"})))
    (tmp_path / "mine.py").write_text("from pathlib import Path\nPath(__file__).with_name('ran').write_text('yes')\n")
    code, output = cli("run", scenario, "--out", tmp_path / "out")
    assert code == 2 and "--allow-policy-files" in output
    # compare runs the policies it is given, but the scenario's autoscaler all the same (it ran the file unasked)
    code, output = cli("compare", scenario, "--policies", "static", "--runs-dir", tmp_path / "runs",
                       "--out", tmp_path / "r.html")
    assert code == 2 and "--allow-policy-files" in output, output
    assert not (tmp_path / "ran").exists() and not (tmp_path / "r.html").exists()


def test_autoscalers_are_listed():
    code, output = cli("autoscalers", "list")
    assert code == 0
    for name in ("none", "utilisation", "queue-depth", "kv-utilisation", "predictive"):
        assert name in output
