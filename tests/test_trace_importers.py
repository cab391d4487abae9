"""Importers on the real public traces in ../shared/traces and on malformed inputs."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import numpy as np
import pytest

from sim.errors import MmsimError
from sim.workload.columns import concat
from sim.workload.config import GammaArrivals, PoissonArrivals
from sim.workload.reader import read_trace
from sim.workload.rows import ImportOptions, RowReport

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="public traces not present in ../shared/traces")
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def load(path, fmt, rows=65536, **options):
    report = RowReport(str(path))
    chunks = list(read_trace(Path(path), fmt, ImportOptions(**options), rows=rows, report=report))
    return concat(chunks), report, chunks


@needs_shared
@pytest.mark.parametrize("name, rows, span_s, prompt_mean, output_mean", [
    ("code", 8819, 3436, 2048, 27.9),
    ("conv", 19366, 3502, 1155, 211),
])
def test_azure_2023_matches_published_figures(name, rows, span_s, prompt_mean, output_mean):
    path = SHARED / "azure_llm_2023" / f"AzureLLMInferenceTrace_{name}.csv"
    trace, report, _ = load(path, "azure-2023", model="qwen3-8b")
    assert len(trace) == rows == report.rows_out == report.rows_read
    assert trace.arrival_s[0] == 0.0
    assert trace.arrival_s[-1] == pytest.approx(span_s, abs=1.0)
    assert trace.prompt_tokens.mean() == pytest.approx(prompt_mean, rel=0.001)
    assert trace.output_tokens.mean() == pytest.approx(output_mean, rel=0.002)
    assert set(trace.model) == {"qwen3-8b"}
    assert np.all(np.diff(trace.arrival_s) >= 0)


@needs_shared
def test_azure_times_are_exact_to_the_microsecond():
    path = SHARED / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
    trace, _, _ = load(path, "azure-2023", model="qwen2.5-7b")
    # 2023-11-16 18:17:03.9799600 -> 18:17:04.0319600 and the last stamp 19:14:19.9280160
    assert trace.arrival_s[1] == pytest.approx(0.052, abs=1e-9)
    assert trace.arrival_s[-1] == pytest.approx(3435.948056, abs=1e-9)


@needs_shared
def test_mooncake_conversation_and_prefix_ids():
    trace, _, chunks = load(SHARED / "mooncake" / "conversation_trace.jsonl", "mooncake", rows=5000, model="qwen3-8b")
    assert len(trace) == 12031 and len(chunks) == 3 and max(map(len, chunks)) == 5000
    assert [chunk.first_id for chunk in chunks] == [0, 5000, 10000]
    assert trace.arrival_s[-1] == pytest.approx(3537, abs=1.0)
    assert trace.prompt_tokens.mean() == pytest.approx(12035, rel=0.001)
    assert trace.output_tokens.mean() == pytest.approx(343, rel=0.002)
    assert trace.prefix_ids[0] == tuple(range(14))
    assert trace.prefix_ids[1][0] == 0  # shares the first block with the first request


@needs_shared
def test_burstgpt_maps_models_and_drops_failed_requests():
    path = SHARED / "burstgpt" / "BurstGPT_first42rows_from_hf_viewer.csv"
    trace, report, _ = load(path, "burstgpt", model_map={"ChatGPT": "qwen3-8b", "GPT-4": "qwen2.5-14b"})
    assert report.rows_read == 42 and len(trace) == 38
    assert sum(report.dropped.values()) == 4
    assert trace.arrival_s[0] == 0 and trace.arrival_s[-1] == 4574 - 5
    assert sorted(set(trace.model)) == ["qwen2.5-14b", "qwen3-8b"]
    assert np.count_nonzero(trace.model == "qwen2.5-14b") == 9


@needs_shared
def test_burstgpt_label_missing_from_map_is_an_error_or_skipped():
    path = SHARED / "burstgpt" / "BurstGPT_first42rows_from_hf_viewer.csv"
    with pytest.raises(MmsimError, match=r"line 4: model 'GPT-4' has no entry in the model map"):
        load(path, "burstgpt", model_map={"ChatGPT": "qwen3-8b"})
    trace, report, _ = load(path, "burstgpt", model_map={"ChatGPT": "qwen3-8b"}, skip_bad=True)
    assert set(trace.model) == {"qwen3-8b"} and report.bad_rows == 9
    unmapped, _, _ = load(path, "burstgpt")  # the trace's own labels, for a scenario serving them under aliases
    assert set(unmapped.model) == {"ChatGPT", "GPT-4"}


@needs_shared
@pytest.mark.parametrize("name, rows, prompt_mean, output_mean", [
    ("sharegpt_vidur/sharegpt_8k_filtered_stats_llama2_tokenizer.csv", 30731, 2340.0, 438.7),
    ("vidur_arxiv/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv", 28257, 2588.1, 291.4),
])
def test_length_pairs_with_generated_arrivals(name, rows, prompt_mean, output_mean):
    arrivals = PoissonArrivals(process="poisson", rate_per_s=20.0)
    trace, _, _ = load(SHARED / name, "length-pairs", model="qwen3-8b", arrivals=arrivals, seed=3)
    assert len(trace) == rows
    assert trace.prompt_tokens.mean() == pytest.approx(prompt_mean, rel=0.001)
    assert trace.output_tokens.mean() == pytest.approx(output_mean, rel=0.001)
    assert len(trace) / trace.arrival_s[-1] == pytest.approx(20.0, rel=0.03)


@needs_shared
def test_window_and_time_scale():
    path = SHARED / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    full, _, _ = load(path, "azure-2023", model="qwen3-8b")
    cut, _, _ = load(path, "azure-2023", rows=1000, model="qwen3-8b", start_s=600, end_s=1200, time_scale=0.5)
    inside = (full.arrival_s >= 600) & (full.arrival_s < 1200)
    assert len(cut) == inside.sum()
    np.testing.assert_allclose(cut.arrival_s, (full.arrival_s[inside] - 600) * 0.5)
    assert cut.arrival_s.max() < 300


def write(tmp_path, name, text, mode="w"):
    path = tmp_path / name
    if mode == "gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_bytes(text.encode())
    return path


def test_azure_2024_timestamps_with_zone_and_without_fraction(tmp_path):
    path = write(tmp_path, "a.csv", f"{AZURE_HEADER}\n2024-05-10 00:00:00.009930+00:00,10,2\n"
                                    "2024-05-10 00:00:01+00:00,20,3\n2024-05-10 00:00:01.5Z,30,4")
    trace, _, _ = load(path, "azure-2024", model="qwen3-8b")
    np.testing.assert_allclose(trace.arrival_s, [0.0, 0.99007, 1.49007])


def test_gzip_crlf_and_no_final_newline(tmp_path):
    path = write(tmp_path, "a.csv.gz", f"{AZURE_HEADER}\r\n2023-11-16 18:17:03.9799600,4808,10\r\n"
                                       "2023-11-16 18:17:04.0319600,3180,8", mode="gz")
    trace, _, _ = load(path, "azure-2023", model="qwen3-8b")
    assert trace.prompt_tokens.tolist() == [4808, 3180] and trace.output_tokens.tolist() == [10, 8]


BAD_AZURE = (f"{AZURE_HEADER}\r\n"
             "2023-11-16 18:17:03.9799600,4808,10\r\n"   # line 2 fine
             "2023-11-16 18:17:04,1,2,3\r\n"             # line 3: four fields
             "\r\n"                                      # line 4: blank, ignored
             "not-a-date,5,5\r\n"                        # line 5
             "2023-11-16 18:17:05,abc,5\r\n"             # line 6
             "2023-11-16 18:17:06,5,0\r\n"               # line 7: zero output
             "2023-11-16 18:17:01,5,5\r\n"               # line 8: earlier than line 7
             "2023-11-16 18:17:07,7,7\r\n")              # line 9 fine


@pytest.mark.parametrize("rows", [1, 3, 100])
def test_malformed_rows_name_file_and_line(tmp_path, rows):
    path = write(tmp_path, "bad.csv", BAD_AZURE)
    with pytest.raises(MmsimError) as error:
        load(path, "azure-2023", rows=rows, model="qwen3-8b")
    assert str(error.value) == f"{path}: line 3: expected 3 fields (TIMESTAMP,ContextTokens,GeneratedTokens), found 4"
    trace, report, _ = load(path, "azure-2023", rows=rows, model="qwen3-8b", skip_bad=True)
    assert report.bad_rows == 5 and report.first_bad.startswith("line 3:")
    assert trace.prompt_tokens.tolist() == [4808, 7]
    assert trace.arrival_s.tolist() == pytest.approx([0.0, 3.02004])


@pytest.mark.parametrize("row, message", [
    ("not-a-date,5,5", "line 3: TIMESTAMP 'not-a-date' is not a date and time"),
    ("2023-11-16 18:17:05,abc,5", "line 3: ContextTokens 'abc' is not a whole number >= 1"),
    ("2023-11-16 18:17:05,5,1.5", "line 3: GeneratedTokens 1.5 is not a whole number >= 1"),
    ("2023-11-16 18:17:05,5,", "line 3: GeneratedTokens (missing) is not a whole number >= 1"),
    ("2023-11-16 18:17:02,5,5", "line 3: earlier than the row before"),
])
def test_each_kind_of_bad_row(tmp_path, row, message):
    path = write(tmp_path, "bad.csv", f"{AZURE_HEADER}\n2023-11-16 18:17:03,1,1\n{row}\n")
    with pytest.raises(MmsimError, match=re.escape(message)):
        load(path, "azure-2023", model="qwen3-8b")


def test_bad_mooncake_lines(tmp_path):
    path = write(tmp_path, "m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
                                      '{"timestamp": 5, "input_length": 5, "output_length": 1, "hash_ids": ["x"]}\n'
                                      '{"timestamp": 9, "input_length": 5\n'
                                      '[1, 2]\n'
                                      '{"timestamp": 10, "input_length": 6, "output_length": 2, "hash_ids": []}\n')
    with pytest.raises(MmsimError, match="line 2: hash_ids must be a list of whole numbers"):
        load(path, "mooncake", model="qwen3-8b")
    trace, report, _ = load(path, "mooncake", model="qwen3-8b", skip_bad=True)
    assert report.bad_rows == 3 and trace.arrival_s.tolist() == [0.0, 0.01]
    assert list(trace.prefix_ids) == [(1,), None]


def test_missing_columns_and_files(tmp_path):
    path = write(tmp_path, "x.csv", "time,ContextTokens,GeneratedTokens\n1,2,3\n")
    with pytest.raises(MmsimError, match="line 1: missing column 'TIMESTAMP'"):
        load(path, "azure-2023", model="qwen3-8b")
    with pytest.raises(MmsimError, match="file not found"):
        load(tmp_path / "nope.csv", "azure-2023", model="qwen3-8b")
    with pytest.raises(MmsimError, match="no model column"):
        load(path, "azure-2023")
    with pytest.raises(MmsimError, match="the model name is empty"):
        load(path, "azure-2023", model=" ")
    with pytest.raises(MmsimError, match="give an arrival process"):
        load(path, "length-pairs", model="qwen3-8b")


def test_length_pairs_gamma_arrivals_and_bad_rows(tmp_path):
    lines = "\n".join(f"{1 + i % 7},{1 + i % 5},0,0" for i in range(3000))
    path = write(tmp_path, "p.csv", f"num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n{lines}\n0,4,4,0\n")
    arrivals = GammaArrivals(process="gamma", rate_per_s=5.0, cv=2.0)
    with pytest.raises(MmsimError, match="line 3002: num_prefill_tokens 0"):
        load(path, "length-pairs", model="qwen3-8b", arrivals=arrivals)
    trace, report, _ = load(path, "length-pairs", model="qwen3-8b", arrivals=arrivals, skip_bad=True)
    assert len(trace) == 3000 and report.bad_rows == 1
    gaps = np.diff(trace.arrival_s)
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.2)
