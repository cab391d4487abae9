"""The README's "Scenario format" example runs as written and drops only what its deployments cannot hold."""

from __future__ import annotations

from pathlib import Path

import yaml

from sim.scenario import parse_scenario
from sim.simulation import simulate

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_scenario() -> dict:
    text = README.read_text()
    section = text[text.index("### Scenario format"):]
    return yaml.safe_load(section.split("```yaml", 1)[1].split("```", 1)[0])


def test_the_readme_example_drops_only_requests_longer_than_max_model_len():
    result = simulate(parse_scenario(readme_scenario(), "README.md"))
    summary, requests = result.summary, result.requests
    assert summary["requests_completed"] > 0.99 * summary["requests_total"]
    assert set(summary["drop_reasons"]) <= {"exceeds_max_model_len"}
    for model, figures in summary["per_model"].items():
        rows = requests[requests["model"] == model]
        too_long = rows["prompt_tokens"] + rows["output_tokens"] > figures["max_model_len"]
        assert (rows.loc[too_long, "drop_reason"] == "exceeds_max_model_len").all(), model
        assert (rows.loc[~too_long, "status"] == "completed").all(), model
        assert figures["drop_reasons"] == ({"exceeds_max_model_len": int(too_long.sum())} if too_long.any() else {})
