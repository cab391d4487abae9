"""Which runs may be ranked together: the same scenario (apart from policy and seed), profile and engine build,
and each (policy, seed) once. Mixed runs are refused, or split into groups shown one after another."""

from __future__ import annotations

from sim.errors import MmsimError
from sim.reports.data import RunData
from sim.schema import with_defaults

IGNORED_SCENARIO_FIELDS = ("policy", "seed", "autoscaler")
"""What a comparison varies on purpose; every other scenario field must match."""


def comparison_key(run: RunData) -> dict:
    """The fields that must match between compared runs, in the order a difference is reported. A field the
    run's scenario.json lacks (written before the field existed) counts as the current schema's default."""
    if run.scenario is not None:
        scenario = with_defaults(run.scenario)
    else:
        scenario = {"name": run.summary.get("scenario")}
    return {"profile": run.summary.get("profile"), "engine_build": run.summary.get("engine_build"),
            "scenario": {k: v for k, v in scenario.items() if k not in IGNORED_SCENARIO_FIELDS}}


class _Absent:
    """A field one of two compared values lacks (and the schema has no default for)."""

    def __repr__(self) -> str:
        return "absent"


ABSENT = _Absent()


def first_difference(a: object, b: object, path: str = "") -> tuple[str, object, object] | None:
    """The dotted path of the first field where ``a`` and ``b`` differ, with both values (None when equal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            found = first_difference(a.get(key, ABSENT), b.get(key, ABSENT), f"{path}.{key}" if path else str(key))
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{path}.{i}")
            if found:
                return found
        return None
    return None if a == b else (path, a, b)


def _short(value: object, quoted: bool = True) -> str:
    text = repr(value) if quoted else str(value)
    return text if len(text) <= 48 else text[:45] + "..."


def check_unique(runs: list[RunData]) -> None:
    """Refuse the same (policy, seed) twice: a glob that names one run twice would double-count it."""
    seen: dict[tuple[str, int], RunData] = {}
    for run in runs:
        key = (run.policy, run.seed)
        if key in seen:
            raise MmsimError(f"policy {run.policy} seed {run.seed} appears twice ({seen[key].path} and {run.path}); "
                             "give each run once")
        seen[key] = run


def check_comparable(runs: list[RunData]) -> None:
    """Raise one MmsimError naming the first field that differs between the runs (and both folders)."""
    reference = runs[0]
    key = comparison_key(reference)
    for run in runs[1:]:
        found = first_difference(key, comparison_key(run))
        if found:
            field, mine, theirs = found
            raise MmsimError(f"runs are not comparable: {field} is {_short(mine)} in {reference.path} but "
                             f"{_short(theirs)} in {run.path}; report on runs of one scenario (apart from policy "
                             "and seed), profile and engine build, or pass --allow-mixed to show them as separate groups")


def comparable_groups(runs: list[RunData]) -> list[tuple[str, list[RunData]]]:
    """Runs split into comparable groups (in order of first appearance), each labelled by what sets it apart."""
    groups: list[tuple[dict, list[RunData]]] = []
    for run in runs:
        key = comparison_key(run)
        for existing, members in groups:
            if first_difference(existing, key) is None:
                members.append(run)
                break
        else:
            groups.append((key, [run]))
    labelled = []
    for key, members in groups:
        parts: list[str] = []
        for other, _ in groups:
            found = first_difference(key, other) if other is not key else None
            if found and not any(part.startswith(found[0] + " ") for part in parts):
                parts.append(f"{found[0]} {_short(found[1], quoted=False)}")
        labelled.append((" · ".join(parts) or "all runs", members))
    return labelled
