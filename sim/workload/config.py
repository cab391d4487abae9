"""The scenario's ``workload:`` section: a trace file, or a generator with its parameters.

Validation errors are pydantic errors, so the scenario loader can name the field
path (``workload.generator.arrivals.cv``). File paths stay as written here; they
are resolved against the scenario's folder when the workload is streamed.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat, PositiveInt, field_validator, model_validator

TRACE_FORMATS = ("mmsim", "azure-2023", "azure-2024", "burstgpt", "mooncake", "length-pairs")
"""``mmsim`` is the native format (CSV, JSONL or Parquet); the others are importers of public traces."""


class Strict(BaseModel):
    """Base of every workload model: unknown keys are errors (they are usually typos)."""

    model_config = ConfigDict(extra="forbid")


class PoissonArrivals(Strict):
    """Exponential inter-arrival times at a constant rate."""

    process: Literal["poisson"]
    rate_per_s: PositiveFloat


class GammaArrivals(Strict):
    """Gamma inter-arrival times at a constant rate; ``cv`` > 1 is burstier than Poisson, < 1 more regular."""

    process: Literal["gamma"]
    rate_per_s: PositiveFloat
    cv: PositiveFloat


class RateSeriesArrivals(Strict):
    """Piecewise-constant rate (e.g. diurnal): ``windows`` are [start_s, rate_per_s] or [start_s, rate_per_s, cv].

    Each window runs until the next one starts; the last runs until the generator
    stops. ``rate_per_s``, when given, rescales all rates so that their
    time-average equals it (how load sweeps scale a shaped workload).
    """

    process: Literal["rate-series"]
    windows: list[list[float]] = Field(min_length=1)
    rate_per_s: PositiveFloat | None = None

    @field_validator("windows")
    @classmethod
    def _check_windows(cls, windows: list[list[float]]) -> list[list[float]]:
        previous = None
        for index, window in enumerate(windows):
            if len(window) not in (2, 3):
                raise ValueError(f"window {index} must be [start_s, rate_per_s] or [start_s, rate_per_s, cv]")
            start, rate = window[0], window[1]
            cv = window[2] if len(window) == 3 else 1.0
            if start < 0 or rate < 0 or cv <= 0:
                raise ValueError(f"window {index} needs start_s >= 0, rate_per_s >= 0 and cv > 0")
            if previous is not None and start <= previous:
                raise ValueError(f"window {index} must start after window {index - 1}")
            previous = start
        return windows


class ServeGenArrivals(Strict):
    """Per-window arrival processes from a ServeGen client trace file.

    The file has no header and one 600-s window per line:
    ``window_start_s,rate_rps,cv,dist,param1,param2`` (dist Gamma, Weibull or
    Exponential; empty = idle). ``rate_per_s`` rescales like in ``rate-series``.
    """

    process: Literal["servegen"]
    path: str
    rate_per_s: PositiveFloat | None = None


Arrivals = Annotated[PoissonArrivals | GammaArrivals | RateSeriesArrivals | ServeGenArrivals,
                     Field(discriminator="process")]


class ZipfMix(Strict):
    """Model popularity following Zipf's law: the k-th model in ``models`` has weight 1 / k**zipf."""

    zipf: NonNegativeFloat
    models: list[str] = Field(min_length=1)


class ConstantLength(Strict):
    """Every request has the same length."""

    dist: Literal["constant"]
    value: PositiveInt


class UniformLength(Strict):
    """Whole numbers drawn uniformly from [low, high], both included."""

    dist: Literal["uniform"]
    low: PositiveInt
    high: PositiveInt

    @model_validator(mode="after")
    def _ordered(self) -> UniformLength:
        if self.high < self.low:
            raise ValueError("high must be >= low")
        return self


class LognormalLength(Strict):
    """Lognormal with the given mean and coefficient of variation, rounded, at least 1, at most ``max``."""

    dist: Literal["lognormal"]
    mean: PositiveFloat
    cv: NonNegativeFloat
    max: PositiveInt | None = None


class EmpiricalLength(Strict):
    """Lengths resampled from a file: a length-pair CSV or a trace.

    ``column`` is ``prompt`` or ``output`` (the usual column of that role in the
    file: num_prefill_tokens / num_decode_tokens, prompt_tokens / output_tokens,
    ContextTokens / GeneratedTokens, input_length / output_length) or a column
    name; default: the role of the field. When prompt and output lengths come from
    the same file they are drawn as pairs from the same rows (keeping their correlation).
    """

    dist: Literal["empirical"]
    path: str
    column: str | None = None
    max: PositiveInt | None = None


LengthDist = Annotated[ConstantLength | UniformLength | LognormalLength | EmpiricalLength, Field(discriminator="dist")]


class GeneratorConfig(Strict):
    """A synthetic workload: arrivals, model mix and lengths; stops at ``duration_s`` or ``max_requests``."""

    duration_s: PositiveFloat | None = None
    max_requests: PositiveInt | None = None
    arrivals: Arrivals
    mix: ZipfMix | dict[str, NonNegativeFloat]
    prompt_tokens: LengthDist
    output_tokens: LengthDist

    @field_validator("mix")
    @classmethod
    def _check_mix(cls, mix):
        if isinstance(mix, dict) and (not mix or sum(mix.values()) <= 0):
            raise ValueError("mix needs at least one model with a positive share")
        return mix

    @model_validator(mode="after")
    def _stops(self) -> GeneratorConfig:
        if self.duration_s is None and self.max_requests is None:
            raise ValueError("give duration_s or max_requests (or both)")
        return self

    def model_names(self) -> list[str]:
        """The models the mix can draw, in order."""
        return list(self.mix.models if isinstance(self.mix, ZipfMix) else self.mix)


class TraceConfig(Strict):
    """A trace file and how to read it (the options of ``mmsim trace import``).

    ``model`` names the model of a single-model trace; ``model_map`` maps a
    trace's model labels to catalogue models. ``start_s``/``end_s`` cut a window
    (seconds from the trace's start). A ``length-pairs`` file needs ``arrivals``.
    """

    path: str
    format: Literal[TRACE_FORMATS] = "mmsim"
    model: str | None = None
    model_map: dict[str, str] | None = None
    time_scale: PositiveFloat = 1.0
    start_s: NonNegativeFloat | None = None
    end_s: PositiveFloat | None = None
    skip_bad: bool = False
    arrivals: Arrivals | None = None

    @model_validator(mode="after")
    def _consistent(self) -> TraceConfig:
        if self.model is not None and self.model_map is not None:
            raise ValueError("give model or model_map, not both")
        if (self.arrivals is None) != (self.format != "length-pairs"):
            raise ValueError("arrivals is needed for (and only for) format length-pairs")
        if self.start_s is not None and self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError("end_s must be after start_s")
        return self


class WorkloadConfig(Strict):
    """Exactly one of ``generator`` / ``trace``, plus load scaling and the output-length predictor's error.

    ``time_scale`` multiplies all arrival times (0.5 = twice the rate).
    ``output_length_error`` is the CV of the lognormal noise on predicted output
    lengths (0 = oracle); the engine applies it.
    """

    generator: GeneratorConfig | None = None
    trace: TraceConfig | None = None
    time_scale: PositiveFloat = 1.0
    output_length_error: NonNegativeFloat = 0.0

    @model_validator(mode="after")
    def _one_source(self) -> WorkloadConfig:
        if (self.generator is None) == (self.trace is None):
            raise ValueError("give exactly one of generator or trace")
        return self
