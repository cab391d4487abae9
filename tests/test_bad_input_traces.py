"""Bad trace input of every kind, given as a user would: damaged or truncated files, bad rows and cells, columns
named twice, values past their ranges and flags that make no sense. Each is refused with one line naming the file
and the line (or dropped and counted under ``skip_bad``), exit 2, no traceback; the helpers are
``test_bad_input``'s."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import mmsim_in_process
from tests.test_bad_input import TRACE_HEADER, cli, refused, tiny_scenario, write, write_yaml


def _parquet(path: Path, **columns) -> Path:
    base = {"arrival_s": pa.array([0.5, 1.0]), "model": pa.array(["qwen3-8b", "qwen3-8b"]),
            "prompt_tokens": pa.array([10, 20]), "output_tokens": pa.array([5, 6])}
    base.update(columns)
    pq.write_table(pa.table(base), path)
    return path


def test_trace_row_not_utf8(tmp_path):
    trace = write(tmp_path / "t.csv", TRACE_HEADER.encode() + b"2.1,qwen\xff,100,20\n")
    refused(["trace", "stats", trace], str(trace), "line 2", "not UTF-8")


@pytest.mark.parametrize("row", ['0.5,"qwen2.5-3b,101,21', '"0.5,qwen2.5-3b,101,21', '0.5,qwen2.5-3b",101,21'])
def test_trace_row_with_a_quote_left_open(tmp_path, capsys, row):
    # A quote never closed made pandas read every later line into one field: a ParserError traceback.
    rows = ["0,qwen2.5-3b,100,20", row, "1,qwen2.5-3b,102,22"]
    trace = write(tmp_path / "t.csv", TRACE_HEADER + "\n".join(rows) + "\n")
    refused(["trace", "stats", trace], str(trace), "line 3", "never closed")
    code, out, _ = mmsim_in_process(capsys, "trace", "stats", trace, "--skip-bad", "--json")
    assert code == 0 and json.loads(out)["requests"] == 2  # the other two rows, the bad one counted


def test_truncated_and_fake_gzip(tmp_path):
    whole = gzip.compress((TRACE_HEADER + "".join(f"{i},qwen3-8b,10,5\n" for i in range(5000))).encode())
    truncated = write(tmp_path / "t.csv.gz", whole[: len(whole) // 2])
    refused(["trace", "stats", truncated], str(truncated), "gzip")
    fake = write(tmp_path / "f.csv.gz", TRACE_HEADER + "0,qwen3-8b,10,5\n")
    refused(["trace", "stats", fake], str(fake), "gzip")


def test_parquet_timestamp_and_boolean_columns(tmp_path):
    stamps = pa.array([1_700_000_000_000_000, 1_700_000_001_000_000], pa.timestamp("us"))
    refused(["trace", "stats", _parquet(tmp_path / "a.parquet", arrival_s=stamps)], "arrival_s", "timestamp")
    refused(["trace", "stats", _parquet(tmp_path / "b.parquet", prompt_tokens=pa.array([True, False]))],
            "prompt_tokens", "bool")
    jsonl = write(tmp_path / "c.jsonl", '{"arrival_s": 0, "model": "qwen3-8b", "prompt_tokens": true, '
                                        '"output_tokens": 5}\n')
    refused(["trace", "stats", jsonl], "line 1", "prompt_tokens true")


def test_a_model_no_scenario_serves_is_noted_by_import_and_refused_by_run(tmp_path):
    trace = write(tmp_path / "t.csv", TRACE_HEADER + "0.5,gpt-9,10,5\n")
    code, text = cli("trace", "import", "mmsim", trace, tmp_path / "o.csv")
    assert code == 0 and "note: 'gpt-9' is not a catalogue model" in text and (tmp_path / "o.csv").exists()
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario(workload={"trace": {"path": "t.csv"}}))
    refused(["run", scenario, "--out", tmp_path / "o"], "'gpt-9'", "line 2", out=tmp_path / "o")


def test_long_fields_are_cut_in_messages(tmp_path):
    trace = write(tmp_path / "t.csv", TRACE_HEADER + f"0.5,{'m' * 2_500_000},10,5\n")
    text = refused(["trace", "import", "mmsim", trace, tmp_path / "o.csv"], "is longer than 200 characters")
    assert len(text) < 3000


@pytest.mark.parametrize("fmt, header, row, flags", [
    ("mmsim", "arrival_s,model,prompt_tokens,output_tokens,model", "0.5,qwen3-8b,10,5,qwen3-8b", []),
    ("azure-2023", "TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens", "2023-11-16 18:17:03.9799600,10,10,10",
     ["--model", "qwen3-8b"]),
    ("burstgpt", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type,Model",
     "1,ChatGPT,10,10,20,x,ChatGPT", ["--model-map", "ChatGPT=qwen3-8b"]),
])
def test_a_column_named_twice_is_refused(tmp_path, fmt, header, row, flags):
    trace = write(tmp_path / "t.csv", f"{header}\n{row}\n")
    refused(["trace", "stats", trace, "--format", fmt, *flags], "named twice in the header")
    doubled = _parquet(tmp_path / "t.parquet")
    table = pq.read_table(doubled)
    pq.write_table(table.append_column("model", table.column("model")), doubled)
    refused(["trace", "stats", doubled], "'model' is named twice in the schema")


@pytest.mark.parametrize("fmt, line, flags", [
    ("mmsim", '{"arrival_s": 0.5, "model": "qwen3-8b", "prompt_tokens": 1%s, "output_tokens": 5}', []),
    ("mooncake", '{"timestamp": 1, "input_length": 1%s, "output_length": 5, "hash_ids": [1]}', ["--model", "qwen3-8b"]),
])
def test_an_integer_past_float_range_is_a_bad_row(tmp_path, fmt, line, flags):
    trace = write(tmp_path / "t.jsonl", line % ("0" * 400) + "\n")
    refused(["trace", "stats", trace, "--format", fmt, *flags], "line 1", "is not a whole number")


@pytest.mark.parametrize("name", ["t.csv", "t.jsonl"])
def test_empty_trace_files_agree(tmp_path, name):
    refused(["trace", "stats", write(tmp_path / name, "")], "empty file")


@pytest.mark.parametrize("flags, expected", [
    (["--time-scale", "nan"], "time scale"), (["--time-scale", "inf"], "time scale"),
    (["--start", "nan"], "window start"), (["--end", "nan"], "window end"), (["--end", "inf"], "window end"),
])
def test_trace_import_flags(tmp_path, flags, expected):
    trace = write(tmp_path / "t.csv", TRACE_HEADER + "0.5,qwen3-8b,10,5\n")
    refused(["trace", "import", "mmsim", trace, tmp_path / "o.csv", *flags], expected, out=tmp_path / "o.csv")


@pytest.mark.parametrize("flags, expected", [
    (["--mix", "m" * 300 + "=1", "--duration", "2", "--rate", "1"], "model names are 1 to 200 characters, not 300"),
    (["--mix", "qwen3-8b=1", "--duration", "inf", "--rate", "1"], "--duration: "),
    (["--mix", "qwen3-8b=1", "--duration", "2", "--rate", "1e308"], "--rate: "),
    (["--mix", "qwen3-8b=inf", "--duration", "2", "--rate", "1"], "mix"),
])
def test_trace_generate_flags(tmp_path, flags, expected):
    refused(["trace", "generate", "--out", tmp_path / "o.csv", *flags], expected, out=tmp_path / "o.csv")


def test_stats_of_a_trace_whose_lengths_are_all_huge(tmp_path):
    trace = write(tmp_path / "t.csv", TRACE_HEADER + f"0,qwen2.5-3b,1,{10**7}\n")
    code, text = cli("trace", "stats", trace, "--json")
    assert code == 0 and json.loads(text)["output_tokens"]["p50"] == 10**7, text
    write(trace, TRACE_HEADER + f"0,qwen2.5-3b,1,{10**7 + 1}\n")
    refused(["trace", "stats", trace], "line 2: output_tokens 10000001 is more than 10,000,000")


def test_trace_times_past_the_horizon_after_scaling(tmp_path):
    write(tmp_path / "t.csv", TRACE_HEADER + "0,qwen2.5-3b,10,5\n5000,qwen2.5-3b,10,5\n")
    scenario = write_yaml(tmp_path / "s.yaml", tiny_scenario(workload={"trace": {"path": "t.csv"}, "time_scale": 1e6}))
    refused(["run", scenario, "--out", tmp_path / "o"], "time_scale", "1e+09", out=tmp_path / "o")


def test_servegen_window_rates_are_bounded(tmp_path):
    write(tmp_path / "w.csv", "0,1e300,1,Gamma,0.5,1\n")
    data = tiny_scenario()
    data["workload"]["generator"]["arrivals"] = {"process": "servegen", "path": "w.csv"}
    refused(["run", write_yaml(tmp_path / "s.yaml", data), "--out", tmp_path / "o"], "w.csv", "line 1", "rate_rps",
            out=tmp_path / "o")


AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


@pytest.mark.parametrize("name, text, args, line, reason", [
    # A row out of time order before a bad value: the reader's value check ran first and named the later row.
    ("t.csv", TRACE_HEADER + "0,m,10,5\n2,m,10,5\n1,m,10,5\n3,m,abc,5\n", [], "line 4", "earlier than the row before"),
    ("t.csv", TRACE_HEADER + "0,m,10,5\n2,m,abc,5\n1,m,10,5\n", [], "line 3", "prompt_tokens 'abc'"),
    ("az.csv", AZURE_HEADER + "2023-11-16 18:15:46.68,374,44\n2023-11-16 18:15:50.99,396,109\n"
     "2023-11-16 18:15:48.0,879,42\n2023-11-16 18:15:51.0,abc,42\n", ["--format", "azure-2023", "--model", "m"],
     "line 4", "earlier than the row before"),
    # A key the first line does not set, after a bad value: the key's check ran first.
    ("t.jsonl", '{"arrival_s":0,"model":"m","prompt_tokens":10,"output_tokens":5}\n'
     '{"arrival_s":1,"model":"m","prompt_tokens":"x","output_tokens":5}\n'
     '{"arrival_s":2,"model":"m","prompt_tokens":10,"output_tokens":5,"priority":1}\n', [], "line 2",
     "prompt_tokens 'x'"),
])
def test_a_strict_read_names_the_first_bad_row_whichever_check_finds_it(tmp_path, name, text, args, line, reason):
    trace = write(tmp_path / name, text)
    refused(["trace", "stats", trace, *args], f"{trace}: {line}: {reason}")


@pytest.mark.parametrize("row, reason", [
    ('{"arrival_s": 1, "model": "m", "prompt_tokens": "10", "output_tokens": 5, "priority": 0}',
     "prompt_tokens '10' is text; write a JSON number"),
    ('{"arrival_s": 1, "model": "m", "prompt_tokens": 10, "output_tokens": 5, "priority": "1"}', "priority '1' is text"),
])
def test_a_jsonl_number_written_as_text_is_a_bad_row(tmp_path, capsys, row, reason):
    """JSON has numbers: ``"10"`` in a number's place was read as 10 without a word (a scenario's YAML refuses it)."""
    good = '{"arrival_s": 0, "model": "m", "prompt_tokens": 10, "output_tokens": 5, "priority": 0}\n'
    trace = write(tmp_path / "t.jsonl", good + row + "\n")
    refused(["trace", "stats", trace], f"{trace}: line 2: {reason}")
    code, out, _ = mmsim_in_process(capsys, "trace", "stats", trace, "--skip-bad", "--json")
    assert code == 0 and json.loads(out)["trace_rows"]["skipped_malformed"] == 1


def test_a_jsonl_key_given_twice_is_a_bad_row(tmp_path, capsys):
    """json keeps a key's last value silently: ``prompt_tokens`` twice read as 99 without a word."""
    good = '{"arrival_s": 0, "model": "m", "prompt_tokens": 10, "output_tokens": 5, "slo_class": "a\\": b"}\n'
    twice = '{"arrival_s": 1, "model": "m", "prompt_tokens": 10, "prompt_tokens": 99, "output_tokens": 5, "slo_class": "x"}\n'
    trace = write(tmp_path / "t.jsonl", good + twice)
    refused(["trace", "stats", trace], f"{trace}: line 2: key 'prompt_tokens' given twice; keep one")
    for spaced in ('"prompt_tokens" : 10, "prompt_tokens" : 99', '"prompt_tokens"\t:10, "prompt_tokens":99'):
        write(trace, good + twice.replace('"prompt_tokens": 10, "prompt_tokens": 99', spaced))  # was missed: kept 99
        refused(["trace", "stats", trace], f"{trace}: line 2: key 'prompt_tokens' given twice; keep one")
    write(trace, good + twice + "not json\n")  # the line-by-line parse finds it too
    refused(["trace", "stats", trace], f"{trace}: line 2: key 'prompt_tokens' given twice")
    code, out, _ = mmsim_in_process(capsys, "trace", "stats", trace, "--skip-bad", "--json")
    assert code == 0 and json.loads(out)["requests"] == 1  # the first line, its text holding '":', is kept
    # A line that is no JSON, ahead of good ones and holding '":' itself: the keys of the lines parsed one by one
    # were matched against the wrong lines' text (a JSONDecodeError traceback).
    write(trace, 'not json "a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6\n' + good + good.replace('0,', '1,', 1))
    code, out, err = mmsim_in_process(capsys, "trace", "stats", trace, "--skip-bad", "--json")
    assert code == 0, err
    assert json.loads(out)["trace_rows"]["skipped_malformed"] == 1 and json.loads(out)["requests"] == 2
