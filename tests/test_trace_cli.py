"""``mmsim trace ...`` end to end, and the shipped traces' generator script."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import MMSIM_CLI, mmsim_in_process as mmsim

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT / ".." / "shared" / "traces"
AZURE = SHARED / "azure_llm_2023"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="public traces not present in ../shared/traces")


def stats_json(capsys, path) -> dict:
    code, out, err = mmsim(capsys, "trace", "stats", path, "--json")
    assert code == 0, err
    return json.loads(out)


@needs_shared
def test_import_merge_stats(tmp_path, capsys):
    code_trace, conv_trace, merged = tmp_path / "code.parquet", tmp_path / "conv.jsonl", tmp_path / "both.csv"
    code, out, _ = mmsim(capsys, "trace", "import", "azure-2023", AZURE / "AzureLLMInferenceTrace_code.csv",
                         code_trace, "--model", "qwen2.5-7b")
    assert code == 0 and "8,819 requests" in out
    code, _, _ = mmsim(capsys, "trace", "import", "azure-2023", AZURE / "AzureLLMInferenceTrace_conv.csv",
                       conv_trace, "--model", "qwen3-8b", "--end", "600", "--time-scale", "0.5")
    assert code == 0
    code, out, _ = mmsim(capsys, "trace", "merge", code_trace, conv_trace, merged)
    assert code == 0 and "from 2 traces" in out
    summary = stats_json(capsys, merged)
    conv = stats_json(capsys, conv_trace)
    assert conv["span_s"] < 300 and conv["models"] == {"qwen3-8b": 1.0}
    assert summary["requests"] == 8819 + conv["requests"]
    assert {"requests", "span_s", "rate_per_s", "interarrival_cv", "models"} <= set(summary)
    assert set(summary["prompt_tokens"]) >= {"mean", "p50", "p99"} and set(summary["output_tokens"]) >= {"mean", "p50", "p99"}
    assert summary["models"]["qwen2.5-7b"] == pytest.approx(8819 / summary["requests"])
    code, out, _ = mmsim(capsys, "trace", "stats", AZURE / "AzureLLMInferenceTrace_code.csv", "--format", "azure-2023",
                         "--plot", tmp_path / "code.png")
    assert code == 0 and "8819" in out and (tmp_path / "code.png").read_bytes()[:4] == b"\x89PNG"


@needs_shared
def test_import_burstgpt_and_length_pairs(tmp_path, capsys):
    code, out, _ = mmsim(capsys, "trace", "import", "burstgpt", SHARED / "burstgpt" / "BurstGPT_first42rows_from_hf_viewer.csv",
                         tmp_path / "b.csv", "--model-map", "ChatGPT=qwen3-8b,GPT-4=qwen2.5-14b")
    assert code == 0 and "38 requests from 42 rows" in out and "dropped 4 failed" in out
    code, out, _ = mmsim(capsys, "trace", "import", "length-pairs",
                         SHARED / "vidur_arxiv" / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
                         tmp_path / "p.parquet", "--model", "qwen3-8b", "--rate", "10", "--process", "gamma", "--cv", "2",
                         "--end", "100")
    assert code == 0
    summary = stats_json(capsys, tmp_path / "p.parquet")
    assert summary["requests"] == pytest.approx(1000, rel=0.3) and summary["span_s"] < 100


BAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,5,5\n2023-11-16 18:17:04,five,5\n"


@pytest.mark.parametrize("args, message", [
    (["trace", "import", "azure-2023", "{bad}", "{out}", "--model", "qwen3-8b"],
     "{bad}: line 3: ContextTokens 'five' is not a whole number >= 1"),
    (["trace", "import", "azure-2023", "{bad}", "{out}"], "azure-2023 traces have no model column"),
    (["trace", "import", "azure-2023", "{bad}", "{out}", "--model-map", "x"], "--model-map: expected NAME=VALUE"),
    (["trace", "import", "nope", "{bad}", "{out}", "--model", "qwen3-8b"], "unknown trace format 'nope'"),
    (["trace", "import", "azure-2023", "{bad}", "{out}", "--model", "qwen3-8b", "--rate", "3"], "length-pairs files only"),
    (["trace", "stats", "{bad}"], "unknown column 'TIMESTAMP'"),
    (["trace", "merge", "{bad}", "{out}"], "unknown column 'TIMESTAMP'"),
    (["trace", "generate", "--out", "{out}", "--duration", "5", "--rate", "0", "--mix", "qwen3-8b=1"],
         "--rate: Input should be greater than or equal to"),
    (["trace", "generate", "--out", "{out}", "--duration", "5", "--rate", "1"], "give the model mix"),
    # a name given twice, or a mix given both ways, silently kept one of the values
    (["trace", "generate", "--out", "{out}", "--duration", "5", "--rate", "1", "--mix", "qwen3-8b=1,qwen3-8b=2"],
     "--mix: 'qwen3-8b' is given twice"),
    (["trace", "generate", "--out", "{out}", "--duration", "5", "--rate", "1", "--mix", "qwen3-8b=1",
      "--prompt", "constant,value=5,value=7"], "--prompt: 'value' is given twice"),
    (["trace", "import", "azure-2023", "{bad}", "{out}", "--model-map", "a=qwen3-8b,a=qwen2.5-3b"],
     "--model-map: 'a' is given twice"),
    (["trace", "generate", "--out", "{out}", "--duration", "5", "--rate", "1", "--mix", "qwen3-8b=1", "--zipf", "1",
      "--models", "qwen3-8b"], "not both"),
    (["trace", "generate", "--out", "{out}", "--duration", "5", "--rate", "1", "--zipf", "1",
      "--models", "qwen3-8b,qwen2.5-3b,qwen3-8b"], "'qwen3-8b' is listed twice"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    bad, out = tmp_path / "bad.csv", tmp_path / "out.csv"
    bad.write_text(BAD)
    args = [arg.format(bad=bad, out=out) for arg in args]
    code, _, err = mmsim(capsys, *args)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert message.format(bad=bad) in err
    assert not out.exists()


def test_merge_refuses_to_write_over_an_input(tmp_path, capsys):
    """`trace merge a.csv b.csv b.csv` replaced the input b.csv with the merge, without a word."""
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    first.write_text("arrival_s,model,prompt_tokens,output_tokens\n0,qwen3-8b,10,5\n")
    second.write_text("arrival_s,model,prompt_tokens,output_tokens\n1,qwen2.5-3b,20,5\n")
    code, _, err = mmsim(capsys, "trace", "merge", first, second, second)
    assert code == 2 and "OUT is also an input" in err and "qwen3-8b" not in second.read_text()


def test_skip_bad_counts(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text(BAD)
    code, out, _ = mmsim(capsys, "trace", "import", "azure-2023", bad, tmp_path / "out.csv", "--model", "qwen3-8b",
                         "--skip-bad")
    assert code == 0 and "1 request from 2 rows" in out and "skipped 1 malformed row (first: line 3" in out


def test_generate_is_deterministic_and_reads_scenarios(tmp_path, capsys):
    args = ["trace", "generate", "--duration", "120", "--process", "gamma", "--rate", "5", "--cv", "2",
            "--zipf", "1.2", "--models", "qwen2.5-3b,qwen3-8b", "--prompt", "uniform,low=5,high=50", "--seed", "9"]
    for name in ("a.csv", "b.csv"):
        assert mmsim(capsys, *args, "--out", tmp_path / name)[0] == 0
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: s\nseed: 3\nworkload:\n  generator:\n    max_requests: 500\n"
                        "    arrivals: {process: rate-series, windows: [[0, 2], [60, 8, 2.0]]}\n"
                        "    mix: {qwen3-8b: 1}\n    prompt_tokens: {dist: constant, value: 64}\n"
                        "    output_tokens: {dist: lognormal, mean: 100, cv: 0.5}\n")
    code, out, _ = mmsim(capsys, "trace", "generate", "--config", scenario, "--out", tmp_path / "s.jsonl")
    assert code == 0 and "500 requests (seed 3)" in out
    summary = stats_json(capsys, tmp_path / "s.jsonl")
    assert summary["requests"] == 500 and summary["prompt_tokens"]["p50"] == 64
    code, _, _ = mmsim(capsys, "trace", "generate", "--config", scenario, "--out", tmp_path / "r.csv", "--rate", "50")
    assert code == 0 and stats_json(capsys, tmp_path / "r.csv")["span_s"] < summary["span_s"]


def test_generate_names_prefix_blocks_of_the_scenarios_size(tmp_path, capsys):
    # A scenario's conversations in 64-token blocks: the trace's ids must stand for 64 tokens each, as the
    # scenario's own run generates them (they were made for 512-token blocks whatever the scenario said).
    import pyarrow.parquet as pq

    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: s\nseed: 3\nworkload:\n  prefix_block_tokens: 64\n  generator:\n"
                        "    max_requests: 20\n    arrivals: {process: poisson, rate_per_s: 1}\n    mix: {qwen3-8b: 1}\n"
                        "    prompt_tokens: {dist: constant, value: 100}\n    output_tokens: {dist: constant, value: 10}\n"
                        "    conversations: {system_prompt_tokens: 1000, turns: {dist: uniform, low: 2, high: 2}}\n")
    assert mmsim(capsys, "trace", "generate", "--config", scenario, "--out", tmp_path / "t.parquet")[0] == 0
    rows = pq.read_table(tmp_path / "t.parquet").to_pylist()
    assert rows and all(len(row["prefix_ids"]) == row["prompt_tokens"] // 64 for row in rows)
    assert {row["prompt_tokens"] for row in rows} == {1100, 1210}  # turn 1: 1000 + 100; turn 2: + 10 + 100
    scenario.write_text(scenario.read_text().replace("prefix_block_tokens: 64", "prefix_block_tokens: 0"))
    code, _, err = mmsim(capsys, "trace", "generate", "--config", scenario, "--out", tmp_path / "u.parquet")
    assert code == 2 and "workload.prefix_block_tokens" in err and not (tmp_path / "u.parquet").exists()


def test_entry_point_exit_code():
    result = subprocess.run([*MMSIM_CLI, "trace", "stats", "missing.csv"],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 2 and result.stderr.strip() == "error: missing.csv: trace file not found"


def test_shipped_traces_are_reproducible(tmp_path, capsys):
    script = runpy.run_path(str(ROOT / "traces" / "generate_traces.py"))
    script["main"](tmp_path)
    capsys.readouterr()
    for name in script["TRACES"]:
        assert (tmp_path / name).read_bytes() == (ROOT / "traces" / name).read_bytes(), name
    summary = stats_json(capsys, ROOT / "traces" / "azure-two-models.csv")
    assert 1000 <= summary["requests"] <= 3000
    assert set(summary["models"]) == {"qwen2.5-7b", "qwen3-8b"}


CONFIG = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 256, "intermediate_size": 512,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}


def test_traces_name_deployments_an_alias_or_a_config_model_included(tmp_path, capsys):
    """A trace's model column names a scenario's deployments, which may be aliases or config-file models; `trace
    import --model`, `generate --mix` and `stats` refused every name outside the catalogue, and `generate --config`
    refused a scenario whose own run generated the same mix."""
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    native = tmp_path / "t.csv"
    native.write_text("arrival_s,model,prompt_tokens,output_tokens\n0,fast-8b,10,5\n0.5,tiny,20,5\n1,typo-8b,20,5\n")
    code, out, _ = mmsim(capsys, "trace", "import", "mmsim", native, tmp_path / "t.parquet")
    assert code == 0 and "wrote" in out
    assert "note: 'fast-8b', 'tiny', 'typo-8b' are not catalogue models" in " ".join(out.split())
    assert stats_json(capsys, tmp_path / "t.parquet")["models"] == {"fast-8b": 1 / 3, "tiny": 1 / 3, "typo-8b": 1 / 3}
    code, out, _ = mmsim(capsys, "trace", "generate", "--out", tmp_path / "g.csv", "--max-requests", "20",
                         "--rate", "2", "--mix", "qwen3-8b=1,fast-8b=1")
    assert code == 0 and "note: 'fast-8b' is not a catalogue model" in " ".join(out.split())
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: s\nprofile: a100-80gb\ncluster: {nodes: 1, gpus_per_node: 1}\nmodels:\n"
                        "  - {config: config.json, name: tiny}\n  - {name: qwen3-8b, alias: fast-8b}\n"
                        "workload:\n  generator:\n    max_requests: 30\n    arrivals: {process: poisson, rate_per_s: 2}\n"
                        "    mix: {tiny: 1, fast-8b: 1}\n    prompt_tokens: {dist: constant, value: 64}\n"
                        "    output_tokens: {dist: constant, value: 8}\n")
    generating = scenario.read_text()
    code, out, _ = mmsim(capsys, "trace", "generate", "--config", scenario, "--out", tmp_path / "s.csv")
    assert code == 0 and "30 requests" in out and "note" not in out
    assert set(stats_json(capsys, tmp_path / "s.csv")["models"]) == {"tiny", "fast-8b"}
    # The trace replays in the scenario that serves its names; the typo is refused there, naming its line.
    replay = generating.split("workload:")[0] + "workload:\n  trace: {path: t.parquet}\n"
    scenario.write_text(replay)
    code, _, err = mmsim(capsys, "run", scenario, "--out", tmp_path / "run")
    assert code == 2 and "'typo-8b' is not served by this scenario" in err
    scenario.write_text(replay.replace("t.parquet}", "t.parquet, skip_bad: true}"))
    code, out, err = mmsim(capsys, "run", scenario, "--out", tmp_path / "run", "--json")
    assert code == 0, err
    assert json.loads(out)["requests_completed"] == 2
    scenario.write_text(generating.replace("alias: fast-8b}", "alias: other}"))
    code, _, err = mmsim(capsys, "trace", "generate", "--config", scenario, "--out", tmp_path / "x.csv")
    assert code == 2 and "mix: model 'fast-8b' is not served by this scenario (it serves other, tiny)" in err
    assert not (tmp_path / "x.csv").exists()


def test_a_scenario_run_counts_the_rows_skip_bad_dropped(tmp_path, capsys):
    """The README promises skip_bad "drops and counts" a scenario trace's bad rows: the count (and the first row
    with its reason) is in the summary and the run's table; a length past 10^7 tokens is a bad row, as in a
    scenario's own lengths."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,model,prompt_tokens,output_tokens\n0,qwen3-8b,10,5\n0.5,typo,20,5\n"
                     "1,qwen3-8b,20000000,5\n1.5,qwen3-8b,30,4\n")
    scenario = tmp_path / "s.yaml"
    strict = ("name: s\nprofile: a100-80gb\ncluster: {nodes: 1, gpus_per_node: 1}\nmodels:\n  - {name: qwen3-8b}\n"
              "workload:\n  trace: {path: t.csv}\n")
    scenario.write_text(strict.replace("t.csv}", "t.csv, model_map: {qwen3-8b: qwen3-8b, typo: qwen3-8b}}"))
    code, _, err = mmsim(capsys, "run", scenario, "--out", tmp_path / "strict")
    assert code == 2 and "t.csv: line 4: prompt_tokens 20000000 is more than 10,000,000" in " ".join(err.split())
    scenario.write_text(strict.replace("t.csv}", "t.csv, skip_bad: true}"))
    code, out, err = mmsim(capsys, "run", scenario, "--out", tmp_path / "run", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["requests_total"] == 2 and summary["requests_completed"] == 2
    rows = summary["trace_rows"]
    assert (rows["rows_read"], rows["requests"], rows["skipped_malformed"]) == (4, 2, 2)
    assert rows["first_skipped"].startswith("line 3: ")
    code, out, err = mmsim(capsys, "run", scenario, "--out", tmp_path / "run")
    assert code == 0, err
    assert "skipped as malformed" in out and "2 of 4 (first: line 3" in " ".join(out.split())


def test_trace_stats_counts_the_rows_skip_bad_dropped(tmp_path, capsys):
    """As ``trace import`` does: the rows --skip-bad dropped are counted, with the first of them."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,model,prompt_tokens,output_tokens\n0,m,10,5\n2,m,10,5\n1,m,10,5\n3,m,abc,5\n4,m,9,5\n")
    code, out, err = mmsim(capsys, "trace", "stats", trace, "--skip-bad", "--json")
    assert code == 0, err
    stats = json.loads(out)
    assert stats["requests"] == 3
    assert stats["trace_rows"] == {"rows_read": 5, "requests": 3, "skipped_malformed": 2,
                                   "first_skipped": "line 4: earlier than the row before; traces must be sorted by time"}
    code, out, err = mmsim(capsys, "trace", "stats", trace, "--skip-bad")
    assert code == 0 and "2 of 5 (first: line 4" in " ".join(out.split())
