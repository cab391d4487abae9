"""The scenario's workload section: validation, model names, and the request stream the engine reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from sim.errors import MmsimError
from sim.workload.columns import concat, make_chunk
from sim.workload.config import TRACE_FORMATS, WorkloadConfig
from sim.workload.importers import FORMATS
from sim.workload.stream import iter_requests, model_names
from sim.workload.writer import write_trace

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"
DESIGN_EXAMPLE = """
generator:
  duration_s: 600
  arrivals: {process: poisson, rate_per_s: 4.0}
  mix: {qwen2.5-3b: 0.5, qwen3-8b: 0.3, qwen2.5-14b: 0.2}
  prompt_tokens: {dist: lognormal, mean: 1000, cv: 1.0}
  output_tokens: {dist: lognormal, mean: 250, cv: 1.0}
"""


def workload(text: str = DESIGN_EXAMPLE, **extra) -> WorkloadConfig:
    return WorkloadConfig.model_validate({**yaml.safe_load(text), **extra})


def stream(config: WorkloadConfig, base_dir: Path = Path("."), rows: int = 65536, seed: int = 7):
    return list(iter_requests(config, seed=seed, base_dir=base_dir, chunk_rows=rows))


def test_design_example_loads_and_streams():
    config = workload()
    assert config.time_scale == 1.0 and config.output_length_error == 0.0
    assert model_names(config) == ["qwen2.5-3b", "qwen3-8b", "qwen2.5-14b"]
    chunks = stream(config, rows=500)
    trace = concat(chunks)
    assert [chunk.first_id for chunk in chunks] == list(range(0, len(trace), 500))
    assert len(trace) == pytest.approx(2400, rel=0.1) and trace.arrival_s.max() < 600
    assert np.all(np.diff(trace.arrival_s) >= 0)


@pytest.mark.parametrize("change, where", [
    ({"generator": None}, "exactly one of generator or trace"),
    ({"trace": {"path": "x.csv"}}, "exactly one of generator or trace"),
    ({"colour": 1}, "colour"),
])
def test_top_level_errors(change, where):
    data = yaml.safe_load(DESIGN_EXAMPLE)
    data.update(change)
    with pytest.raises(ValidationError, match=where):
        WorkloadConfig.model_validate(data)


@pytest.mark.parametrize("path, value, location", [
    (("arrivals",), {"process": "gamma", "rate_per_s": 4}, ("generator", "arrivals", "gamma", "cv")),
    (("arrivals",), {"process": "weird", "rate_per_s": 4}, ("generator", "arrivals")),
    (("arrivals",), {"process": "rate-series", "windows": [[0, 1], [0, 2]]}, ("generator", "arrivals", "rate-series", "windows")),
    (("prompt_tokens",), {"dist": "uniform", "low": 5, "high": 2}, ("generator", "prompt_tokens", "uniform")),
    (("prompt_tokens",), {"dist": "constant", "value": 0}, ("generator", "prompt_tokens", "constant", "value")),
    (("mix",), {}, ("generator", "mix")),
    (("duration_s",), None, ("generator",)),
])
def test_generator_errors_name_the_field(path, value, location):
    data = yaml.safe_load(DESIGN_EXAMPLE)
    data["generator"][path[0]] = value
    with pytest.raises(ValidationError) as error:
        WorkloadConfig.model_validate(data)
    assert tuple(error.value.errors()[0]["loc"])[: len(location)] == location


def test_trace_config_errors():
    with pytest.raises(ValidationError, match="arrivals is needed"):
        WorkloadConfig.model_validate({"trace": {"path": "p.csv", "format": "length-pairs", "model": "qwen3-8b"}})
    with pytest.raises(ValidationError, match="model or model_map"):
        WorkloadConfig.model_validate({"trace": {"path": "p.csv", "model": "a", "model_map": {"b": "c"}}})
    with pytest.raises(ValidationError):
        WorkloadConfig.model_validate({"trace": {"path": "p.csv", "format": "azure-2025"}})
    assert set(TRACE_FORMATS) == set(FORMATS)


def test_rate_override_and_time_scale_scale_the_load():
    base = workload()
    faster = workload()
    faster.generator.arrivals.rate_per_s = 8.0  # what the sweep tool does
    scaled = workload(time_scale=0.5)
    count = len(concat(stream(base)))
    assert len(concat(stream(faster))) == pytest.approx(2 * count, rel=0.08)
    np.testing.assert_allclose(concat(stream(scaled)).arrival_s, concat(stream(base)).arrival_s * 0.5)


def test_trace_paths_resolve_against_base_dir_then_cwd(tmp_path, monkeypatch):
    folder = tmp_path / "scenarios"
    folder.mkdir()
    write_trace([make_chunk([0.0, 1.0, 2.0], ["qwen3-8b"] * 3, [1, 2, 3], [4, 5, 6])], folder / "t.csv")
    config = WorkloadConfig.model_validate({"trace": {"path": "t.csv"}, "time_scale": 2.0})
    assert model_names(config) is None
    assert concat(stream(config, base_dir=folder)).arrival_s.tolist() == [0.0, 2.0, 4.0]
    monkeypatch.chdir(folder)
    assert len(concat(stream(config, base_dir=tmp_path))) == 3
    missing = WorkloadConfig.model_validate({"trace": {"path": "nope.csv"}})
    with pytest.raises(MmsimError, match="workload.trace.path: file 'nope.csv' not found"):
        stream(missing, base_dir=tmp_path)


def test_bad_trace_file_names_file_and_line(tmp_path):
    (tmp_path / "t.csv").write_text("arrival_s,model,prompt_tokens,output_tokens\n0,a,1,1\n1,a,x,1\n")
    config = WorkloadConfig.model_validate({"trace": {"path": "t.csv"}})
    with pytest.raises(MmsimError, match=r"t.csv: line 3: prompt_tokens 'x' is not a whole number >= 1"):
        stream(config, base_dir=tmp_path)


@pytest.mark.skipif(not SHARED.is_dir(), reason="public traces not present")
def test_importer_formats_stream_directly():
    config = WorkloadConfig.model_validate({"trace": {
        "path": str(SHARED / "burstgpt" / "BurstGPT_first42rows_from_hf_viewer.csv"), "format": "burstgpt",
        "model_map": {"ChatGPT": "qwen3-8b", "GPT-4": "qwen2.5-14b"}, "end_s": 1000}})
    assert model_names(config) == ["qwen2.5-14b", "qwen3-8b"]
    trace = concat(stream(config))
    assert len(trace) == 18 and trace.arrival_s.max() < 1000  # stamps 5..974 of the file
    pairs = WorkloadConfig.model_validate({"trace": {
        "path": "sharegpt_vidur/sharegpt_8k_filtered_stats_llama2_tokenizer.csv", "format": "length-pairs",
        "model": "qwen3-8b", "arrivals": {"process": "poisson", "rate_per_s": 100}, "end_s": 60}})
    assert model_names(pairs) == ["qwen3-8b"]
    assert len(concat(stream(pairs, base_dir=SHARED))) == pytest.approx(6000, rel=0.1)
