"""What a run leaves behind, collected as compact columns while it runs.

Finished and dropped requests go into typed arrays, about 70 bytes a request,
so that ten million requests fit in under a gigabyte; nothing is kept per
token, and the seconds a request lost to preemption are kept only for the
requests that lost any. The periodic samples of GPU memory and queue depth
(a row per instance every few simulated seconds: millions over a long trace)
are packed rows of fixed width; events (loads, unloads, preemptions) are a row list.
:mod:`sim.results` turns all of it into the run's tables.
"""

from __future__ import annotations

import struct
from array import array
from collections import deque
from typing import TYPE_CHECKING, Final

import numpy as np

from sim.engine.request import LOSS_CAUSES, Request

if TYPE_CHECKING:
    from sim.engine.gpu import Gpu

DROP_REASONS = ("", "model_not_served", "exceeds_max_model_len", "model_exceeds_gpu", "not_placed", "not_scheduled",
                "exceeds_instance_max_model_len")
DROP_CODES: Final = {reason: code for code, reason in enumerate(DROP_REASONS)}
TIME_COLUMNS = ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s")
TOKEN_COLUMNS = ("prompt_tokens", "cached_prompt_tokens", "output_tokens", "generated_tokens")
SMALL_COLUMNS = ("model", "preemptions", "gpu", "drop_reason", "slo_class")
LOST_COLUMNS = tuple(f"lost_{cause}_s" for cause in LOSS_CAUSES)
SAMPLE_COLUMNS = ("time_s", "gpu", "model", "weight_bytes", "kv_bytes", "queued", "running", "busy_share")
EVENT_COLUMNS = ("time_s", "kind", "gpu", "model", "request_id", "duration_s", "detail")
PENDING_INTS = 1 + len(TOKEN_COLUMNS) + len(SMALL_COLUMNS)
PACK_ROW: Final = struct.Struct(f"={len(TIME_COLUMNS)}d{PENDING_INTS}q").pack_into
"""Writes a request's row into the pending buffer: its TIME_COLUMNS values, then its id, TOKEN_COLUMNS and
SMALL_COLUMNS values. An array's own ``extend`` converts value by value through argument parsing, which cost
more than the rest of a request's recording; rows wait in the buffer and go into the arrays in blocks."""
SAMPLE_ROW: Final = struct.Struct("=d4i2qd").pack
"""One sample as the recorder keeps it: time, then GPU, model code, queued and running, then weight and KV bytes,
then busy share (SAMPLE_DTYPE's fields)."""
SAMPLE_DTYPE = np.dtype([("time_s", np.float64), ("gpu", np.int32), ("model", np.int32), ("queued", np.int32),
                         ("running", np.int32), ("weight_bytes", np.int64), ("kv_bytes", np.int64),
                         ("busy_share", np.float64)])
PENDING_ROW = np.dtype([("times", np.float64, len(TIME_COLUMNS)), ("ints", np.int64, PENDING_INTS)])
ROW_BYTES: Final = PENDING_ROW.itemsize
PENDING_ROWS: Final = 4096
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def extend_widening(values: array, block: np.ndarray) -> array:
    """``values`` with ``block``'s (int64) values appended in row order; a 32-bit array that cannot hold one of
    them becomes a 64-bit one (once)."""
    if values.typecode == "i" and len(block) and (int(block.min()) < INT32_MIN or int(block.max()) > INT32_MAX):
        values = array("q", values)
    values.frombytes(block.astype(np.int32 if values.typecode == "i" else np.int64).tobytes())
    return values


class Recorder:
    """Collects per-request rows, the event log and time series of one run."""

    def __init__(self, model_names: list[str]):
        self.model_names = model_names
        # One row per request in the order requests ended, each group's values interleaved, in 32 bits until a
        # value needs more; the last requests' rows wait in a buffer (see PACK_ROW).
        self.ids = array("i")
        self.times = array("d")
        self.tokens = array("i")  # a trace may give lengths beyond 32 bits (requests then dropped, but recorded)
        self.small = array("i")  # model, preemptions, GPU, drop code and SLO class code: small by construction
        self.rows = 0  # requests recorded
        self._pending = bytearray(PENDING_ROWS * ROW_BYTES)  # the last requests' rows, not yet in the arrays
        self._pending_rows = 0
        self.lost_rows = array("q")  # the rows (in ending order) of requests that lost any time to preemption
        self.lost_values = array("d")  # their seconds lost, one value per LOSS_CAUSES entry
        self.events: list[tuple] = []
        # Samples: SAMPLE_ROW rows (GPU -1: a model's unplaced requests); model names as codes.
        self.samples = bytearray()
        self.sample_names: list[str] = [""]
        self._sample_codes: dict[str, int] = {"": 0}
        # The trace's SLO class labels in the order they first arrived: requests hold codes into this list.
        self.slo_class_names: list[str] = []
        self._slo_class_codes: dict[str, int] = {}

    def request(self, request: Request, drop_reason: str = "") -> None:
        lost = request.lost
        if lost is not None and (lost[0] or lost[1] or lost[2] or lost[3] or lost[4] or lost[5]):
            self.lost_rows.append(self.rows)
            self.lost_values.extend(lost)
        self.rows += 1
        PACK_ROW(self._pending, self._pending_rows * ROW_BYTES, request.arrival_s, request.first_scheduled_s,
                 request.first_token_s, request.finish_s, request.id, request.prompt_tokens, request.cached_tokens,
                 request.output_tokens, request.generated, request.model, request.preemptions, request.gpu,
                 DROP_CODES[drop_reason] if drop_reason else 0, request.slo_class)
        self._pending_rows += 1
        if self._pending_rows == PENDING_ROWS:
            self._flush()

    def _flush(self) -> None:
        """Move the pending rows into the typed arrays."""
        if not self._pending_rows:
            return
        rows = np.frombuffer(self._pending, PENDING_ROW, self._pending_rows)
        self.times.frombytes(rows["times"].tobytes())
        ints = rows["ints"]
        self.ids = extend_widening(self.ids, ints[:, 0])
        self.tokens = extend_widening(self.tokens, ints[:, 1:1 + len(TOKEN_COLUMNS)])
        self.small = extend_widening(self.small, ints[:, 1 + len(TOKEN_COLUMNS):])
        self._pending_rows = 0

    def request_columns(self) -> dict[str, np.ndarray]:
        """The per-request columns other than ``lost_*``, in the order requests ended: strided views of the
        recorded arrays, not copies (so nothing may be recorded while they are in use)."""
        self._flush()
        columns: dict[str, np.ndarray] = {"id": _view(self.ids, 1)[:, 0]}
        for group, names in ((self.times, TIME_COLUMNS), (self.tokens, TOKEN_COLUMNS), (self.small, SMALL_COLUMNS)):
            table = _view(group, len(names))
            for k, name in enumerate(names):
                columns[name] = table[:, k]
        return columns

    def slo_class_code(self, label: str | None) -> int:
        """The code of SLO class ``label`` (given one the first time it is seen); -1 for none (None or empty)."""
        if not label:
            return -1
        code = self._slo_class_codes.get(label)
        if code is None:
            code = self._slo_class_codes[label] = len(self.slo_class_names)
            self.slo_class_names.append(label)
        return code

    def lost_seconds(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows (in ending order) of the requests that lost time to preemption, and their seconds lost, one
        column per LOSS_CAUSES entry; every other request lost none."""
        return _view(self.lost_rows, 1)[:, 0], _view(self.lost_values, len(LOST_COLUMNS))

    def event(self, time_s: float, kind: str, gpu: int, model: str, request_id: int = -1, duration_s: float = 0.0, detail: str = "") -> None:
        self.events.append((time_s, kind, gpu, model, request_id, duration_s, detail))

    def sample(self, time_s: float, gpu: int, model: str, weight_bytes: int, kv_bytes: int, queued: int, running: int,
               busy_share: float) -> None:
        rows = self.samples
        rows += SAMPLE_ROW(time_s, gpu, self._sample_code(model), queued, running, weight_bytes, kv_bytes, busy_share)

    def _sample_code(self, model: str) -> int:
        code = self._sample_codes.get(model)
        if code is None:
            code = self._sample_codes[model] = len(self.sample_names)
            self.sample_names.append(model)
        return code

    def sample_gpus(self, now: float, gpus: list[Gpu], busy_before_s: list[float], interval_s: float) -> None:
        """One row per instance of every GPU (one for an empty GPU): its memory, queue depth and busy share over
        the last ``interval_s``. ``busy_before_s`` holds each GPU's busy seconds at the previous sample (by index),
        and is brought up to now. Compiled with the engine; a trace of a day on 64 GPUs is a million rows."""
        rows = self.samples
        for gpu in gpus:
            gpu.sync()
            busy_s = gpu.busy_by(now)
            busy = (busy_s - busy_before_s[gpu.index]) / interval_s
            busy_before_s[gpu.index] = busy_s
            share = 1.0 if 1.0 < busy else busy  # min(busy, 1.0), as Python's min breaks ties
            for inst in gpu.instances:
                rows += SAMPLE_ROW(now, gpu.index, self._sample_code(inst.name), len(inst.waiting) + len(inst.swapped),
                                   len(inst.running), inst.weight_bytes, inst.kv_bytes, share)
            if not gpu.instances:
                rows += SAMPLE_ROW(now, gpu.index, 0, 0, 0, 0, 0, share)

    def sample_pending(self, now: float, pending: list[deque[Request]]) -> None:
        """A row per model with requests that no instance holds (GPU -1)."""
        for model, queue in enumerate(pending):
            if queue:
                self.sample(now, -1, self.model_names[model], 0, 0, len(queue), 0, 0.0)

    def sample_columns(self) -> dict[str, np.ndarray]:
        """The samples' columns (``model`` as codes into ``sample_names``), views of the recorded rows."""
        table = np.frombuffer(self.samples, SAMPLE_DTYPE) if self.samples else np.zeros(0, SAMPLE_DTYPE)
        return {name: table[name] for name in SAMPLE_COLUMNS}


def _view(values: array, width: int) -> np.ndarray:
    """An array's values as a (rows, width) numpy table of the same type, without copying them."""
    dtype = {"i": np.int32, "q": np.int64, "d": np.float64}[values.typecode]
    if not len(values):
        return np.zeros((0, width), dtype)
    return np.frombuffer(values, dtype=dtype).reshape(-1, width)
