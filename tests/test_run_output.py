"""A run's tables and summary without pandas: what ``mmsim run`` imports, what its Parquet files hold, and the
summary figures against pandas' own computation of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from sim.engine.recorder import Recorder
from sim.engine.request import LOSS_CAUSES, Request
from sim.results import RequestTable, write_run
from sim.scenario import parse_scenario
from sim.simulation import simulate
from tests.conftest import MMSIM_CLI, REPO, scenario_dict

RUN_PATH_CHECK = textwrap.dedent("""
    import json, sys
    from sim.cli import main
    try:
        main(sys.argv[1:])
    except SystemExit as done:
        assert not done.code, done.code
    heavy = ("pandas", "matplotlib", "ray", "torch", "scipy", "pyarrow.compute")
    print(json.dumps([name for name in heavy if name in sys.modules]))
""")


def _run_in_fresh_process(tmp_path, scenario: dict) -> list[str]:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario))
    done = subprocess.run([sys.executable, "-c", RUN_PATH_CHECK, "run", str(path), "--out", str(tmp_path / "run"),
                           "--json"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "requests.parquet").is_file()
    return json.loads(done.stdout.splitlines()[-1])


def test_mmsim_run_imports_no_pandas_or_plotting(tmp_path):
    assert _run_in_fresh_process(tmp_path, scenario_dict()) == []


def test_lengths_from_a_csv_of_whole_numbers_need_no_pandas(tmp_path):
    (tmp_path / "pairs.csv").write_text("num_prefill_tokens,num_decode_tokens\n" + "".join(
        f"{100 + k},{20 + k % 7}\n" for k in range(50)))
    scenario = scenario_dict()
    generator = scenario["workload"]["generator"]
    generator["prompt_tokens"] = generator["output_tokens"] = {"dist": "empirical", "path": str(tmp_path / "pairs.csv")}
    assert _run_in_fresh_process(tmp_path, scenario) == []


@pytest.fixture(scope="module", params=["static", "fcfs-swap"])
def busy_run(request):
    """Several models and, between the two policies, drops and time lost to every cause: each code path of the
    summary and of the files."""
    data = yaml.safe_load((REPO / "scenarios" / "mixed.yaml").read_text())
    data["workload"]["generator"]["duration_s"] = 150
    return simulate(parse_scenario(data, "mixed"), base_dir=REPO / "scenarios", policy=request.param)


def test_parquet_files_hold_the_frames(busy_run, tmp_path):
    write_run(busy_run, tmp_path)
    for name, frame in (("requests", busy_run.requests), ("events", busy_run.events),
                        ("timeseries", busy_run.timeseries)):
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / f"{name}.parquet"), frame, check_exact=True, obj=name)
    schema = pq.read_schema(tmp_path / "requests.parquet")
    assert schema.field("model").type == pa.dictionary(pa.int8(), pa.string())
    assert schema.field("status").type == pa.large_string()
    table = pq.read_table(tmp_path / "requests.parquet")
    # NaN times (never scheduled, no first token) are nulls in the file, as pandas writes them.
    assert table.column("first_token_s").null_count == int(busy_run.requests["first_token_s"].isna().sum())


def test_summary_figures_are_what_pandas_computes(busy_run, tmp_path):
    """The figures the summary used to compute with pandas, computed so here, equal the numpy ones exactly."""
    summary, frame = busy_run.summary, busy_run.requests
    assert summary["preemptions"] > 0 and (summary["requests_dropped"] > 0 or min(summary["lost_seconds"].values()) > 0)
    scenario = parse_scenario(yaml.safe_load((REPO / "scenarios" / "mixed.yaml").read_text()), "mixed")
    met = frame["status"].eq("completed")
    for model in frame["model"].cat.categories:
        slo, rows = scenario.slo_for(model), frame["model"].eq(model)
        for field in ("ttft_s", "tpot_s", "e2e_s"):
            if getattr(slo, field) is not None:
                values = frame[field].fillna(0.0 if field == "tpot_s" else np.inf)
                met &= ~rows | (values <= getattr(slo, field))
    assert summary["slo_attainment"] == float(met.mean())
    done = frame[frame["status"].eq("completed")]
    span = max(float(done["finish_s"].max()) - float(frame["arrival_s"].min()), 1e-12)
    assert summary["goodput_requests_per_s"] == float(met.sum()) / span
    assert summary["throughput_tokens_per_s"] == float(done["output_tokens"].sum()) / span
    for name in ("ttft_s", "tpot_s", "e2e_s", "queue_s"):
        data = done[name].dropna().to_numpy()
        assert summary[name] == {"mean": float(data.mean()), **dict(zip(("p50", "p90", "p99"),
                                                                        map(float, np.percentile(data, [50, 90, 99]))))}
    for cause in LOSS_CAUSES:
        assert summary["lost_seconds"][cause] == float(frame[f"lost_{cause}_s"].sum())
    dropped = frame.loc[frame["status"].eq("dropped"), "drop_reason"].value_counts()
    assert summary["drop_reasons"] == {str(k): int(v) for k, v in dropped.items() if v}
    for model, figures in summary["per_model"].items():
        part = frame[frame["model"].eq(model)]
        assert figures["requests"] == len(part) and figures["preemptions"] == int(part["preemptions"].sum())
        assert figures["slo_attainment"] == float(met[frame["model"].eq(model)].mean())
        ttft = part.loc[part["status"].eq("completed"), "ttft_s"].dropna()
        assert figures["ttft_s"]["p90"] == (float(np.percentile(ttft, 90)) if len(ttft) else None)


def _request(rid: int, lost: list[float], prompt_tokens: int = 10) -> Request:
    request = Request(rid, 0, float(rid), prompt_tokens, 5, 5)
    request.lost = lost
    request.finish_s = rid + 1.0
    return request


def test_the_recorder_keeps_losses_sparse_and_tables_come_out_in_id_order():
    recorder = Recorder(["m"])
    lost = [0.0] * len(LOSS_CAUSES)
    paused = [0.5, 0.0, 0.25, 0.0, 0.0, 1.0]
    for rid in (3, 0, 2, 1):  # requests end out of id order
        recorder.request(_request(rid, paused if rid == 2 else lost))
    assert len(recorder.lost_rows) == 1  # only the request that lost time keeps its losses
    table = RequestTable(recorder)
    assert table.column("id").tolist() == [0, 1, 2, 3]
    assert table.column("arrival_s").tolist() == [0.0, 1.0, 2.0, 3.0]
    for k, cause in enumerate(LOSS_CAUSES):
        assert table.column(f"lost_{cause}_s").tolist() == [0.0, 0.0, paused[k], 0.0]
    assert table.column("lost_waiting_s", slice(2, 4)).tolist() == [1.0, 0.0]


def test_the_recorder_widens_to_64_bits_for_a_huge_trace_length():
    recorder = Recorder(["m"])
    recorder.request(_request(0, [0.0] * len(LOSS_CAUSES)))
    recorder.request(_request(1, [0.0] * len(LOSS_CAUSES), prompt_tokens=1 << 40))
    assert RequestTable(recorder).column("prompt_tokens").tolist() == [10, 1 << 40]


def test_the_pyarrow_csv_reader_gives_what_the_general_reader_gives(tmp_path, monkeypatch):
    from sim.errors import MmsimError
    from sim.workload import lengths

    path = tmp_path / "pairs.csv"
    path.write_text("prompt_tokens,output_tokens,note\n5,0,x\n7,3,y\n9007199254740993,4,z\n12,9,w\n")
    fast = lengths.read_lengths(path, {"prompt": "prompt", "output": "output"})
    monkeypatch.setattr(lengths, "_whole_number_csv", lambda *_: None)
    general = lengths.read_lengths(path, {"prompt": "prompt", "output": "output"})
    assert {k: v.tolist() for k, v in fast.items()} == {k: v.tolist() for k, v in general.items()}
    monkeypatch.undo()
    path.write_text("prompt_tokens,output_tokens\n5,1\n-7,3\n")
    with pytest.raises(MmsimError, match="line 3"):  # a bad value is the general reader's to report
        lengths.read_lengths(path, {"prompt": "prompt", "output": "output"})


@pytest.mark.parametrize("policy", ["swap-aware", "slo-aware"])
def test_a_run_is_the_same_under_any_string_hash_seed(tmp_path, policy):
    """Python salts str hashes per process: a decision that followed a set's or a hash's order of model names would
    make the same seed give other results in another process."""
    tables = []
    for salt in ("1", "2"):
        out = tmp_path / f"run-{salt}"
        env = {**os.environ, "PYTHONHASHSEED": salt}
        done = subprocess.run([*MMSIM_CLI, "run", str(REPO / "scenarios" / "mixed.yaml"), "--policy", policy,
                               "--out", str(out)], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        tables.append([pq.read_table(out / name) for name in ("requests.parquet", "events.parquet")])
    assert all(a.equals(b) for a, b in zip(*tables))
