"""HPA's stabilisation window: the highest replica count asked for over the last seconds."""

from __future__ import annotations

from collections import deque


class WindowMax:
    """The highest replica count asked for within the last ``span_s`` seconds: HPA's stabilisation window.

    A monotonic deque: a count stays only while no count asked for later is as high, for a later one outlasts it
    in the window. The counts kept fall from the oldest to the newest, the oldest is the highest, and each count
    goes in and out once: O(1) amortised a decision, however many decisions the window spans (a whole-window
    maximum at every decision made a run quadratic in 1 / ``interval_s``)."""

    def __init__(self, span_s: float, now: float, count: int):
        self.span_s = span_s
        self.kept: deque[tuple[float, int]] = deque([(now, count)])

    def push(self, now: float, count: int) -> int:
        """Take ``count``, asked for at ``now`` (never before the last push); the highest within the window."""
        kept = self.kept
        while kept and kept[-1][1] <= count:
            kept.pop()
        kept.append((now, count))
        while kept[0][0] < now - self.span_s:
            kept.popleft()
        return kept[0][1]

    def clear(self) -> None:
        self.kept.clear()
