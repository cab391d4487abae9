"""The calibration's probes and the validation's replays through a stand-in engine (no vLLM needed): every probe's
prompt length is run once, so that each step holding a prefill is priced as a first run of its size, as served
prompts of any length meet the engine; a level replayed several times is compared by the replays' mean."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from calibrate.vllm_engine import EngineLimits, StepRecord
from calibrate.vllm_probes import Prober, plan_for


class StandInEngine:
    """Requests prefill whole in one step, then decode together one token a step; what the prober sees of vLLM."""

    def __init__(self, limits: EngineLimits):
        self.limits = limits
        self.requests: dict[str, list[int]] = {}  # id -> [prompt, outputs left, prefilled]
        self.prompts: list[int] = []

    def add(self, request_id: str, prompt_tokens: int, output_tokens: int) -> None:
        assert prompt_tokens + output_tokens <= self.limits.max_model_len
        self.requests[request_id] = [prompt_tokens, output_tokens, 0]
        self.prompts.append(prompt_tokens)

    def abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.requests.pop(rid, None)

    def has_work(self) -> bool:
        return bool(self.requests)

    def step(self) -> StepRecord:
        record = StepRecord(0.01, 0.009, 0.008)
        for rid, state in list(self.requests.items()):
            if state[2]:
                record.decode_contexts.append(state[0] + 1)
            else:
                record.prefills.append((state[0], 0))
                state[2] = 1
            state[1] -= 1
            if state[1] <= 0:
                del self.requests[rid]
        return record


def step_sizes(steps) -> Counter:
    """How often each token count ran among the steps holding a prefill."""
    return Counter(sum(t for t, _ in step.prefills) + len(step.decode_contexts) for _, step in steps if step.prefills)


def test_every_sampled_step_holding_a_prefill_is_a_size_run_for_the_first_time():
    limits = EngineLimits()
    plan = plan_for(True, limits)
    prober = Prober(StandInEngine(limits))  # type: ignore[arg-type]  # the prober drives any engine like this
    prober.warm_up(plan)
    warmed = step_sizes([("warm-up", StepRecord(0, 0, 0, prefills=[(p, 0)])) for p in prober.engine.prompts])
    for index in range(plan.passes):
        prober.run_pass(plan, index, lambda what: None)
    sampled = step_sizes(prober.steps)
    assert max(sampled.values()) == 1, [size for size, count in sampled.items() if count > 1]
    assert not set(sampled) & set(warmed)
    for prompt in plan.prefill_prompts:  # one token longer each pass
        assert all(sampled[prompt + k] == 1 for k in range(1, plan.passes + 1)) and not sampled[prompt]


def test_the_longest_lengthened_prompt_still_fits_the_model_length():
    limits = EngineLimits(max_model_len=1024)
    plan = plan_for(True, limits)
    engine = StandInEngine(limits)
    for index in range(plan.passes):
        Prober(engine).run_pass(plan, index, lambda what: None)  # type: ignore[arg-type]
    assert max(engine.prompts) < limits.max_model_len


class TimedStandInEngine(StandInEngine):
    """The stand-in engine with a wall clock: each step takes ``step_s`` and ends at the time it returns."""

    device = "cpu"

    def __init__(self, limits: EngineLimits, step_s: float):
        super().__init__(limits)
        self.step_s = step_s

    def step(self) -> StepRecord:
        import time

        started = time.perf_counter()
        waiting = {rid for rid, state in self.requests.items() if not state[2]}
        left = {rid: state[1] for rid, state in self.requests.items()}
        record = super().step()
        while time.perf_counter() - started < self.step_s:
            pass
        record.end_s = time.perf_counter()
        record.wall_s = record.end_s - started
        record.first_tokens = sorted(waiting)
        record.finished = sorted(rid for rid, outputs in left.items() if outputs <= 1)
        return record


def test_a_level_replayed_twice_is_compared_by_the_mean_of_its_replays(tmp_path):
    """validate_levels on a stand-in engine, two replays a level: the real figures are the replays' means, the
    spread is (largest - smallest) / mean of each metric, and every request's times are averaged."""
    import numpy as np

    from calibrate import vllm_validate as validate
    from sim.catalogue import get_model

    profile = Path(__file__).parents[1] / "sim/data/profiles/paper-rtx5000.json"
    trace = validate.Trace(np.array([0.0, 0.01, 0.03, 0.05]), np.array([40, 80, 20, 60]), np.array([5, 3, 8, 4]))
    replays = []
    real_replay = validate.replay

    def recorded(*args, **kwargs):
        replays.append(real_replay(*args, **kwargs))
        return replays[-1]

    engine = TimedStandInEngine(EngineLimits(), step_s=0.002)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(validate, "replay", recorded)
        result = validate.validate_levels(engine, trace, [1.0], get_model("qwen2.5-3b"), None, "fp16", profile,
                                          EngineLimits(), lambda what: None, repeats=2)
    level = result["levels"][0]
    assert level["replays"] == 2 and len(replays) == 2
    by_replay = [validate.metrics(frame) for frame in replays]
    for name in validate.METRICS:
        values = [m[name] for m in by_replay]
        assert level["real"][name] == pytest.approx(np.mean(values), rel=1e-12)
        assert level["replay_spread_pct"][name] == pytest.approx(100 * (max(values) - min(values)) / np.mean(values),
                                                                 abs=0.006)
    mean_e2e = np.mean([(f["finish_s"] - f["arrival_s"]).to_numpy() for f in replays], axis=0)
    assert level["per_request"]["real_e2e_s"] == pytest.approx(mean_e2e, abs=2e-6)
    assert level["real"]["requests"] == 4
