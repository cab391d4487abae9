"""The calibration's probe plan run through a stand-in engine: every probe's prompt length is run once, so that each
step holding a prefill is priced as a first run of its size, as served prompts of any length meet the engine."""

from __future__ import annotations

from collections import Counter

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
