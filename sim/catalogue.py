"""Model catalogue: architectures of common open LLMs and the sizes that follow from them.

A :class:`ModelSpec` is one architecture (from the model's published config);
sizes that depend on the numeric format (weight bytes, KV bytes per token) take
a dtype. Quantised formats store weights at ``bits_per_weight``; the KV cache
is held at the model's activation dtype (fp32 for fp32 models, else 16-bit) unless
a KV dtype is given (as in vLLM's ``kv_cache_dtype="auto"`` and llama.cpp defaults).

Models outside the catalogue are described by a Hugging Face ``config.json``
(:func:`model_from_hf_config`) and registered under a name of the user's choice
(:func:`register_model`), after which they are found like catalogue models.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml

from sim.errors import MmsimError

BITS_PER_WEIGHT = {"fp32": 32.0, "fp16": 16.0, "bf16": 16.0, "fp8": 8.0, "int8": 8.0, "int4": 4.5, "q4": 4.5}
"""Effective storage bits per weight; 4-bit formats carry ~0.5 bit of scales (GGUF Q4_K, AWQ)."""

KV_BITS = {"fp32": 32.0, "fp16": 16.0, "bf16": 16.0, "fp8": 8.0, "int8": 8.0, "fp4": 4.5}
"""Storage bits per cached K or V value; NVFP4 adds an 8-bit scale per block of 16 values."""


@dataclass(frozen=True)
class ModelSpec:
    """The architecture of one decoder-only transformer."""

    name: str
    hf_id: str
    family: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    tied_embeddings: bool
    qkv_bias: bool = False
    qk_norm: bool = False
    num_experts: int = 0  # MoE: routed experts per layer (0: a dense MLP of ffn_size)
    experts_per_token: int = 0
    moe_ffn_size: int = 0  # each routed expert's intermediate size
    shared_ffn_size: int = 0  # always-active shared expert(s), in all

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (attention, SwiGLU MLP, norms)."""
        return self._attention_params() + self._mlp_params(self.num_experts) + 2 * self.hidden_size

    @property
    def active_layer_params(self) -> int:
        """Parameters of one decoder layer that each token multiplies by (MoE: the routed experts only)."""
        return self._attention_params() + self._mlp_params(self.experts_per_token) + 2 * self.hidden_size

    def _attention_params(self) -> int:
        h, q_dim, kv_dim = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        attention = h * q_dim + 2 * h * kv_dim + q_dim * h
        if self.qkv_bias:
            attention += q_dim + 2 * kv_dim
        if self.qk_norm:
            attention += 2 * self.head_dim
        return attention

    def _mlp_params(self, experts: int) -> int:
        h = self.hidden_size
        if self.num_experts == 0:
            return 3 * h * self.ffn_size
        return 3 * h * (experts * self.moe_ffn_size + self.shared_ffn_size) + h * self.num_experts  # + router

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    @property
    def params(self) -> int:
        return self.embedding_params + self.num_layers * self.layer_params + self.hidden_size + self.lm_head_params

    def weight_bytes(self, dtype: str = "fp16") -> int:
        return int(round(self.params * bits_per_weight(dtype) / 8))

    def layer_weight_bytes(self, dtype: str = "fp16") -> float:
        return self.layer_params * bits_per_weight(dtype) / 8

    def kv_bytes_per_token(self, kv_dtype: str = "fp16") -> int:
        """Bytes of K and V cached per token across all layers."""
        return int(2 * self.num_layers * self.num_kv_heads * self.head_dim * kv_bits(kv_dtype)) // 8

    def kv_bytes_per_token_per_layer(self, kv_dtype: str = "fp16") -> int:
        return self.kv_bytes_per_token(kv_dtype) // self.num_layers

    @property
    def flops_per_token(self) -> int:
        """Matmul FLOPs per generated token at zero context (2 per weight, LM head included)."""
        return 2 * (self.num_layers * self.active_layer_params + self.vocab_size * self.hidden_size)

    @property
    def attention_flops_per_token_per_context_token(self) -> int:
        """Extra FLOPs per generated token for each token already in context (QK^T and AV)."""
        return 4 * self.num_layers * self.num_heads * self.head_dim

    def describe(self, dtype: str = "fp16", kv_dtype: str = "fp16") -> dict:
        """A JSON-ready description for the given weight and KV dtypes."""
        data = asdict(self)
        data.update(
            dtype=dtype,
            kv_dtype=kv_dtype,
            params=self.params,
            weight_bytes=self.weight_bytes(dtype),
            weight_gib=round(self.weight_bytes(dtype) / 2**30, 3),
            kv_bytes_per_token=self.kv_bytes_per_token(kv_dtype),
            kv_mib_per_token=round(self.kv_bytes_per_token(kv_dtype) / 2**20, 5),
            flops_per_token=self.flops_per_token,
            attention_flops_per_token_per_context_token=self.attention_flops_per_token_per_context_token,
        )
        return data


def known_dtype(dtype: str) -> str:
    """``dtype`` if mmsim knows it (a validator's check: ValueError otherwise)."""
    if dtype not in BITS_PER_WEIGHT:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(BITS_PER_WEIGHT)}")
    return dtype


def bits_per_weight(dtype: str) -> float:
    try:
        return BITS_PER_WEIGHT[dtype]
    except KeyError:
        raise MmsimError(f"unknown dtype {dtype!r}; expected one of {', '.join(BITS_PER_WEIGHT)}") from None


def kv_bits(kv_dtype: str) -> float:
    try:
        return KV_BITS[kv_dtype]
    except KeyError:
        raise MmsimError(f"unknown KV dtype {kv_dtype!r}; expected one of {', '.join(KV_BITS)}") from None


def default_kv_dtype(dtype: str) -> str:
    """The KV cache dtype a model at weight ``dtype`` gets by default: its activation dtype, 16-bit for
    quantised weights (vLLM's ``kv_cache_dtype="auto"``)."""
    return "fp32" if dtype == "fp32" else "fp16"


@lru_cache(maxsize=1)
def _builtin_catalogue() -> dict[str, ModelSpec]:
    text = resources.files("sim").joinpath("data/models.yaml").read_text()
    return {name: ModelSpec(name=name, **fields) for name, fields in yaml.safe_load(text).items()}


_REGISTERED: dict[str, ModelSpec] = {}
"""Models read from config files in this process, by the name the user gave them."""


def catalogue() -> dict[str, ModelSpec]:
    """All known models by name: the built-in ones and any registered from a config file."""
    return _builtin_catalogue() | _REGISTERED


def register_model(spec: ModelSpec) -> ModelSpec:
    """Make ``spec`` known by its name (a later config under the same name replaces it)."""
    if spec.name in _builtin_catalogue():
        raise MmsimError(f"model name {spec.name!r} is a catalogue model; give the config's model another name")
    _REGISTERED[spec.name] = spec
    return spec


def get_model(name: str) -> ModelSpec:
    """The catalogue entry for ``name``; an unknown name is a user error listing the known ones."""
    models = catalogue()
    if name not in models:
        raise MmsimError(f"unknown model {name!r}; known models: {', '.join(sorted(models))}")
    return models[name]


# -- Hugging Face config.json --------------------------------------------------------------------
QKV_BIAS_FAMILIES = {"qwen2", "qwen2_moe"}  # Qwen2's attention projections always carry biases
QK_NORM_FAMILIES = {"qwen3", "qwen3_moe"}
EXPERT_COUNT = ("num_experts", "num_local_experts", "n_routed_experts")
EXPERTS_PER_TOKEN = ("num_experts_per_tok", "num_experts_per_token")
UNTIED_BY_DEFAULT = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe"}
"""Families whose config class defaults ``tie_word_embeddings`` to false (transformers' base default is true)."""


def model_from_hf_config(path: str | Path, name: str) -> ModelSpec:
    """The architecture a Hugging Face ``config.json`` describes, named ``name``.

    Reads layers, hidden size, heads, KV heads (default: the heads), head dim (default: hidden / heads),
    FFN size, vocabulary, tied embeddings, Qwen2 biases / Qwen3 q-k norms by ``model_type``, and MoE
    fields (``num_experts`` / ``num_local_experts`` / ``n_routed_experts``, ``num_experts_per_tok``,
    ``moe_intermediate_size``, shared experts) where present. A missing or impossible field is a one-line
    error naming it.
    """
    from sim.files import load_json

    source = str(path)
    data = load_json(Path(path), "model config")  # a regular file (a FIFO blocked), UTF-8, of bounded size
    if not isinstance(data, dict):
        raise MmsimError("expected a JSON object (a Hugging Face config.json)", source=source)
    text_config = data.get("text_config")
    fields = _ConfigFields(text_config if isinstance(text_config, dict) else data, data, source)
    family = str(fields.config.get("model_type", data.get("model_type", "unknown")))
    if fields.config.get("kv_lora_rank") is not None:
        # DeepSeek's multi-head latent attention caches one compressed latent per token, not KV heads x head_dim:
        # priced by its heads, its KV cache and the memory it leaves would be several times off.
        raise fields.error("multi-head latent attention (DeepSeek-style MLA) is not modelled: its KV cache is a "
                           "latent of this rank per token, not KV heads x head_dim", "kv_lora_rank")
    layers, hidden, heads, kv_heads, head_dim = _attention_shape(fields)
    experts, per_token, moe_ffn, shared = _experts(fields)
    return ModelSpec(
        name=name, hf_id=str(data.get("_name_or_path", "") or source), family=family,
        num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        ffn_size=fields.whole("intermediate_size", "n_inner", default=moe_ffn if experts else None),
        vocab_size=fields.whole("vocab_size"),
        tied_embeddings=fields.flag("tie_word_embeddings", default=family not in UNTIED_BY_DEFAULT),
        qkv_bias=fields.flag("attention_bias", default=family in QKV_BIAS_FAMILIES, outer=False),
        qk_norm=family in QK_NORM_FAMILIES,
        num_experts=experts, experts_per_token=per_token, moe_ffn_size=moe_ffn, shared_ffn_size=shared,
    )


class _ConfigFields:
    """The fields of one config.json (its ``text_config`` for a multimodal model), each checked as it is read:
    a zero head size divided by zero deep in a run, and ``bool("no")`` is True."""

    def __init__(self, config: dict, outer: dict, source: str):
        self.config, self.outer, self.source = config, outer, source

    def given(self, *names: str) -> str | None:
        """The first of ``names`` the config sets (JSON null counts as unset, as in transformers)."""
        return next((candidate for candidate in names if self.config.get(candidate) is not None), None)

    def whole(self, key: str, *aliases: str, default: int | None = None, minimum: int = 1) -> int:
        """A whole number >= ``minimum`` under ``key`` or an alias; ``default`` when none is set (None: required)."""
        found = self.given(key, *aliases)
        if found is None:
            if default is None:
                raise self.error(f"missing field {' or '.join((key, *aliases))} (needed for the architecture)", key)
            return default
        value = self.config[found]
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            expected = "a positive whole number" if minimum == 1 else f"a whole number >= {minimum}"
            raise self.error(f"expected {expected}, got {_as_written(value)}", found)
        return value

    def flag(self, key: str, default: bool, outer: bool = True) -> bool:
        """A JSON boolean under ``key`` (also looked up beside ``text_config`` when ``outer``), else ``default``."""
        value = self.config.get(key, self.outer.get(key) if outer else None)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(f"expected true or false, got {_as_written(value)}", key)
        return value

    def error(self, message: str, field: str | None) -> MmsimError:
        return MmsimError(message, source=self.source, field=field)


def _as_written(value: object) -> str:
    """A JSON value as the file spells it (``true``, not Python's ``True``), cut for a message."""
    from sim.files import cut

    return cut(json.dumps(value))


def _attention_shape(fields: _ConfigFields) -> tuple[int, int, int, int, int]:
    """(layers, hidden size, heads, KV heads, head dim), the heads splitting the hidden size evenly."""
    layers = fields.whole("num_hidden_layers", "n_layer", "num_layers")
    hidden = fields.whole("hidden_size", "n_embd", "d_model")
    heads = fields.whole("num_attention_heads", "n_head")
    kv_heads = fields.whole("num_key_value_heads", default=heads, minimum=0)
    if not 1 <= kv_heads <= heads or heads % kv_heads:
        raise fields.error(f"num_key_value_heads {kv_heads} must divide num_attention_heads {heads}",
                           "num_key_value_heads")
    if fields.given("head_dim") is None and hidden % heads:
        raise fields.error(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}; give head_dim",
                           "hidden_size")
    return layers, hidden, heads, kv_heads, fields.whole("head_dim", default=hidden // heads)


def _experts(fields: _ConfigFields) -> tuple[int, int, int, int]:
    """(routed experts, experts per token, each expert's FFN size, shared experts' FFN size); a dense model's
    are 0 but for any experts per token its config gives (kept as read: no cost depends on it)."""
    experts = fields.whole(*EXPERT_COUNT, default=0, minimum=0)
    if not experts:
        return 0, fields.whole(*EXPERTS_PER_TOKEN, default=0, minimum=0), 0, 0
    per_token = fields.whole(*EXPERTS_PER_TOKEN)
    if per_token > experts:
        raise fields.error(f"{per_token} is more than {fields.given(*EXPERT_COUNT)} {experts}",
                           fields.given(*EXPERTS_PER_TOKEN))
    moe_ffn = fields.whole("moe_intermediate_size", default=0, minimum=0) or fields.whole("intermediate_size")
    shared = (fields.whole("shared_expert_intermediate_size", default=0, minimum=0)
              or fields.whole("n_shared_experts", default=0, minimum=0) * moe_ffn)
    return experts, per_token, moe_ffn, shared


_CONFIG_FOLDER: ContextVar[Path | None] = ContextVar("config_folder", default=None)


@contextmanager
def configs_relative_to(folder: Path) -> Iterator[None]:
    """Resolve relative ``config`` paths against ``folder`` (a scenario file's folder) inside this block."""
    token = _CONFIG_FOLDER.set(Path(folder))
    try:
        yield
    finally:
        _CONFIG_FOLDER.reset(token)


def resolve_config_path(path: str) -> Path:
    """``path`` as given when absolute or when no folder is set; else relative to :func:`configs_relative_to`'s."""
    folder = _CONFIG_FOLDER.get()
    candidate = Path(path)
    return candidate if candidate.is_absolute() or folder is None else folder / candidate
