"""Experiment policies that drive the engine through the paper's two experiments.

They decide only (load, unload, route); the engine charges every cost, so the
numbers they produce come from the profile, exactly as in ``mmsim run``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.errors import MmsimError
from sim.policies.base import Policy
from sim.policies.registry import register

if TYPE_CHECKING:
    from sim.engine.instance import Instance
    from sim.engine.request import Request


def numbered_gpu(view, index: float):
    """The cluster's GPU ``index`` (the ``gpu`` parameter of the paper's policies)."""
    if not 0 <= index < len(view.gpus):  # a whole number: check_params refuses others
        raise MmsimError(f"is {index}; the cluster has GPUs 0 to {len(view.gpus) - 1}", field="policy.params.gpu")
    return view.gpus[int(index)]


@register
class PaperPreemption(Policy):
    """The paper's preemption experiment on one GPU: job A is interrupted once by job B.

    Job A (the first request of ``model_a``) runs alone on GPU ``gpu``. Once it has
    generated ``preempt_after`` tokens, its KV cache is swapped to host RAM and A is
    unloaded; ``model_b`` is loaded, job B (the next request) runs to completion, B is
    unloaded, A is reloaded and its KV swapped back in, and A finishes. With
    ``preempt_after`` 0, A runs uninterrupted (the baseline).
    """

    name = "paper-preemption"
    description = "Paper experiment: one job interrupted once after N tokens by a job of another model."

    # As the scenario gives them: check_params lets a whole float (1000.0) through where the default is an int.
    model_a: str
    model_b: str
    preempt_after: float
    gpu: float

    @classmethod
    def param_defaults(cls) -> dict:
        return {"model_a": "qwen3-8b", "model_b": "qwen3-8b", "preempt_after": 1000, "gpu": 0}

    def setup(self, view) -> None:
        self.a, self.b = view.model_index(self.model_a), view.model_index(self.model_b)
        self.device = numbered_gpu(view, self.gpu)
        self.preempt_tokens = int(self.preempt_after)
        self.job_a: Request | None = None
        self.job_b: Request | None = None
        self.instance_b: Instance | None = None
        self.timer_set = False
        self.interrupted = False
        self.tokens_at_preemption = 0
        self.instance_a = view.load(self.a, self.device)
        self.first_instance_a = self.instance_a

    def route(self, request, view):
        # Jobs are told apart by order (A first), so A and B may be the same model.
        if self.job_a is None and request.model == self.a:
            self.job_a = request
        elif self.job_b is None and request is not self.job_a:
            self.job_b = request
        if request is self.job_a and self.instance_a is not None:
            return self.instance_a
        if request is self.job_b and self.instance_b is not None:
            return self.instance_b
        return None

    def on_instance_ready(self, instance, view) -> None:
        job = self.job_a if instance is self.instance_a else self.job_b if instance is self.instance_b else None
        if job is not None and job in view.pending(job.model):
            view.assign(job, instance)

    def on_step(self, instance, view) -> None:
        if self.timer_set or self.preempt_tokens <= 0 or instance is not self.first_instance_a:
            return
        if self.job_a is None or instance.generated(self.job_a) < 1:
            return
        # The first token is out (prefill done): decode iteration k ends steps_s(C, 1, k) later. Fire
        # halfway through iteration preempt_after - 1, so the unload's cut lands on the boundary after
        # which A holds exactly preempt_after tokens (fast-forward windows end at iteration boundaries).
        self.timer_set = True
        coefficients = view.costs(self.a).step_coefficients(1, instance.gpu_share)
        context, done = instance.context_tokens, self.preempt_tokens - 2
        at = view.now + coefficients.steps_s(context, 1, done) + 0.5 * coefficients.step_s(context + done)
        view.call_at(at, lambda v: v.unload(self.instance_a, mode="swap"))

    def on_evicted(self, instance, requests, view) -> None:
        if instance is self.first_instance_a:
            assert self.job_a is not None  # only A's preemption timer (on_step, once A runs) evicts from it
            self.tokens_at_preemption = self.job_a.generated

    def on_unloaded(self, instance, view) -> None:
        if instance is self.first_instance_a:
            self.instance_a = None
            self.instance_b = view.load(self.b, self.device)
        elif instance is self.instance_b:
            self.instance_b = None
            self.instance_a = view.load(self.a, self.device)

    def on_finish(self, request, instance, view) -> None:
        if request is self.job_b:
            view.unload(instance, mode="swap")


@register
class PaperOffload(Policy):
    """The paper's offload experiment: the first model loaded on GPU ``gpu`` with ``gpu_share`` of its layers."""

    name = "paper-offload"
    description = "Paper experiment: one model partly offloaded to the CPU (GPU layer share), single requests."

    gpu_share: float
    gpu: float

    @classmethod
    def param_defaults(cls) -> dict:
        return {"gpu_share": 1.0, "gpu": 0}

    def setup(self, view) -> None:
        view.load(0, numbered_gpu(view, self.gpu), gpu_share=self.gpu_share)
