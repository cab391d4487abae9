"""The scenario's ``workload:`` section: a trace file, or a generator with its parameters.

Validation errors are pydantic errors, so the scenario loader can name the field
path (``workload.generator.arrivals.cv``). File paths stay as written here; they
are resolved against the scenario's folder when the workload is streamed.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import (BaseModel, ConfigDict, Field, PlainValidator, PrivateAttr, TypeAdapter, field_validator,
                      model_validator)

MAX_TIME_S = 1e9
"""Latest simulated time (about 32 years): later arrivals lose the precision a step of microseconds needs."""
MAX_RATE_PER_S = 1e6
MIN_CV = 1e-3
"""Most regular gamma arrivals (shape 10**6: gaps within ~0.1% of the mean); below ~1e-154 the shape 1/cv**2 is no
longer a finite float."""
MAX_CV = 100.0
MAX_REQUESTS = 10**9
"""Most requests one workload may produce (a run is bounded further by sim.runner.check_run_size)."""
MAX_LENGTH_TOKENS = 10**7
"""Longest generated prompt or output, far above any model's context."""
PREFIX_BLOCK_TOKENS = 512
"""Prompt tokens one prefix id stands for unless a workload says otherwise (Mooncake's hash_ids)."""
MAX_PREFIX_BLOCK_TOKENS = 1 << 20
"""Most prompt tokens one prefix id may stand for."""
MAX_PREFIX_ID = 2**63 - 1
"""Largest prefix id (a trace's ``prefix_ids``, Mooncake's ``hash_ids``): ids are whole numbers from 0 to this, the
int64 that a Parquet trace stores them as."""

Rate = Annotated[float, Field(ge=1e-6, le=MAX_RATE_PER_S)]
Cv = Annotated[float, Field(ge=MIN_CV, le=MAX_CV)]
Seconds = Annotated[float, Field(gt=0, le=MAX_TIME_S)]
Instant = Annotated[float, Field(ge=0, le=MAX_TIME_S)]
Length = Annotated[int, Field(ge=1, le=MAX_LENGTH_TOKENS)]
Scale = Annotated[float, Field(ge=1e-6, le=1e6)]
MAX_SHARE = 1e12
"""Largest share one model may have in a mix (shares are relative: only their ratios matter)."""
MAX_NAME_CHARS = 200
"""Longest name or label a user gives: a scenario's or sweep's ``name``, a deployment's, a trace's ``slo_class``."""
MAX_MODEL_NAME_CHARS = MAX_NAME_CHARS
ModelName = Annotated[str, Field(min_length=1, max_length=MAX_MODEL_NAME_CHARS)]
"""A deployment's name as requests address it (a catalogue model, an alias or a config-file model's name)."""

TraceFormat = Literal["mmsim", "azure-2023", "azure-2024", "burstgpt", "mooncake", "length-pairs"]
"""``mmsim`` is the native format (CSV, JSONL or Parquet); the others are importers of public traces."""
TRACE_FORMATS: tuple[str, ...] = get_args(TraceFormat)


class Strict(BaseModel):
    """Base of every workload model: unknown keys are errors (they are usually typos); numbers are finite."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class PoissonArrivals(Strict):
    """Exponential inter-arrival times at a constant rate."""

    process: Literal["poisson"]
    rate_per_s: Rate


class GammaArrivals(Strict):
    """Gamma inter-arrival times at a constant rate; ``cv`` > 1 is burstier than Poisson, < 1 more regular."""

    process: Literal["gamma"]
    rate_per_s: Rate
    cv: Cv


class RateSeriesArrivals(Strict):
    """Piecewise-constant rate (e.g. diurnal): ``windows`` are [start_s, rate_per_s] or [start_s, rate_per_s, cv].

    Each window runs until the next one starts; the last runs until the generator
    stops. ``rate_per_s``, when given, rescales all rates so that their
    time-average equals it (how load sweeps scale a shaped workload).
    """

    process: Literal["rate-series"]
    windows: list[list[float]] = Field(min_length=1, max_length=1_000_000)
    rate_per_s: Rate | None = None

    @field_validator("windows")
    @classmethod
    def _check_windows(cls, windows: list[list[float]]) -> list[list[float]]:
        previous = None
        for index, window in enumerate(windows):
            if len(window) not in (2, 3):
                raise ValueError(f"window {index} must be [start_s, rate_per_s] or [start_s, rate_per_s, cv]")
            start, rate = window[0], window[1]
            cv = window[2] if len(window) == 3 else 1.0
            if not (0 <= start <= MAX_TIME_S and 0 <= rate <= MAX_RATE_PER_S and MIN_CV <= cv <= MAX_CV):
                raise ValueError(f"window {index} needs 0 <= start_s <= {MAX_TIME_S:g}, "
                                 f"0 <= rate_per_s <= {MAX_RATE_PER_S:g} and {MIN_CV:g} <= cv <= {MAX_CV:g}")
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
    rate_per_s: Rate | None = None


Arrivals = Annotated[PoissonArrivals | GammaArrivals | RateSeriesArrivals | ServeGenArrivals,
                     Field(discriminator="process")]


class ZipfMix(Strict):
    """Model popularity following Zipf's law: the k-th model in ``models`` has weight 1 / k**zipf."""

    zipf: float = Field(ge=0, le=100)
    models: list[ModelName] = Field(min_length=1)

    @field_validator("models")
    @classmethod
    def _each_once(cls, models: list[str]) -> list[str]:
        """A model listed twice would take two ranks' weights, a popularity nobody asked for."""
        twice = sorted({name for name in models if models.count(name) > 1})
        if twice:
            raise ValueError(f"{twice[0]!r} is listed twice")
        return models


def _share(value: object) -> float:
    """One model's share of an explicit mix: a finite number from 0 to MAX_SHARE; text and true/false are refused,
    not converted (in a scenario they are typos)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:  # NaN is not >= 0
        raise ValueError(f"expected a share >= 0 (a number), not {value!r:.40}")
    if value > MAX_SHARE:
        raise ValueError(f"expected a share of at most {MAX_SHARE:g}, not {value!r}")
    return float(value)


Share = Annotated[float, PlainValidator(_share)]
_SHARES = TypeAdapter(dict[str, Share])


def _checked_shares(mix: dict) -> dict[str, float]:
    """An explicit mix's shares, each checked (a ValidationError at the bad one's model name), not all 0."""
    shares = _SHARES.validate_python(mix)
    if sum(shares.values()) <= 0:
        state = "is empty" if not shares else "has only shares of 0"
        raise ValueError(f"{state}: expected {{model: share, ...}} with at least one share above 0")
    # Checked by hand, not by the key's type: the message gives a long name's length instead of quoting it.
    for name in shares:
        if not 1 <= len(name) <= MAX_MODEL_NAME_CHARS:
            raise ValueError(f"model names are 1 to {MAX_MODEL_NAME_CHARS} characters, not {len(name)}")
    return shares


class ConstantLength(Strict):
    """Every request has the same length."""

    dist: Literal["constant"]
    value: Length


class UniformLength(Strict):
    """Whole numbers drawn uniformly from [low, high], both included."""

    dist: Literal["uniform"]
    low: Length
    high: Length

    @model_validator(mode="after")
    def _ordered(self) -> UniformLength:
        if self.high < self.low:
            raise ValueError("high must be >= low")
        return self


class LognormalLength(Strict):
    """Lognormal with the given mean and coefficient of variation, rounded, at least 1, at most ``max``."""

    dist: Literal["lognormal"]
    mean: float = Field(gt=0, le=MAX_LENGTH_TOKENS)
    cv: float = Field(ge=0, le=MAX_CV)
    max: Length | None = None


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
    max: Length | None = None


LengthDist = Annotated[ConstantLength | UniformLength | LognormalLength | EmpiricalLength, Field(discriminator="dist")]


class ConversationConfig(Strict):
    """Shared-prefix traffic (see :mod:`sim.workload.conversations`): each arrival starts a conversation of
    ``turns`` turns (uniform in [low, high]) for one of ``tenants`` tenants of its model, whose system prompt of
    ``system_prompt_tokens`` tokens opens every prompt; a turn's prompt then carries the conversation so far
    and a new message (the generator's ``prompt_tokens``), its answer is ``output_tokens`` long, and the next
    turn arrives an exponentially distributed think time (mean ``think_time_s``) later."""

    tenants: int = Field(default=1, ge=1, le=1 << 20)
    system_prompt_tokens: int = Field(default=0, ge=0, le=MAX_LENGTH_TOKENS)
    turns: UniformLength = Field(default_factory=lambda: UniformLength(dist="uniform", low=1, high=1))
    think_time_s: float = Field(default=0.0, ge=0, le=1e6)


class GeneratorConfig(Strict):
    """A synthetic workload: arrivals, model mix and lengths; stops at ``duration_s`` or ``max_requests``.

    With ``conversations``, arrivals start conversations and every turn is a request."""

    duration_s: Seconds | None = None
    max_requests: int | None = Field(default=None, ge=1, le=MAX_REQUESTS)
    arrivals: Arrivals
    mix: ZipfMix | dict[str, Share]
    prompt_tokens: LengthDist
    output_tokens: LengthDist
    conversations: ConversationConfig | None = None

    @field_validator("mix", mode="before")
    @classmethod
    def _check_mix(cls, mix):
        """The mix validated as the one kind it is written as, before pydantic's union, which would list each
        kind's errors (a negative share read as a Zipf mix missing ``zipf``). A ValidationError raised here keeps
        its place, so a bad share is named by its model (``mix.qwen3-8b``); what passes, the union then takes as
        it is (a mode="plain" validator would lose the union's serializer)."""
        if isinstance(mix, ZipfMix) or isinstance(mix, dict) and ("zipf" in mix or "models" in mix):
            return ZipfMix.model_validate(mix, strict=True)  # strict, as scenario files are read
        if not isinstance(mix, dict):
            raise ValueError(f"expected {{model: share, ...}} or {{zipf: exponent, models: [...]}}, not {mix!r:.40}")
        return _checked_shares(mix)

    @model_validator(mode="after")
    def _stops(self) -> GeneratorConfig:
        if self.duration_s is None and self.max_requests is None:
            raise ValueError("give duration_s or max_requests (or both)")
        expected = self.expected_requests()
        if expected is not None and expected > MAX_REQUESTS:
            raise ValueError(f"expects about {expected:.3g} requests (rate_per_s x duration_s); at most "
                             f"{MAX_REQUESTS:.0e} per workload: lower them or set max_requests")
        return self

    def expected_requests(self) -> float | None:
        """About how many requests this generator makes (an upper estimate); None when only a file can tell."""
        arrivals, duration_s = self.arrivals, self.duration_s
        rate = arrivals.rate_per_s
        if rate is None and isinstance(arrivals, RateSeriesArrivals):
            rate = max(window[1] for window in arrivals.windows)
        by_rate = None if rate is None or duration_s is None else rate * duration_s
        if by_rate is not None and self.conversations is not None:
            by_rate *= self.conversations.turns.high  # every arrival starts a conversation of up to that many turns
        if self.max_requests is None:
            return by_rate
        return float(self.max_requests) if by_rate is None else min(by_rate, float(self.max_requests))

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
    format: TraceFormat = "mmsim"
    model: ModelName | None = None
    model_map: dict[str, ModelName] | None = None
    time_scale: Scale = 1.0
    start_s: Instant | None = None
    end_s: Seconds | None = None
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
        from sim.workload.importers import FORMATS  # the formats import this module

        if not FORMATS[self.format].model_column:
            if self.model_map is not None:
                raise ValueError(f"{self.format} traces have no model column to map; name their model with model: NAME")
            if self.model is None:
                raise ValueError(f"{self.format} traces have no model column; name the model their requests are "
                                 "for (model: NAME)")
        return self


class WorkloadConfig(Strict):
    """Exactly one of ``generator`` / ``trace``, plus load scaling and the output-length predictor's error.

    ``time_scale`` multiplies all arrival times (0.5 = twice the rate).
    ``output_length_error`` is the CV of the lognormal noise on predicted output
    lengths (0 = oracle); the engine applies it. ``prefix_block_tokens`` is the
    granularity of the trace's ``prefix_ids``. A scenario records the names it
    serves in ``served_models``, so that a trace row naming another model is an
    error rather than a silent drop.
    """

    generator: GeneratorConfig | None = None
    trace: TraceConfig | None = None
    time_scale: Scale = 1.0
    output_length_error: float = Field(default=0.0, ge=0, le=10)
    prefix_block_tokens: int = Field(default=PREFIX_BLOCK_TOKENS, ge=1, le=MAX_PREFIX_BLOCK_TOKENS,
                                     description="prompt tokens each of a trace's prefix_ids stands for "
                                     "(Mooncake's hash_ids: 512)")
    _served_models: frozenset[str] | None = PrivateAttr(default=None)

    @property
    def served_models(self) -> frozenset[str] | None:
        """The deployments of the scenario holding this workload (None outside a scenario)."""
        return self._served_models

    def serve(self, names) -> None:
        """Record the deployments the scenario serves."""
        self._served_models = frozenset(names)

    def requested_models(self) -> list[str]:
        """The models the workload names without reading a file (mix, trace ``model`` or ``model_map``)."""
        if self.generator is not None:
            return self.generator.model_names()
        assert self.trace is not None  # _one_source: exactly one of generator and trace
        if self.trace.model is not None:
            return [self.trace.model]
        return sorted(set((self.trace.model_map or {}).values()))

    @model_validator(mode="after")
    def _one_source(self) -> WorkloadConfig:
        if (self.generator is None) == (self.trace is None):
            raise ValueError("give exactly one of generator or trace")
        return self
