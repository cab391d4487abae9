"""An example user policy: shortest-predicted-job-first, loading absent models into free memory.

Run it with ``mmsim run scenarios/mixed.yaml --policy examples/my_policy.py:MyPolicy``.
It shows the whole policy API in a few lines: a class subclassing
``sim.policies.Policy`` that reads the cluster through the view it is handed
and acts only through the view's actions (load, unload, assign).

Being short, it has gaps a real policy must close: it never evicts a busy
model, and two models it packs with no KV room between them can each hold
queued work that neither can start (those requests end ``not_scheduled``;
the built-in swapping policies break such stalls, see docs/policies.md).
"""

from __future__ import annotations

from sim.policies import Policy


class MyPolicy(Policy):
    """Admit the shortest predicted outputs first; bring an absent model in, evicting an idle one if needed."""

    name = "my-policy"
    description = "Shortest predicted output first; load absent models, evicting only idle ones."

    @classmethod
    def param_defaults(cls) -> dict:
        return {"max_prompt_tokens_first": 4096}

    def setup(self, view) -> None:
        # Start with every model that fits, smallest first, each on the GPU with the most free memory.
        for model in sorted(range(len(view.model_names)), key=lambda m: view.costs(m).weight_bytes()):
            self.load_somewhere(model, view)

    # The order below is a sort by a key of the requests alone, so two waiting requests never change places as
    # time passes: saying so lets fast-forward skip the boundaries at which the queue's head cannot start.
    waiting_order = "fixed-key"

    def order_waiting(self, instance, view) -> None:
        # Short jobs first (predicted lengths only: the true ones are unknown to a real scheduler);
        # very long prompts go after the rest so that one of them does not hold up many short ones.
        ordered = sorted(instance.waiting, key=lambda r: (r.prompt_tokens > self.max_prompt_tokens_first,
                                                           r.predicted_output_tokens, r.arrival_s, r.id))
        instance.waiting.clear()
        instance.waiting.extend(ordered)

    def on_arrival(self, request, view) -> None:
        if request.instance is None and not view.instances_of(request.model):
            self.load_somewhere(request.model, view)

    def on_finish(self, request, instance, view) -> None:
        for model in range(len(view.model_names)):
            if view.pending_count(model) and not view.instances_of(model):
                self.load_somewhere(model, view)

    def on_unloaded(self, instance, view) -> None:
        self.on_finish(None, instance, view)

    def load_somewhere(self, model: int, view) -> None:
        """Load ``model`` into free memory, or start unloading one idle instance to make room."""
        need = view.footprint_bytes(model)  # weights plus the activation reserve every instance keeps
        for gpu in view.gpus:
            view.sync(gpu)  # a fast-forwarding GPU's KV use is brought up to now before it is read
        fitting = [g for g in view.gpus if g.free_bytes() - g.in_flight_bytes() >= need]
        if fitting:
            view.load(model, max(fitting, key=lambda g: g.free_bytes()))
            return
        if any(i.status == "draining" for i in view.instances()):
            return  # memory is already being freed; on_unloaded tries again
        idle = [i for i in view.instances()
                if i.status == "ready" and not i.has_work and i.gpu.free_bytes() + i.resident_bytes >= need]
        if idle:
            view.unload(min(idle, key=lambda i: i.last_used_s), mode="swap")
