"""The engine's agendas (GPU step ends, samples; the compiled build's heap and the interpreted build's heapq)
merged with SimPy's queue come out in exactly the order SimPy itself would process the same entries as
Timeouts, moves included (a moved entry's old Timeout passed over)."""

from __future__ import annotations

import random

import pytest
import simpy

from sim.engine.events import Agenda, AgendaEntry, HeapAgenda, LazyAgenda, simpy_event_first


class Owner(AgendaEntry):
    def __init__(self, name: str, log: list[str]):
        super().__init__()
        self.name, self.log = name, log

    def entry_due(self, now: float) -> None:
        assert now == self.due_s
        self.log.append(self.name)


def plan(seed: int) -> list[tuple[str, str, float]]:
    """Random operations in schedule order: ('simpy', name, t), ('agenda', owner, t); times with many ties."""
    rng = random.Random(seed)
    return [(rng.choice(("simpy", "agenda")), f"o{rng.randrange(6)}", float(rng.randrange(8)))
            for _ in range(rng.randrange(1, 40))]


def through_agenda(operations: list[tuple[str, str, float]], kind: type[Agenda]) -> list[str]:
    env, log = simpy.Environment(), []
    agenda = kind(env)
    owners: dict[str, Owner] = {}
    for k, (kind, name, at_s) in enumerate(operations):
        if kind == "simpy":
            env.timeout(at_s).callbacks.append(lambda _, k=k: log.append(f"s{k}"))
        else:
            owner = owners.setdefault(name, Owner(name, log))
            agenda.schedule(owner, at_s)  # moves it if it was due already
    drain(env, agenda)
    return log


def drain(env: simpy.Environment, agenda: Agenda) -> None:
    """Process SimPy's queue and the agenda in merged order until both are empty."""
    while env._queue or agenda.first() is not None:
        due = agenda.first()
        if env._queue and (due is None or simpy_event_first(env._queue[0], due)):
            env.step()
        else:
            owner = agenda.pop()
            owner.entry_due(owner.due_s)


def through_simpy(operations: list[tuple[str, str, float]]) -> list[str]:
    """The reference: every entry a SimPy Timeout; an owner's earlier Timeout is stale once it is rescheduled."""
    env, log, live = simpy.Environment(), [], {}
    for k, (kind, name, at_s) in enumerate(operations):
        if kind == "simpy":
            env.timeout(at_s).callbacks.append(lambda _, k=k: log.append(f"s{k}"))
        else:
            live[name] = k

            def fire(_, name=name, k=k):
                if live.get(name) == k:
                    del live[name]
                    log.append(name)
            env.timeout(at_s).callbacks.append(fire)
    env.run()
    return log


@pytest.mark.parametrize("kind", [HeapAgenda, LazyAgenda])
@pytest.mark.parametrize("seed", range(300))
def test_the_agenda_keeps_simpys_order(seed, kind):
    operations = plan(seed)
    assert through_agenda(operations, kind) == through_simpy(operations)


@pytest.mark.parametrize("kind", [HeapAgenda, LazyAgenda])
def test_a_moved_entry_is_due_once_at_its_new_time(kind):
    agenda, owner = kind(simpy.Environment()), Owner("gpu", [])
    agenda.schedule(owner, 5.0)
    agenda.schedule(owner, 2.0)
    assert agenda.first() is owner and owner.due_s == 2.0
    assert agenda.pop() is owner and owner.slot == -1 and agenda.first() is None


def test_agendas_on_one_environment_draw_from_one_counter():
    """A second compiled-style agenda on the same environment must not restart SimPy's ids: entries made due in
    turn at one time keep the order they were made due in, SimPy's Timeout between them included."""
    env = simpy.Environment()
    first, second = HeapAgenda(env), HeapAgenda(env)
    early, late = Owner("early", []), Owner("late", [])
    first.schedule(early, 1.0)
    env.timeout(1.0)
    second.schedule(late, 1.0)
    assert early.due_eid < env._queue[0][2] < late.due_eid


@pytest.mark.parametrize("kind", [HeapAgenda, LazyAgenda])
def test_an_entry_scheduled_last_comes_after_all_else_at_its_time(kind):
    """The sampler's place: after every event due at its time, those scheduled after it included, and before
    anything later."""
    env, log = simpy.Environment(), []
    agenda = kind(env)
    sample, step, later = Owner("sample", log), Owner("step", log), Owner("later", log)
    agenda.schedule_last(sample, 1.0)
    agenda.schedule(later, 1.5)
    env.timeout(1.0).callbacks.append(lambda _: log.append("timeout"))
    agenda.schedule(step, 1.0)
    drain(env, agenda)
    assert log == ["timeout", "step", "sample", "later"]
