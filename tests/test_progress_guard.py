"""The progress guard: a policy that loops without serving anyone is stopped with a diagnosis, never left to hang."""

from __future__ import annotations

import subprocess
import textwrap

import numpy as np
import pytest

from sim.engine.progress import NoProgress
from sim.scenario import parse_scenario
from sim.simulation import simulate
from sim.workload.chunk import RequestChunk

from conftest import MMSIM_CLI, scenario_dict

LOOPING_POLICIES = textwrap.dedent('''
    from sim.policies.base import Policy


    class Thrash(Policy):
        """Unloads every model the moment it is ready and loads it again: never a token."""

        name = "thrash"

        def setup(self, view):
            view.load(0, view.gpus[0])

        def route(self, request, view):
            return None

        def on_instance_ready(self, instance, view):
            view.unload(instance)

        def on_unloaded(self, instance, view):
            view.load(instance.model, instance.gpu)


    class Restart(Policy):
        """Unloads its model (its requests' KV dropped, to be recomputed) at the end of each first step after a
        load, and loads it again: the one prompt's first chunk is prefilled over and over."""

        name = "restart"

        def setup(self, view):
            view.load(0, view.gpus[0])

        def on_step(self, instance, view):
            view.unload(instance, mode="recompute")

        def on_unloaded(self, instance, view):
            view.load(instance.model, instance.gpu)


    class Dither(Policy):
        """Never places anything and re-checks every second, for ever."""

        name = "dither"

        def route(self, request, view):
            return None

        def on_arrival(self, request, view):
            self.tick(view)

        def tick(self, view):
            view.call_at(view.now + 1.0, self.tick)
''')


@pytest.fixture
def policy_file(tmp_path):
    path = tmp_path / "looping.py"
    path.write_text(LOOPING_POLICIES)
    return path


def one_request() -> list[RequestChunk]:
    return [RequestChunk(np.array([1.0]), np.array(["qwen2.5-3b"]), np.array([100]), np.array([10]))]


def scenario(**engine):
    return parse_scenario(scenario_dict(engine={"max_num_seqs": 8, **engine}), "test")


def test_models_loaded_over_and_over_stop_the_run_naming_the_policy_and_model(policy_file):
    with pytest.raises(NoProgress) as stopped:
        simulate(scenario(progress_max_loads=50), policy=f"{policy_file}:Thrash", chunks=one_request())
    message = str(stopped.value)
    assert message.startswith("thrash: no progress (no token computed, no prompt prefilled further) since t=1.0 s")
    # Setup's first load came before the arrival that starts the count: all 50 counted are reloads.
    assert "50 model loads in that time, 50 of them reloads: qwen2.5-3b (50 loads, 50 unloads)" in message
    assert "unloads) is loaded and unloaded over and over" in message


def test_time_passing_without_a_token_stops_the_run_at_the_horizon(policy_file):
    with pytest.raises(NoProgress) as stopped:
        simulate(scenario(progress_horizon_s=120.0), policy=f"{policy_file}:Dither", chunks=one_request())
    message = str(stopped.value)
    assert "dither: no progress (no token computed, no prompt prefilled further) since t=1.0 s" in message
    assert "1 request outstanding" in message and "qwen2.5-3b unplaced: 1" in message
    now = float(message.split("(now t=")[1].split(" s)")[0].replace(",", ""))
    assert 120.0 < now <= 120.0 + 10.0  # caught at the first look after the horizon (sampled every 5 s or less)


def test_the_cli_exits_2_with_the_diagnosis_and_writes_nothing(policy_file, tmp_path):
    path = tmp_path / "scenario.yaml"
    import yaml
    data = scenario_dict(engine={"max_num_seqs": 8, "progress_max_loads": 20})
    data["workload"]["generator"]["duration_s"] = 5
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    done = subprocess.run([*MMSIM_CLI, "run", str(path),
                           "--policy", f"{policy_file}:Thrash", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert "thrash: no progress" in done.stderr + done.stdout
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("mode", ["fast", "exact"])
def test_a_long_decode_window_is_progress(mode):
    # One request decoding for about 20 s on its own: fast mode runs it as one window, which samples (syncing
    # the GPU) must count as progress at each iteration's end, as per-iteration mode does; a horizon of 5 s
    # then never passes.
    scenario = parse_scenario(scenario_dict(models=[{"name": "qwen2.5-3b"}], engine={"progress_horizon_s": 5.0},
                                            sample_interval_s=1.0), "test")
    chunks = [RequestChunk(np.array([0.5]), np.array(["qwen2.5-3b"]), np.array([100]), np.array([2000]))]
    result = simulate(scenario, chunks=chunks, mode=mode)
    row = result.requests.iloc[0]
    assert row["status"] == "completed" and row["finish_s"] - row["first_token_s"] > 10.0


@pytest.mark.parametrize("mode", ["fast", "exact"])
def test_prefill_chunks_of_a_long_prompt_are_progress_even_each_longer_than_the_horizon(mode):
    # An 8,000-token prompt in 256-token chunks: 32 chunks before its first token, each far longer than a horizon
    # of two milliseconds (and sampled in its middle). Each takes the prompt further than it ever got, so the run
    # is making progress the whole time and must serve the request.
    scenario = parse_scenario(scenario_dict(models=[{"name": "qwen2.5-3b"}], sample_interval_s=0.001,
                                            engine={"max_num_seqs": 8, "max_num_batched_tokens": 256,
                                                    "progress_horizon_s": 0.002}), "test")
    chunks = [RequestChunk(np.array([60.0]), np.array(["qwen2.5-3b"]), np.array([8000]), np.array([3]))]  # loaded
    result = simulate(scenario, chunks=chunks, mode=mode)
    row = result.requests.iloc[0]
    assert row["status"] == "completed" and row["first_token_s"] - row["arrival_s"] > 32 * 0.002


def test_the_same_chunk_prefilled_over_and_over_is_no_progress(policy_file):
    # Restart unloads the model after each first chunk (recompute) and loads it again: after the first pass,
    # every chunk recomputes what was prefilled before, so the reloads since then stop the run.
    scenario = parse_scenario(scenario_dict(models=[{"name": "qwen2.5-3b"}],
                                            engine={"max_num_seqs": 8, "max_num_batched_tokens": 256,
                                                    "progress_max_loads": 20}), "test")
    chunks = [RequestChunk(np.array([0.5]), np.array(["qwen2.5-3b"]), np.array([8000]), np.array([3]))]
    with pytest.raises(NoProgress, match="restart: no progress .* 20 of them reloads"):
        simulate(scenario, policy=f"{policy_file}:Restart", chunks=chunks)


def requests_at(times, models):
    n = len(times)
    return [RequestChunk(np.array(times, float), np.array(models, object), np.full(n, 100), np.full(n, 10))]


@pytest.mark.parametrize("policy", ["static", "swap-aware", "time-slice", "fcfs-swap"])
def test_a_quiet_gap_between_arrivals_is_no_loop(policy):
    # Two requests 20,000 s apart, far past the 3,600 s horizon: the first finishes in seconds, then nothing is
    # outstanding until the second arrives, which then runs as the first did.
    scenario = parse_scenario(scenario_dict(), "test")
    result = simulate(scenario, policy=policy, chunks=requests_at([1.0, 20_000.0], ["qwen3-8b", "qwen3-8b"]))
    frame = result.requests
    assert list(frame["status"]) == ["completed", "completed"]
    assert frame["finish_s"].iloc[1] > 20_000.0



def test_a_request_static_never_places_does_not_stop_the_run_across_a_lull():
    # One GPU holds qwen2.5-14b (static places it first); qwen3-8b's request at t=1 can never be served. The
    # other model is quiet from t~7 to t=5,000, past the 3,600 s horizon: nothing but arrivals happens in that
    # time (no load, timer or computation), so nothing loops, and the run must end with that request dropped.
    scenario = parse_scenario(scenario_dict(cluster={"nodes": 1, "gpus_per_node": 1, "host_memory_gb": 64},
                                            models=[{"name": "qwen2.5-14b"}, {"name": "qwen3-8b"}]), "test")
    chunks = requests_at([1.0, 1.0, 5000.0], ["qwen2.5-14b", "qwen3-8b", "qwen2.5-14b"])
    frame = simulate(scenario, policy="static", chunks=chunks).requests
    assert list(frame["status"]) == ["completed", "dropped", "completed"]
    assert frame["drop_reason"].iloc[1] == "not_placed" and frame["finish_s"].iloc[2] > 5000.0


def test_a_policy_timer_in_a_lull_is_still_watched(policy_file):
    # Dither re-checks every second and never places: timers fire in the lull, so it is no quiet time.
    with pytest.raises(NoProgress):
        simulate(scenario(progress_horizon_s=60.0), policy=f"{policy_file}:Dither",
                 chunks=requests_at([1.0, 5000.0], ["qwen2.5-3b", "qwen2.5-3b"]))


def test_a_large_clusters_first_placement_is_no_loop():
    # 256 nodes x 8 GPUs: static loads a model on each of the 2,048 GPUs before any token, twice the default
    # limit of 1,000; only reloads (loads of a model unloaded since the last token) count towards it.
    models = [{"name": "qwen2.5-3b"}, {"name": "qwen3-8b"}, {"name": "mistral-7b"}]
    scenario = parse_scenario(scenario_dict(cluster={"nodes": 256, "gpus_per_node": 8, "host_memory_gb": 64},
                                            models=models), "test")
    result = simulate(scenario, policy="static", chunks=requests_at([1.0, 2.0], ["qwen3-8b", "mistral-7b"]))
    loads = result.events[result.events["kind"] == "load"]
    assert len(loads) == 2048 and loads["gpu"].nunique() == 2048
    assert loads["model"].value_counts().min() >= 1 and set(loads["model"]) == {m["name"] for m in models}
    assert list(result.requests["status"]) == ["completed", "completed"]
