"""An autoscaler of one's own with memory that does not say when it is at rest: the controller judges by its answers."""

from sim.fleet.autoscalers import Autoscaler


class Halving(Autoscaler):
    """Asks for replicas for the requests in system plus half of what it asked for last time (rounded down)."""

    name = "halving"

    def __init__(self, **params):
        super().__init__(**params)
        self.asked: dict[str, int] = {}

    def desired(self, signals):
        wanted = max(signals.in_system, self.asked.get(signals.model, signals.replicas) // 2)
        self.asked[signals.model] = wanted
        return wanted, f"in system {signals.in_system}, last ask halved"
