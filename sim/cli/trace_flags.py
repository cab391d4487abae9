"""How ``mmsim trace`` reads its flags and generator files: NAME=VALUE pairs, length specs, rate windows, model
names, and a scenario's (or workload's, or generator's) generator mapping, each problem named by its flag or file."""

from __future__ import annotations

from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from sim.cli.common import comma_list
from sim.errors import MmsimError, pydantic_error_message
from sim.files import cut, load_yaml, parse_yaml
from sim.workload.config import MAX_PREFIX_BLOCK_TOKENS, PREFIX_BLOCK_TOKENS, GeneratorConfig


def parse_pairs(text: str, flag: str) -> dict[str, str]:
    """``a=1,b=2`` as a dict of strings; anything else (an empty entry or a name given twice included) is a user
    error naming the flag."""
    pairs: dict[str, str] = {}
    for key, value in comma_list(text, flag, _pair, "NAME=VALUE pair", "NAME=VALUE[,NAME=VALUE...]", unique=False):
        if key in pairs:  # the later value silently won: a typo, or two shares meant to be added
            raise MmsimError(f"{cut(key)!r} is given twice", field=flag)
        pairs[key] = value
    return pairs


def _pair(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise ValueError(item)
    return key.strip(), value.strip()


def validate(adapter_type, data, source: str):
    """Validate flag or file values strictly (``"16"`` is not a number) with finite numbers."""
    try:
        return TypeAdapter(adapter_type).validate_python(data, strict=True)
    except ValidationError as error:
        raise pydantic_error_message(error, source) from None


GENERATOR_FLAGS = {"rate_per_s": "--rate", "cv": "--cv", "windows": "--windows", "path": "--servegen-file",
                   "duration_s": "--duration", "max_requests": "--max-requests", "mix": "--mix",
                   "prompt_tokens": "--prompt", "output_tokens": "--output", "process": "--process"}
"""The ``trace generate`` flag that sets each generator field, for messages about values given as flags."""
LENGTH_FLAGS = ("--prompt", "--output")
"""The flags of a length spec (``DIST,KEY=VALUE,...``), whose problems are named by their key."""


def validate_flags(data: dict):
    """The generator the flags describe; a problem is named by its flag (``--cv``), not the field it sets."""
    try:
        return TypeAdapter(GeneratorConfig).validate_python(data, strict=True)
    except ValidationError as error:
        raise _flag_error(error, data) from None


def _flag_error(error: ValidationError, data: dict) -> MmsimError:
    """One line for the first problem of the flags, naming the flag and, in a length spec, the key. An unknown
    key is told before a missing one: it is usually the missing one misspelt (``constant,valu=5``)."""
    problems = sorted(error.errors(), key=lambda problem: problem["type"] != "extra_forbidden")
    loc = [str(part) for part in problems[0]["loc"]]
    at = next((index for index, part in enumerate(loc) if part in GENERATOR_FLAGS), None)
    if at is None:
        return pydantic_error_message(error, "trace generate options")
    flag, kind, message = GENERATOR_FLAGS[loc[at]], problems[0]["type"], problems[0]["msg"].removeprefix("Value error, ")
    if flag in LENGTH_FLAGS and len(loc) > at + 2:  # [field, dist, key]: the key of that distribution
        dist, key = loc[at + 1], ".".join(loc[at + 2:])
        if kind == "missing":
            return MmsimError(f"{flag} {dist} needs {key}=... (e.g. {_length_example(dist)})")
        if kind == "extra_forbidden":
            return MmsimError(f"{flag}: {dist} has no key {cut(key)!r} (e.g. {_length_example(dist)})")
        return MmsimError(f"{flag}: {key}: {message}")
    if kind == "missing":
        process = data.get("arrivals", {}).get("process")
        with_process = flag in ("--rate", "--cv", "--windows", "--servegen-file") and process
        return MmsimError(f"{flag} is needed" + (f" with --process {process}" if with_process else ""))
    return MmsimError(f"{flag}: {message}")


LENGTH_EXAMPLES = {"constant": "constant,value=512", "uniform": "uniform,low=100,high=2000",
                   "lognormal": "lognormal,mean=1000,cv=1", "empirical": "empirical,path=lengths.csv"}
"""A length flag written out for each distribution, for messages about a missing or unknown key."""


def _length_example(dist: str) -> str:
    return LENGTH_EXAMPLES.get(dist, ", ".join(LENGTH_EXAMPLES.values()))


def scalar(text: str, flag: str):
    """A flag's value read as a YAML scalar (``1e3`` a number, ``abc`` text)."""
    value = parse_yaml(text, flag)
    if isinstance(value, (dict, list)):
        raise MmsimError(f"expected a number or a name, got {cut(text)!r}", field=flag)
    return value


def parse_length(text: str, flag: str) -> dict:
    """``lognormal,mean=1000,cv=1`` as a length spec mapping (values read as YAML scalars)."""
    dist, _, rest = text.partition(",")
    spec = {"dist": dist.strip()}
    if rest.strip():
        spec.update({key: scalar(value, flag) for key, value in parse_pairs(rest, flag).items()})
    return spec


def parse_windows(text: str) -> list[list[float]]:
    """``START:RATE[:CV],...`` as rate-series windows."""
    return comma_list(text, "--windows", lambda item: [float(part) for part in item.split(":")], "window",
                      "START:RATE[:CV],...", unique=False)


def load_generator_file(path: Path) -> tuple[dict, int | None, set[str] | None, int]:
    """The generator mapping, the scenario seed (if any), the names its models serve (None unless a scenario) and the tokens each prefix
    id stands for (the workload's ``prefix_block_tokens``, as ``mmsim run`` generates with), from a scenario,
    workload or generator YAML."""
    data = load_yaml(path, "generator file")
    if not isinstance(data, dict):
        raise MmsimError("expected a mapping", source=str(path))
    seed = data.get("seed") if isinstance(data.get("seed"), int) and not isinstance(data.get("seed"), bool) else None
    served = _deployment_names(data["models"]) if isinstance(data.get("models"), list) else None
    field = "prefix_block_tokens"
    if isinstance(data.get("workload"), dict):
        data, field = data["workload"], "workload.prefix_block_tokens"
    if "trace" in data and "generator" not in data:
        raise MmsimError("this workload replays a trace; trace generate needs a generator (workload: generator: ...), "
                         "or give the generator as flags without --config", source=str(path),
                         field=field.replace("prefix_block_tokens", "trace"))
    block_tokens = data.get("prefix_block_tokens", PREFIX_BLOCK_TOKENS) if "generator" in data else PREFIX_BLOCK_TOKENS
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or \
            not 1 <= block_tokens <= MAX_PREFIX_BLOCK_TOKENS:
        raise MmsimError(f"expected whole tokens from 1 to {MAX_PREFIX_BLOCK_TOKENS:,}, "
                         f"got {cut(repr(block_tokens))}", source=str(path), field=field)
    where = field.removesuffix("prefix_block_tokens")  # "" or "workload."
    if "generator" in data:
        if not isinstance(data["generator"], dict):
            raise MmsimError("expected a generator mapping (arrivals, mix, prompt_tokens, ...)", source=str(path),
                             field=f"{where}generator")
        data, where = data["generator"], f"{where}generator."
    _check_generator_keys(data, str(path), where.rstrip(".") or None)
    return data, seed, served, block_tokens


def _check_generator_keys(data: dict, source: str, where: str | None) -> None:
    """Refuse a key that is no generator field: a file holding none of them (``foo: 1``) was told to give the
    model mix, naming neither the file nor the key."""
    unknown = [key for key in data if key not in GeneratorConfig.model_fields]
    if unknown:
        raise MmsimError(f"{cut(unknown[0])!r} is not a generator field (expected a scenario, its workload or a "
                         f"generator mapping: {', '.join(GeneratorConfig.model_fields)})", source=source, field=where)


def plain_model_name(name: str, flag: str) -> str:
    """A model name from a flag, refused when it holds a control character (a newline, a tab): the trace written
    would hold a label its own reader refuses. (A comma cannot be given: it separates the flag's entries.)"""
    if not name.isprintable():
        raise MmsimError(f"model name {cut(name)!r} holds a control character; model names are printable text "
                         "without commas", field=flag)
    return name


def _deployment_names(models: list) -> set[str]:
    """The names a scenario's ``models:`` entries serve requests under: each one's alias, else its name (a catalogue
    model, or the name a ``config:`` file's architecture goes by)."""
    names = set()
    for entry in models:
        name = entry.get("alias") or entry.get("name") if isinstance(entry, dict) else None
        if isinstance(name, str):
            names.add(name)
    return names
