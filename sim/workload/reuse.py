"""A trace's ideal prefix reuse: the share of prompt tokens whose prefix block was seen before.

This is what an unbounded prefix cache on one instance per model would find
(each block identified, as the engine does, by every prefix id up to it); a real
cache of bounded size, spread over instances, finds at most this much.
"""

from __future__ import annotations

from collections.abc import Iterable

from sim.workload.chunk import RequestChunk


class PrefixReuse:
    """Counts, per model, prompt tokens and those in prefix blocks seen earlier in the trace."""

    def __init__(self, block_tokens: int):
        self.block_tokens = block_tokens
        self._seen: set[tuple[str, int]] = set()
        self.prompt_tokens: dict[str, int] = {}
        self.reused_tokens: dict[str, int] = {}

    def add(self, chunk: RequestChunk) -> None:
        ids_column = chunk.prefix_ids
        for i, model in enumerate(chunk.model.tolist()):
            prompt = int(chunk.prompt_tokens[i])
            self.prompt_tokens[model] = self.prompt_tokens.get(model, 0) + prompt
            ids = ids_column[i] if ids_column is not None else None
            if ids:
                self.reused_tokens[model] = self.reused_tokens.get(model, 0) + self._reused(model, ids, prompt)

    def _reused(self, model: str, ids: Iterable[int], prompt: int) -> int:
        chain, reused, covered = 0, 0, 0
        seen = self._seen
        for prefix_id in ids:
            if covered >= prompt:
                break
            chain = hash((chain, prefix_id))
            block = min(self.block_tokens, prompt - covered)
            if (model, chain) in seen:
                reused += block
            else:
                seen.add((model, chain))
            covered += block
        return reused

    def shares(self) -> dict[str, float]:
        """Per model, the share of prompt tokens in blocks seen before (0 for a model without prefix ids)."""
        return {model: self.reused_tokens.get(model, 0) / total if total else 0.0
                for model, total in self.prompt_tokens.items()}

    def overall(self) -> float:
        total = sum(self.prompt_tokens.values())
        return sum(self.reused_tokens.values()) / total if total else 0.0
