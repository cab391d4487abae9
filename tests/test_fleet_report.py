"""The report's fleet section: its cost over time adds up to what the run billed, and it renders in headless
Chromium with both figures on screen and no script errors."""

from __future__ import annotations

import pytest
import yaml

from sim.reports.compare import compare
from sim.reports.data import by_policy, load_run
from sim.reports.fleet import billed_gpus, cost_to_date

from conftest import wall_clock_limit
from test_browser import PREFIX_PROBE, probe_section

SCENARIO = {
    "name": "fleet-report", "seed": 2, "profile": "h100-sxm",
    "cluster": {"pools": [{"name": "h100", "nodes": 1, "min_nodes": 1, "max_nodes": 3, "gpus_per_node": 1,
                           "price_per_gpu_hour": 2.5}]},
    "models": [{"name": "llama-3-8b"}],
    "workload": {"generator": {"duration_s": 700,
                               "arrivals": {"process": "rate-series", "windows": [[0, 1.0], [60, 30.0], [250, 1.0]]},
                               "mix": {"llama-3-8b": 1.0}, "prompt_tokens": {"dist": "constant", "value": 400},
                               "output_tokens": {"dist": "constant", "value": 300}}},
    "engine": {"max_num_seqs": 16},
    "cold_start": {"provision_s": 20, "image_gb": 2, "registry_gb_per_s": 1, "runtime_start_s": 5,
                   "weight_fetch_gb_per_s": 4, "deserialise_gb_per_s": 4, "warm_up_s": 5},
    "autoscaler": {"name": "queue-depth", "interval_s": 10, "scale_down_window_s": 60, "node_idle_s": 30},
}
FLEET_PROBE = PREFIX_PROBE.replace("'Prefix cache'", "'Fleet and cost'").replace(".prefix-instances", ".fleet-cost")


@pytest.fixture(scope="module")
def fleet_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet-report")
    path = root / "fleet.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    with wall_clock_limit(240):
        out, runs = compare(path, ["static", "slo-aware"], seeds=1, out=root / "fleet.html", runs_dir=root / "runs",
                            show_progress=False)
    return out, root / "runs"


def test_cost_over_time_adds_up_to_what_the_run_billed(fleet_report):
    _, runs_dir = fleet_report
    for run_dir in sorted(runs_dir.iterdir()):
        run = load_run(run_dir)
        fleet = run.summary["fleet"]
        assert fleet["nodes_provisioned"] >= 1 and fleet["nodes_released"] >= 1  # the spike came and went
        times, gpus, rates = billed_gpus(run)
        # From the billing events alone, against the summary's per-node accounting.
        assert cost_to_date(times, rates)[-1] == pytest.approx(fleet["cost_usd"], rel=1e-9)
        assert gpus.max() == fleet["pools"]["h100"]["nodes_peak"] and gpus[0] == 1 and gpus[-1] >= 1
        assert by_policy([run])  # grouped under "policy + autoscaler"
        assert next(iter(by_policy([run]))).endswith("+ queue-depth")


def test_fleet_section_is_shown_without_script_errors(fleet_report, tmp_path):
    report, _ = fleet_report
    seen = probe_section(report, FLEET_PROBE, tmp_path)
    assert seen["errors"] == []
    billed, spent = seen["panels"]
    assert "GPUs billed" in billed["text"] and "US$ spent to date" in spent["text"]
    for panel in (billed, spent):
        assert panel["shown"] and panel["width"] > 200 and panel["height"] > 120, panel
        assert 0 <= panel["left"] and panel["right"] <= seen["innerWidth"] and 0 <= panel["top"] < seen["innerHeight"]
        assert "static + queue-depth" in panel["text"] and "slo-aware + queue-depth" in panel["text"]
        assert panel["paths"] > 4
    assert "h100 $2.50" in seen["caption"]
    assert len(seen["tableRows"]) == 2 and all("$" not in row for row in seen["tableRows"])
