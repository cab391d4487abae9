"""Synthetic workloads: a generator config and a seed become a stream of request chunks.

Arrivals, model choice, prompt lengths and output lengths each draw from their
own random stream of the seed, one value per request in order, so the same seed
gives the same requests whatever the chunk size.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from sim.workload.arrivals import ArrivalStream, random_stream, windows_for
from sim.workload.chunk import RequestChunk
from sim.workload.columns import make_chunk
from sim.workload.config import PREFIX_BLOCK_TOKENS, GeneratorConfig
from sim.workload.conversations import Conversations, generate_conversations
from sim.workload.lengths import LengthPairSampler, MixSampler

MIX_STREAM, PROMPT_STREAM, OUTPUT_STREAM, CONVERSATION_STREAM = 1, 2, 3, 4


def generate(config: GeneratorConfig, *, seed: int, base_dir: Path | None = None, chunk_rows: int = 65536,
             field: str = "workload.generator",
             prefix_block_tokens: int = PREFIX_BLOCK_TOKENS) -> Iterator[RequestChunk]:
    """Chunks of up to ``chunk_rows`` generated requests in arrival order, ``first_id`` the running index."""
    arrivals = ArrivalStream(windows_for(config.arrivals, base_dir, config.duration_s), seed, config.duration_s)
    mix = MixSampler(config.mix, random_stream(seed, MIX_STREAM))
    lengths = LengthPairSampler(config.prompt_tokens, config.output_tokens, random_stream(seed, PROMPT_STREAM),
                                random_stream(seed, OUTPUT_STREAM), base_dir, field)
    if config.conversations is not None:
        spec = config.conversations
        conversations = Conversations(spec.tenants, spec.system_prompt_tokens, spec.turns.low, spec.turns.high,
                                      spec.think_time_s, prefix_block_tokens, random_stream(seed, CONVERSATION_STREAM))
        yield from generate_conversations(arrivals, mix, lengths, config.model_names(), conversations,
                                          config.max_requests, config.duration_s, chunk_rows, spec.turns.high)
        return
    emitted = 0
    while config.max_requests is None or emitted < config.max_requests:
        wanted = chunk_rows if config.max_requests is None else min(chunk_rows, config.max_requests - emitted)
        times = arrivals.take(wanted)
        if len(times) == 0:
            return
        prompt, output = lengths.draw(len(times))
        yield make_chunk(times, mix.draw(len(times)), prompt, output, first_id=emitted)
        emitted += len(times)
