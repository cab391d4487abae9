"""Fuzzing the inputs: generated scenarios, traces, profiles and flags never crash, hang or leave output behind.

For every generated case the command must exit 0 or 2, print no traceback, finish within a time bound, and
after exit 2 print one ``error:`` line and leave nothing at ``--out`` (nor a temporary beside it). Cases are
mutations of tiny valid inputs (so valid ones finish in well under a second) with values drawn from the
edges: non-finite and huge numbers, numbers as text, booleans, wrong shapes, bad bytes.

About 440 cases run by default (derandomized, so CI is repeatable); ``MMSIM_FUZZ_SCALE=10`` runs ten times
as many, with fresh random draws.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_bad_input import PROFILE, TRACE_HEADER, cli, tiny_scenario

ROOT = Path(__file__).resolve().parents[1]
SCALE = float(os.environ.get("MMSIM_FUZZ_SCALE", "1"))
CASE_TIMEOUT_S = 20.0


def fuzz_settings(examples: int):
    return settings(max_examples=max(1, int(examples * SCALE)), deadline=None, database=None,
                    derandomize=SCALE == 1, suppress_health_check=list(HealthCheck))


EDGE_VALUES = st.sampled_from([
    -1, 0, 1, 3, 0.5, 1e-300, 1e18, 2**63, -(2**63), 1e308, float("inf"), float("-inf"), float("nan"),
    True, False, None, "16e9", "abc", "", "\ud800", [], {}, [1, 2], {"a": 1}, "x" * 300,
])
FLAG_VALUES = st.sampled_from(["-1", "0", "1", "2", "9", "3.5", "1e308", "inf", "-inf", "nan", "abc", "", "1e-300",
                               "9" * 30])


def check_outcome(code: int, text: str, out: Path, folder: Path, inputs: set[str]) -> None:
    """The contract every case must meet."""
    assert code in (0, 2), text
    assert "Traceback" not in text, text
    if code == 2:
        lines = [line for line in text.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), text
        assert not out.exists(), f"{out} left behind after exit 2: {text}"
    strays = {p.name for p in folder.iterdir()} - inputs - {out.name}
    assert not strays, f"left behind: {strays}"


def _paths(node, prefix=()):
    """Every (path, value) in a nested structure, containers included."""
    yield prefix, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, (*prefix, index))


def _set(data, path, value):
    node = data
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


def _get(data, path):
    for part in path:
        data = data[part]
    return data


def _delete(data, path):
    node = data
    for part in path[:-1]:
        node = node[part]
    del node[path[-1]]


@st.composite
def mutated(draw, base):
    """``base`` with a few leaves replaced by edge values, keys dropped or added, or sections made scalars."""
    data = copy.deepcopy(base)
    for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2, 3]))):
        paths = [path for path, _ in _paths(data) if path]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["value", "value", "scale", "scale", "delete", "extra"]))
        current = _get(data, path)
        if action == "scale" and isinstance(current, (int, float)) and not isinstance(current, bool):
            _set(data, path, type(current)(current * draw(st.sampled_from([0, 0.5, 2, 10]))))
        elif action in ("value", "scale"):
            _set(data, path, copy.deepcopy(draw(EDGE_VALUES)))  # the pool's lists and dicts must stay empty
        elif action == "delete":
            _delete(data, path)
        else:
            node = data
            for part in path[:-1]:
                node = node[part]
            if isinstance(node, dict):
                node[draw(st.sampled_from(["typo", "seed", "rate_per_s", "cv"]))] = copy.deepcopy(draw(EDGE_VALUES))
    return data


@st.composite
def damaged_text(draw, text: str):
    """The text unchanged, truncated, with a line repeated, or with bad bytes spliced in."""
    data = text.encode("utf-8", "surrogatepass")
    kind = draw(st.sampled_from(["none"] * 6 + ["truncate", "repeat", "bytes"]))
    if kind == "truncate":
        data = data[: draw(st.integers(0, len(data)))]
    elif kind == "repeat":
        lines = data.splitlines(keepends=True)
        index = draw(st.integers(0, max(0, len(lines) - 1)))
        data = b"".join(lines[: index + 1] + lines[index:])
    elif kind == "bytes":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from([b"\xff", b"\x99\x01\xfe\xff", b"\x00", b"[" * 200, b": :", b"\t"])) + data[at:]
    return data


def _dump_yaml(data) -> str:
    return yaml.safe_dump(data, allow_unicode=False)


def shipped_base(name: str) -> dict:
    """A shipped scenario cut to 40 generated requests: its own fields (gamma arrivals, offload, fleets, SLOs per
    model) are what the tiny scenario lacks."""
    scenario = yaml.safe_load((ROOT / "scenarios" / f"{name}.yaml").read_text())
    generator = scenario["workload"]["generator"]
    generator.pop("duration_s", None)
    generator["max_requests"] = 40
    return scenario


BASES = [tiny_scenario(), *(shipped_base(name) for name in ("mixed", "offload", "mixed-fleet"))]


@fuzz_settings(160)
@given(st.data())
def test_fuzz_scenarios(data):
    scenario = data.draw(mutated(data.draw(st.sampled_from(BASES))))
    content = data.draw(damaged_text(_dump_yaml(scenario)))
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "s.yaml").write_bytes(content)
        out = folder / "out"
        code, text = cli("run", folder / "s.yaml", "--out", out, "--json", timeout_s=CASE_TIMEOUT_S)
        check_outcome(code, text, out, folder, {"s.yaml"})


def mostly(valid: list[str], invalid: list[str]):
    """A value that is valid three times out of four."""
    return st.one_of(st.sampled_from(valid), st.sampled_from(valid), st.sampled_from(valid), st.sampled_from(invalid))


ARRIVALS = mostly(["0", "0.5", "1", "2.5", "1e6"], ["-1", "1e300", "inf", "nan", "", "abc", "2e9", "true", '"1'])
MODELS = mostly(["qwen2.5-3b"], ["gpt-9", "", "qwen\udcff", '"a,b"', "x" * 200, "qwen3-8b"])
TOKENS = mostly(["1", "10", "64", "300"], ["0", "-5", "1.5", "1e18", str(2**40), "x", "", "true", "nan", '"'])


@st.composite
def trace_files(draw):
    """(file name, bytes) of a small native trace, CSV or JSONL, maybe gzipped and maybe damaged."""
    rows = draw(st.lists(st.tuples(ARRIVALS, MODELS, TOKENS, TOKENS), min_size=1, max_size=4))
    rows.sort(key=lambda row: draw(st.sampled_from([0, 0, 0, 1])))  # mostly in the order drawn
    kind = draw(st.sampled_from(["csv", "jsonl"]))
    if kind == "csv":
        text = TRACE_HEADER + "".join(",".join(row) + "\n" for row in rows)
    else:
        def value(cell):
            try:
                return json.loads(cell)
            except ValueError:
                return cell
        keys = ("arrival_s", "model", "prompt_tokens", "output_tokens")
        text = "".join(json.dumps(dict(zip(keys, map(value, row)))) + "\n" for row in rows)
    content = draw(damaged_text(text))
    if draw(st.sampled_from([False, False, False, True])):
        packed = gzip.compress(content)
        return f"t.{kind}.gz", packed[: draw(st.sampled_from([len(packed), len(packed), len(packed) // 2, 5]))]
    return f"t.{kind}", content


@fuzz_settings(100)
@given(trace_files(), st.sampled_from(["stats", "import", "run"]))
def test_fuzz_traces(trace, command):
    name, content = trace
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / name).write_bytes(content)
        inputs = {name}
        if command == "stats":
            out = folder / "none"
            args = ["trace", "stats", folder / name, "--json"]
        elif command == "import":
            out = folder / "o.csv"
            args = ["trace", "import", "mmsim", folder / name, out]
        else:
            out = folder / "out"
            (folder / "s.yaml").write_text(_dump_yaml(tiny_scenario(workload={"trace": {"path": name}})))
            inputs.add("s.yaml")
            args = ["run", folder / "s.yaml", "--out", out, "--json"]
        code, text = cli(*args, timeout_s=CASE_TIMEOUT_S)
        check_outcome(code, text, out, folder, inputs)


PROFILE_DATA = json.loads(PROFILE.read_text())


@fuzz_settings(60)
@given(st.data())
def test_fuzz_profiles(data):
    profile = data.draw(mutated(PROFILE_DATA))
    content = data.draw(damaged_text(json.dumps(profile, indent=1)))
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "p.json").write_bytes(content)
        (folder / "s.yaml").write_text(_dump_yaml(tiny_scenario()))
        out = folder / "out"
        code, text = cli("run", folder / "s.yaml", "--profile", folder / "p.json", "--out", out, "--json",
                         timeout_s=CASE_TIMEOUT_S)
        check_outcome(code, text, out, folder, {"p.json", "s.yaml"})


GENERATE_FLAGS = {
    "--duration": FLAG_VALUES, "--rate": FLAG_VALUES, "--max-requests": FLAG_VALUES, "--seed": FLAG_VALUES,
    "--cv": FLAG_VALUES, "--process": st.sampled_from(["poisson", "gamma", "rate-series", "servegen", "bogus"]),
    "--windows": st.sampled_from(["0:1", "0:inf", "a:b", "0:1:0", "5:1,1:2", "0:1e308"]),
    "--mix": st.sampled_from(["qwen3-8b=1", "qwen3-8b=1", "nosuch=1", "qwen3-8b=inf", "qwen3-8b=-1", "=", "x",
                              "qwen3-8b=1,qwen2.5-3b=0", "qwen3-8b=[1]"]),
    "--prompt": st.sampled_from(["constant,value=5", "lognormal,mean=1e308,cv=1", "uniform,low=5,high=1",
                                 "constant,value=[1]", "lognormal,mean=20,cv=inf", "empirical,path=/dev/zero"]),
}
IMPORT_FLAGS = {"--time-scale": FLAG_VALUES, "--start": FLAG_VALUES, "--end": FLAG_VALUES,
                "--model": st.sampled_from(["qwen3-8b", "gpt-9", ""]),
                "--model-map": st.sampled_from(["qwen3-8b=qwen2.5-3b", "a=b", "x", "qwen3-8b=gpt-9"])}
RUN_FLAGS = {"--seed": FLAG_VALUES, "--mode": st.sampled_from(["fast", "exact", "slow"]),
             "--policy": st.sampled_from(["static", "swap-aware", "no-such", "x.py:Y"]),
             "--profile": st.sampled_from(["paper-a6000", "h100-sxm", "nope", "/dev/zero"])}


@st.composite
def flag_sets(draw, choices: dict):
    names = draw(st.lists(st.sampled_from(sorted(choices)), unique=True, max_size=len(choices)))
    return [part for name in names for part in (name, draw(choices[name]))]


@fuzz_settings(120)
@given(st.sampled_from(["generate", "import", "run"]), st.data())
def test_fuzz_flags(command, data):
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "t.csv").write_text(TRACE_HEADER + "0.5,qwen3-8b,10,5\n1.5,qwen3-8b,12,4\n")
        (folder / "s.yaml").write_text(_dump_yaml(tiny_scenario()))
        if command == "generate":
            out = folder / "g.csv"
            args = ["trace", "generate", "--out", out, *data.draw(flag_sets(GENERATE_FLAGS))]
        elif command == "import":
            out = folder / "o.csv"
            args = ["trace", "import", "mmsim", folder / "t.csv", out, *data.draw(flag_sets(IMPORT_FLAGS))]
        else:
            out = folder / "out"
            args = ["run", folder / "s.yaml", "--out", out, "--json", *data.draw(flag_sets(RUN_FLAGS))]
        code, text = cli(*args, timeout_s=CASE_TIMEOUT_S)
        check_outcome(code, text, out, folder, {"t.csv", "s.yaml"})

