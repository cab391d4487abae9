"""Samplers for the generator: model popularity and prompt/output length distributions.

Each sampler draws from its own random stream, one value per request in order,
so the values depend only on the seed and the request index.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from sim.errors import MmsimError
from sim.workload.config import MAX_LENGTH_TOKENS, ConstantLength, EmpiricalLength, LognormalLength, UniformLength, ZipfMix
from sim.workload.textfiles import file_kind, resolve_input

ROLE_COLUMNS = {
    "prompt": ("num_prefill_tokens", "prompt_tokens", "ContextTokens", "input_length", "Request tokens"),
    "output": ("num_decode_tokens", "output_tokens", "GeneratedTokens", "output_length", "Response tokens"),
}
"""Where each role's lengths live in the length-pair, native, Azure, Mooncake and BurstGPT formats."""


def mix_weights(mix) -> tuple[list[str], np.ndarray]:
    """Model names and their probabilities (normalised) from an explicit or Zipf mix."""
    if isinstance(mix, ZipfMix):
        names = list(mix.models)
        weights = 1.0 / np.arange(1, len(names) + 1, dtype=float) ** mix.zipf
    else:
        names = list(mix)
        weights = np.array([mix[name] for name in names], dtype=float)
    return names, weights / weights.sum()


class MixSampler:
    """Draws a model name per request with the mix's probabilities."""

    def __init__(self, mix, rng: np.random.Generator):
        names, self.probabilities = mix_weights(mix)
        self.names = np.array(names, dtype=object)
        self.rng = rng

    def draw(self, count: int) -> np.ndarray:
        """Model names of the next ``count`` requests."""
        return self.names[self.rng.choice(len(self.names), size=count, p=self.probabilities)]


def lognormal_params(mean: float, cv: float) -> tuple[float, float]:
    """(mu, sigma) of the underlying normal for a lognormal with this mean and CV."""
    sigma = math.sqrt(math.log1p(cv**2))
    return math.log(mean) - sigma**2 / 2, sigma


class LengthSampler:
    """Draws whole-number lengths >= 1 from one length distribution (pairs of rows for shared files)."""

    def __init__(self, spec, role: str, rng: np.random.Generator, base_dir: Path | None, field: str,
                 rows: np.ndarray | None = None):
        self.spec, self.rng = spec, rng
        self.values = rows
        if isinstance(spec, EmpiricalLength) and rows is None:
            path = resolve_input(spec.path, base_dir, f"{field}.path")
            self.values = read_lengths(path, {role: spec.column or role})[role]

    @property
    def rows(self) -> np.ndarray:
        """The file's lengths, which only an empirical spec has."""
        assert self.values is not None
        return self.values

    def draw(self, count: int) -> np.ndarray:
        """Lengths of the next ``count`` requests."""
        spec = self.spec
        if isinstance(spec, ConstantLength):
            return np.full(count, spec.value, dtype=np.int64)
        if isinstance(spec, UniformLength):
            return self.rng.integers(spec.low, spec.high + 1, size=count, dtype=np.int64)
        if isinstance(spec, LognormalLength):
            if spec.cv == 0:
                values = np.full(count, float(spec.mean))
            else:
                mu, sigma = lognormal_params(spec.mean, spec.cv)
                values = self.rng.lognormal(mu, sigma, count)
            return np.clip(np.rint(values), 1, spec.max or MAX_LENGTH_TOKENS).astype(np.int64)
        return self.pick(self.rng.integers(0, len(self.rows), size=count))

    def pick(self, index: np.ndarray) -> np.ndarray:
        """Empirical lengths at the given rows of the file (capped at ``max``)."""
        values = self.rows[index]
        return np.minimum(values, self.spec.max) if self.spec.max else values


def read_lengths(path: Path, columns: dict[str, str]) -> dict[str, np.ndarray]:
    """Positive lengths from a file, one array per role; rows with a missing or zero value are skipped.

    ``columns`` maps each role to ``prompt``/``output`` (that role's usual column)
    or an exact column name. Zero lengths (failed requests in some traces) are dropped.
    """
    fast = _whole_number_csv(path, columns)
    if fast is not None:
        return _positive_rows(fast, path)
    import pandas as pd  # the general reader; a plain CSV of whole numbers (the usual case) needs none of it

    kind = file_kind(path)
    try:
        if kind == "csv":
            frame = pd.read_csv(path)
        elif kind == "jsonl":
            frame = pd.read_json(path, lines=True)
        else:
            frame = pd.read_parquet(path)
    except (OSError, ValueError, pd.errors.ParserError) as error:
        raise MmsimError(f"cannot read lengths ({str(error).splitlines()[0]})", source=str(path)) from None
    picked = {}
    for role, wanted in columns.items():
        name, names = _column_name(wanted, frame.columns)
        if name is None:
            raise MmsimError(f"no {' / '.join(names)} column (the file has {', '.join(map(str, frame.columns))})",
                             source=str(path))
        values = pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        wrong = np.flatnonzero(~np.isnan(values) & ((values != np.floor(values)) | (values < 0)))
        text = np.flatnonzero(np.isnan(values) & frame[name].notna().to_numpy())
        if len(wrong) or len(text):
            row = int(min([*wrong[:1], *text[:1]]))
            line = f"line {row + 2}" if kind == "csv" else f"row {row + 1}"
            cell = frame[name].iloc[row]  # a NumPy scalar, shown as the number it is, not as np.int64(-5)
            shown = cell.item() if isinstance(cell, np.generic) else cell
            raise MmsimError(f"{name} {shown!r} is not a whole number >= 0", source=str(path), field=line)
        picked[role] = values
    return _positive_rows(picked, path)


def _column_name(wanted: str, present) -> tuple[str | None, tuple[str, ...]]:
    """The column a role (``prompt``/``output``) or an exact name refers to among ``present``, and what was looked for."""
    names = ROLE_COLUMNS.get(wanted, (wanted,))
    return next((name for name in names if name in present), None), names


def _whole_number_csv(path: Path, columns: dict[str, str]) -> dict[str, np.ndarray] | None:
    """The wanted columns of a plain ``.csv`` as floats (what the general reader gives), read by pyarrow, when
    each is a column of whole numbers >= 0 with no gaps; None for anything else, which the general reader then
    reads and reports on."""
    if path.suffix.lower() != ".csv":
        return None
    import pyarrow as pa
    import pyarrow.csv as pacsv

    try:
        table = pacsv.read_csv(path, read_options=pacsv.ReadOptions(use_threads=False))
    except (OSError, pa.ArrowException):
        return None
    if len(set(table.column_names)) < len(table.column_names):
        return None  # repeated names: pandas renames them, so leave them to it
    picked = {}
    for role, wanted in columns.items():
        name = _column_name(wanted, table.column_names)[0]
        if name is None:
            return None
        column = table.column(name).combine_chunks()
        if column.type != pa.int64() or column.null_count:
            return None
        # From the buffer: Array.to_numpy would import pandas. As floats, as the general reader converts them.
        values = np.frombuffer(column.buffers()[1], np.int64)[column.offset:column.offset + len(column)].astype(np.float64)
        if (values < 0).any():
            return None
        picked[role] = values
    return picked


def _positive_rows(picked: dict[str, np.ndarray], path: Path) -> dict[str, np.ndarray]:
    """The rows where every role's length is at least 1, as int64 arrays."""
    usable = np.logical_and.reduce([values >= 1 for values in picked.values()])
    if not usable.any():
        raise MmsimError("no rows with positive lengths", source=str(path))
    return {role: values[usable].astype(np.int64) for role, values in picked.items()}


class LengthPairSampler:
    """Prompt and output lengths per request; two empirical specs on one file share the row draw (joint pairs)."""

    def __init__(self, prompt_spec, output_spec, prompt_rng, output_rng, base_dir: Path | None, field: str):
        self.joint = False
        if isinstance(prompt_spec, EmpiricalLength) and isinstance(output_spec, EmpiricalLength):
            path = resolve_input(prompt_spec.path, base_dir, f"{field}.prompt_tokens.path")
            if path == resolve_input(output_spec.path, base_dir, f"{field}.output_tokens.path"):
                pairs = read_lengths(path, {"prompt": prompt_spec.column or "prompt",
                                            "output": output_spec.column or "output"})
                self.joint = True
                self.prompt = LengthSampler(prompt_spec, "prompt", prompt_rng, base_dir, field, rows=pairs["prompt"])
                self.output = LengthSampler(output_spec, "output", output_rng, base_dir, field, rows=pairs["output"])
        if not self.joint:
            self.prompt = LengthSampler(prompt_spec, "prompt", prompt_rng, base_dir, f"{field}.prompt_tokens")
            self.output = LengthSampler(output_spec, "output", output_rng, base_dir, f"{field}.output_tokens")

    def draw(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(prompt lengths, output lengths) of the next ``count`` requests."""
        if self.joint:
            index = self.prompt.rng.integers(0, len(self.prompt.rows), size=count)
            return self.prompt.pick(index), self.output.pick(index)
        return self.prompt.draw(count), self.output.draw(count)
