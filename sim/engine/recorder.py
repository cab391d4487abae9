"""What a run leaves behind, collected as compact columns while it runs.

Finished and dropped requests go into typed arrays (8 bytes a value), so a
million-request run keeps its results in tens of megabytes; nothing is kept
per token. Events (loads, unloads, preemptions) and periodic samples of GPU
memory and queue depth are kept as small row lists.
"""

from __future__ import annotations

from array import array

import numpy as np
import pandas as pd

from sim.engine.request import LOSS_CAUSES, Request

DROP_REASONS = ("", "model_not_served", "exceeds_max_model_len", "model_exceeds_gpu", "not_placed", "not_scheduled")
DROP_CODES = {reason: code for code, reason in enumerate(DROP_REASONS)}


class Recorder:
    """Collects per-request rows, the event log and time series of one run."""

    FLOAT_COLUMNS = ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s") + tuple(f"lost_{c}_s" for c in LOSS_CAUSES)
    INT_COLUMNS = ("id", "model", "prompt_tokens", "output_tokens", "generated_tokens", "preemptions", "gpu", "drop_reason",
                   "cached_prompt_tokens")

    def __init__(self, model_names: list[str]):
        self.model_names = model_names
        # One row per request, its values interleaved in column order: two extends per request instead
        # of one append per column (this is on the path of every request).
        self.float_rows = array("d")
        self.int_rows = array("q")
        self.events: list[tuple] = []
        self.samples: list[tuple] = []

    def request(self, request: Request, drop_reason: str = "") -> None:
        lost = request.lost  # one value per LOSS_CAUSES entry, written out: one extend instead of two
        self.float_rows.extend((request.arrival_s, request.first_scheduled_s, request.first_token_s, request.finish_s,
                                lost[0], lost[1], lost[2], lost[3], lost[4], lost[5]))
        self.int_rows.extend((request.id, request.model, request.prompt_tokens, request.output_tokens, request.generated,
                              request.preemptions, request.gpu, DROP_CODES[drop_reason], request.cached_tokens))

    def _columns(self, rows: array, names: tuple[str, ...], dtype) -> dict[str, np.ndarray]:
        table = np.frombuffer(rows, dtype=dtype) if len(rows) else np.zeros(0, dtype)
        table = table.reshape(-1, len(names))
        return {name: table[:, k].copy() for k, name in enumerate(names)}

    def event(self, time_s: float, kind: str, gpu: int, model: str, request_id: int = -1, duration_s: float = 0.0, detail: str = "") -> None:
        self.events.append((time_s, kind, gpu, model, request_id, duration_s, detail))

    def sample(self, row: tuple) -> None:
        self.samples.append(row)

    def requests_frame(self) -> pd.DataFrame:
        data = self._columns(self.int_rows, self.INT_COLUMNS, np.int64)
        data.update(self._columns(self.float_rows, self.FLOAT_COLUMNS, np.float64))
        frame = pd.DataFrame(data)
        frame["model"] = pd.Categorical.from_codes(frame["model"].to_numpy(), categories=self.model_names)
        frame["status"] = np.where(frame["drop_reason"].to_numpy() == 0, "completed", "dropped")
        frame["drop_reason"] = pd.Categorical.from_codes(frame["drop_reason"].to_numpy(), categories=list(DROP_REASONS))
        frame = frame.sort_values("id", kind="stable").reset_index(drop=True)
        frame["queue_s"] = frame["first_scheduled_s"] - frame["arrival_s"]
        frame["ttft_s"] = frame["first_token_s"] - frame["arrival_s"]
        frame["e2e_s"] = frame["finish_s"] - frame["arrival_s"]
        # As vLLM's benchmark: TPOT is over the tokens after the first, so a one-token output has none (NaN,
        # left out of TPOT statistics rather than counted as 0).
        decode_tokens = (frame["output_tokens"] - 1).where(frame["output_tokens"] > 1)
        frame["tpot_s"] = (frame["finish_s"] - frame["first_token_s"]) / decode_tokens
        ordered = ["id", "model", "status", "drop_reason", "arrival_s", "queue_s", "first_scheduled_s", "first_token_s",
                   "finish_s", "ttft_s", "tpot_s", "e2e_s", "prompt_tokens", "cached_prompt_tokens", "output_tokens",
                   "generated_tokens", "preemptions"] + [f"lost_{c}_s" for c in LOSS_CAUSES] + ["gpu"]
        return frame[ordered]

    def events_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.events, columns=["time_s", "kind", "gpu", "model", "request_id", "duration_s", "detail"])

    def timeseries_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.samples, columns=["time_s", "gpu", "model", "weight_bytes", "kv_bytes", "queued", "running",
                                                   "busy_share"])
