"""The mypyc-compiled engine (what ``pip install .`` ships) gives the pure-Python engine's results, bit for bit.

The engine and the built-in policies are compiled from a copy of this checkout into a temporary folder,
then the same runs are made with each build (the compiled one in a subprocess) and compared column by
column. The runs cover every built-in policy and the mechanisms they use: KV swap and recompute, loads
and unloads, a host-RAM weight cache, partial offload; and a user's policies, plain Python, that extend a
compiled built-in (one with its own admission order for the compiled sort).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.scenario import parse_scenario, read_yaml
from sim.simulation import simulate
from sim.sweep.axis_paths import set_path
from sim.workload.chunk import RequestChunk

ROOT = Path(__file__).resolve().parents[1]
# (scenario, policy, params, seconds of workload, mode): short runs, but each makes its policy act ("user": USER_POLICY).
POLICIES = ("static", "fcfs-swap", "time-slice", "swap-aware", "offload-aware", "slo-aware")
RUNS = [("mixed.yaml", name, None, 240.0, "fast") for name in POLICIES] + [
    ("mixed.yaml", "swap-aware", {"keep_weights_on_host": True}, 240.0, "fast"),
    ("mixed.yaml", "swap-aware", None, 120.0, "exact"),
    ("offload.yaml", "offload-aware", None, 120.0, "fast"),
    ("paper-preemption.yaml", None, None, None, "fast"),
    ("mixed.yaml", "user", None, 240.0, "fast"),
    ("mixed.yaml", "user-order", None, 240.0, "fast"),
]
USER_POLICY = textwrap.dedent("""
    from sim.policies.swap_aware import SwapAwarePolicy


    class Alternating(SwapAwarePolicy):
        \"\"\"A user's subclass of a compiled built-in: its own hooks, interpreted, around the compiled ones.\"\"\"

        name = "alternating"

        def __init__(self, **params):
            super().__init__(**params)
            self.finished = 0

        def order_waiting(self, instance, view):
            super().order_waiting(instance, view)
            if self.finished % 2:  # after every other completion, oldest first instead
                ordered = sorted(instance.waiting, key=lambda r: (r.arrival_s, r.id))
                instance.waiting.clear()
                instance.waiting.extend(ordered)

        def on_finish(self, request, instance, view):
            self.finished += 1
            super().on_finish(request, instance, view)


    from sim.policies.base import QueueOrder, sort_queue
    from sim.policies.slo_aware import SloAwarePolicy


    class LongestPromptFirst(QueueOrder):
        \"\"\"A user's admission order for the compiled ``sort_queue``: subclassing the compiled QueueOrder was refused
        ("interpreted classes cannot inherit from compiled") where the pure build took it.\"\"\"

        def before(self, a, b):
            return (-a.prompt_tokens, a.id) < (-b.prompt_tokens, b.id)


    class LongestFirst(SloAwarePolicy):
        name = "longest-first"
        waiting_order = "by-key"

        def order_waiting(self, instance, view):
            sort_queue(instance.waiting, LongestPromptFirst())
""")
COLUMNS = ["id", "status", "first_scheduled_s", "first_token_s", "finish_s", "preemptions", "gpu",
           "lost_reload_s", "lost_kv_out_s", "lost_recompute_s", "lost_waiting_s"]

RUNNER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import sim.engine.gpu, sim.policies.swap_aware
    assert sim.engine.gpu.__file__.endswith(".so"), sim.engine.gpu.__file__
    assert sim.policies.swap_aware.__file__.endswith(".so"), sim.policies.swap_aware.__file__
    sys.path.insert(0, sys.argv[1])
    from test_compiled import run_all
    run_all(Path(sys.argv[2]))
""")


def _scenario(name: str, duration_s: float | None):
    path = ROOT / "scenarios" / name
    data = read_yaml(path)
    if duration_s is not None:
        set_path(data, "workload.generator.duration_s", duration_s)
    return parse_scenario(data, str(path))


def run_all(out: Path) -> None:
    """Make every run in RUNS and write its requests (Parquet) and event counts (JSON) under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "user_policy.py").write_text(USER_POLICY)
    for k, (scenario, policy, params, duration_s, mode) in enumerate(RUNS):
        policy = {"user": f"{out / 'user_policy.py'}:Alternating",
                  "user-order": f"{out / 'user_policy.py'}:LongestFirst"}.get(policy, policy)
        result = simulate(_scenario(scenario, duration_s), base_dir=ROOT / "scenarios", policy=policy, params=params,
                          mode=mode)
        result.requests[COLUMNS].to_parquet(out / f"{k}.parquet")
        (out / f"{k}.json").write_text(json.dumps(result.events["kind"].value_counts().sort_index().to_dict()))
    result = simulate(_scenario("mixed.yaml", None), chunks=_numpy_id_chunks(), base_dir=ROOT / "scenarios",
                      policy="static")
    result.requests[COLUMNS].to_parquet(out / "numpy-ids.parquet")
    (out / "numpy-ids.json").write_text(json.dumps({"prefix_hit_tokens": result.summary["prefix_cache"]["prefix_hit_tokens"]}))


def _numpy_id_chunks() -> list[RequestChunk]:
    """Requests as a Python-API user may build them: prefix ids as numpy arrays (numpy integers), which the
    compiled engine's typed code refused until the arrival stream made them Python ints."""
    n = 40
    ids = np.empty(n, object)
    for i in range(n):
        ids[i] = np.array([i % 2, 7], dtype=np.int64) if i % 3 else (np.int64(i % 2), np.int64(7))
    return [RequestChunk(np.arange(n) * 0.5, np.array(["qwen2.5-3b"] * n), np.full(n, 1200), np.full(n, 40),
                         prefix_ids=ids)]


@pytest.fixture(scope="module")
def compiled_copy(tmp_path_factory) -> Path:
    pytest.importorskip("mypyc", reason="mypy (with mypyc) is in the test extra")
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no C compiler")
    build = tmp_path_factory.mktemp("compiled")
    shutil.copy(ROOT / "setup.py", build)
    shutil.copy(ROOT / "pyproject.toml", build)
    shutil.copytree(ROOT / "sim", build / "sim", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    env = {k: v for k, v in os.environ.items() if k != "MMSIM_PURE_PYTHON"}
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=build, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0 and list((build / "sim" / "engine").glob("gpu*.so")), done.stderr[-3000:]
    return build


def test_compiled_engine_gives_identical_results(compiled_copy, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(compiled_copy)}
    done = subprocess.run([sys.executable, "-c", RUNNER, str(Path(__file__).parent), str(tmp_path / "compiled")],
                          cwd=compiled_copy, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    run_all(tmp_path / "pure")
    for k, run in enumerate(RUNS):
        pure = pd.read_parquet(tmp_path / "pure" / f"{k}.parquet")
        compiled = pd.read_parquet(tmp_path / "compiled" / f"{k}.parquet")
        pd.testing.assert_frame_equal(pure, compiled, check_exact=True, obj=f"run {run}")
        assert json.loads((tmp_path / "pure" / f"{k}.json").read_text()) == \
            json.loads((tmp_path / "compiled" / f"{k}.json").read_text()), run
    pure, compiled = (pd.read_parquet(tmp_path / build / "numpy-ids.parquet") for build in ("pure", "compiled"))
    pd.testing.assert_frame_equal(pure, compiled, check_exact=True, obj="numpy prefix ids")
    hits = [json.loads((tmp_path / build / "numpy-ids.json").read_text()) for build in ("pure", "compiled")]
    assert hits[0] == hits[1] and hits[0]["prefix_hit_tokens"] > 0 and (pure["status"] == "completed").all()
