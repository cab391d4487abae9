"""``offload-aware``: co-locate models by partial CPU offload instead of swapping, where that is cheap.

The paper measures that keeping some layers on the CPU slows decode
non-linearly and differently per model, and that long outputs suffer most
(every one of their tokens pays the slowdown). So this policy, built on
``swap-aware``'s residency rules, adds one option before evicting anything:

* a model absent from the GPUs whose pending requests are all *short*
  (predicted output ≤ ``short_output_tokens``) is loaded into the largest
  free gap with the biggest GPU layer share g that leaves
  ``kv_reserve_tokens`` of KV room — if g ≥ ``min_gpu_share`` and the
  offload slowdown ``decode_step_s(1, ctx, g) / decode_step_s(1, ctx, s)`` at
  the requests' mean prompt length is at most ``max_slowdown`` (s: the
  deployment's ``gpu_share``, a whole copy's; g < s). No one is evicted, no
  swap penalty is paid.
* *long* requests are only routed to whole copies; if their model has none,
  they wait and the swap-aware rule brings in a whole copy (evicting, if the
  gain pays for it, even the model's own partial copy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sim.policies.base import mypyc_attr
from sim.policies.fcfs_swap import unweighted_bytes
from sim.policies.registry import register
from sim.policies.swap_aware import SwapAwarePolicy

if TYPE_CHECKING:
    from sim.engine.gpu import Gpu
    from sim.engine.instance import Instance
    from sim.engine.request import Request
    from sim.policies.view import ClusterView


@mypyc_attr(allow_interpreted_subclasses=True)
class OffloadAwarePolicy(SwapAwarePolicy):
    name = "offload-aware"
    description = "Co-locate short-output models by partial CPU offload when the slowdown is mild; long requests get full residency."

    # Each parameter as the scenario gives it (sim.policies.registry.check_params checked it).
    short_output_tokens: Any
    max_slowdown: Any
    min_gpu_share: Any

    @classmethod
    def param_defaults(cls) -> dict[str, Any]:
        return {**super().param_defaults(), "short_output_tokens": 256, "max_slowdown": 1.4,
                "min_gpu_share": 0.5, "kv_reserve_tokens": 4096}

    @classmethod
    def param_limits(cls) -> dict[str, tuple[float, float]]:
        return {"max_slowdown": (1.0, 1e9), "min_gpu_share": (0.01, 1.0)}  # a slowdown, a share of the layers

    def is_long(self, request: Request) -> bool:
        return request.predicted_output_tokens > self.short_output_tokens

    def route(self, request: Request, view: ClusterView) -> Instance | None:
        if not self.is_long(request):
            return view.route(request)  # any ready or loading instance, offloaded ones included
        full = view.deployment_share(request.model)
        return view.route(request, [i for i in view.instances_of(request.model) if i.gpu_share >= full])

    def candidates(self, view: ClusterView) -> list[int]:
        """Models with pending requests and no instance able to take them (absent, or only offloaded copies for long requests)."""
        def blocked(model: int) -> bool:
            if not view.pending_count(model):
                return False
            live = view.instances_of(model)
            full = view.deployment_share(model)
            return not live or not any(i.gpu_share >= full for i in live)

        models = [m for m in range(len(view.model_names)) if blocked(m)]
        return sorted(models, key=lambda m: (-self.gain_s(view, m), m))

    def place_in_free_memory(self, view: ClusterView, model: int) -> bool:
        if super().place_in_free_memory(view, model):
            return True
        pending = view.pending(model)
        if view.instances_of(model) or any(self.is_long(r) for r in pending):
            return False
        share, gpu = self.best_partial_share(view, model)
        if gpu is None:
            return False
        costs = view.costs(model)
        context = sum(r.prompt_tokens for r in pending) / len(pending)
        slowdown = costs.decode_step_s(1, context, share) / costs.decode_step_s(1, context, view.deployment_share(model))
        return slowdown <= self.max_slowdown and view.load(model, gpu, gpu_share=share) is not None

    def best_partial_share(self, view: ClusterView, model: int) -> tuple[float, Gpu | None]:
        """The largest layer share (whole layers, ≥ ``min_gpu_share``) that fits a free gap with KV room (what
        :meth:`kv_reserve_bytes` asks: a partial copy without room for its oldest pending request to start would be
        unloaded again to make room for it, and loaded again, for ever), and that GPU."""
        costs = view.costs(model)
        reserve = self.kv_reserve_bytes(view, model)
        layers = costs.num_layers
        below = costs.gpu_layers(view.deployment_share(model)) - 1  # a partial copy holds fewer layers than a whole one
        best_share, best_gpu = 0.0, None
        one_layer = view.footprint_bytes(model, 1 / layers)
        for gpu in view.gpus:
            if unweighted_bytes(gpu) - reserve < one_layer:
                continue  # not one layer fits, whatever the KV: settled without a sync
            view.sync(gpu)
            room = gpu.free_bytes() - gpu.in_flight_bytes() - reserve
            # A footprint grows with the layers: the most that fit are found by bisection, not one count at a time.
            fits, over = 0, below + 1  # fits: the most layers known to fit (0: none); over: the fewest known not to
            while over - fits > 1:
                middle = (fits + over) // 2
                if view.footprint_bytes(model, middle / layers) <= room:
                    fits = middle
                else:
                    over = middle
            share = fits / layers
            if fits and share >= self.min_gpu_share and share > best_share:
                best_share, best_gpu = share, gpu
        return best_share, best_gpu


register(OffloadAwarePolicy)  # by a call, not a decorator: mypyc compiles only undecorated classes to native ones
