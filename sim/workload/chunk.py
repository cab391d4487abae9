"""The in-memory form of a slice of a request trace, as columns."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class RequestChunk:
    """A run of requests in arrival order, held as parallel columns (no per-request objects).

    ``model`` holds catalogue names; ``priority`` is 0 unless the trace says otherwise;
    ``slo_class`` and ``prefix_ids`` are optional per-row values (object arrays).
    """

    arrival_s: np.ndarray
    model: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    priority: np.ndarray | None = None
    slo_class: np.ndarray | None = None
    prefix_ids: np.ndarray | None = None
    first_id: int = 0
    extra: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.arrival_s)
