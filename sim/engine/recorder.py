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

DROP_REASONS = ("", "model_not_served", "exceeds_kv_capacity", "not_scheduled")


class Recorder:
    """Collects per-request rows, the event log and time series of one run."""

    FLOAT_COLUMNS = ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s") + tuple(f"lost_{c}_s" for c in LOSS_CAUSES)
    INT_COLUMNS = ("id", "model", "prompt_tokens", "output_tokens", "generated_tokens", "preemptions", "gpu", "drop_reason")

    def __init__(self, model_names: list[str]):
        self.model_names = model_names
        self.floats = {name: array("d") for name in self.FLOAT_COLUMNS}
        self.ints = {name: array("q") for name in self.INT_COLUMNS}
        self.events: list[tuple] = []
        self.samples: list[tuple] = []

    def request(self, request: Request, drop_reason: str = "") -> None:
        f, i = self.floats, self.ints
        f["arrival_s"].append(request.arrival_s)
        f["first_scheduled_s"].append(request.first_scheduled_s)
        f["first_token_s"].append(request.first_token_s)
        f["finish_s"].append(request.finish_s)
        for cause, seconds in zip(LOSS_CAUSES, request.lost):
            f[f"lost_{cause}_s"].append(seconds)
        i["id"].append(request.id)
        i["model"].append(request.model)
        i["prompt_tokens"].append(request.prompt_tokens)
        i["output_tokens"].append(request.output_tokens)
        i["generated_tokens"].append(request.generated)
        i["preemptions"].append(request.preemptions)
        i["gpu"].append(request.gpu)
        i["drop_reason"].append(DROP_REASONS.index(drop_reason))

    def event(self, time_s: float, kind: str, gpu: int, model: str, request_id: int = -1, duration_s: float = 0.0, detail: str = "") -> None:
        self.events.append((time_s, kind, gpu, model, request_id, duration_s, detail))

    def sample(self, row: tuple) -> None:
        self.samples.append(row)

    def requests_frame(self) -> pd.DataFrame:
        data = {name: np.frombuffer(col, dtype=np.int64) if len(col) else np.zeros(0, np.int64) for name, col in self.ints.items()}
        data.update({name: np.frombuffer(col, dtype=np.float64) if len(col) else np.zeros(0) for name, col in self.floats.items()})
        frame = pd.DataFrame(data)
        frame["model"] = pd.Categorical.from_codes(frame["model"].to_numpy(), categories=self.model_names)
        frame["status"] = np.where(frame["drop_reason"].to_numpy() == 0, "completed", "dropped")
        frame["drop_reason"] = pd.Categorical.from_codes(frame["drop_reason"].to_numpy(), categories=list(DROP_REASONS))
        frame = frame.sort_values("id", kind="stable").reset_index(drop=True)
        frame["queue_s"] = frame["first_scheduled_s"] - frame["arrival_s"]
        frame["ttft_s"] = frame["first_token_s"] - frame["arrival_s"]
        frame["e2e_s"] = frame["finish_s"] - frame["arrival_s"]
        decode_tokens = (frame["output_tokens"] - 1).clip(lower=1)
        frame["tpot_s"] = (frame["finish_s"] - frame["first_token_s"]) / decode_tokens
        ordered = ["id", "model", "status", "drop_reason", "arrival_s", "queue_s", "first_scheduled_s", "first_token_s",
                   "finish_s", "ttft_s", "tpot_s", "e2e_s", "prompt_tokens", "output_tokens", "generated_tokens",
                   "preemptions"] + [f"lost_{c}_s" for c in LOSS_CAUSES] + ["gpu"]
        return frame[ordered]

    def events_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.events, columns=["time_s", "kind", "gpu", "model", "request_id", "duration_s", "detail"])

    def timeseries_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.samples, columns=["time_s", "gpu", "model", "weight_bytes", "kv_bytes", "queued", "running",
                                                   "busy_share"])
