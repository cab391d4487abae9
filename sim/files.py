"""Safe reading of the user's input files, shared by every command (output paths: :mod:`sim.outputs`).

Only regular files are read (a FIFO would block, ``/dev/zero`` never ends),
YAML and JSON are read up to a size cap, decoded as strict UTF-8, parsed with
duplicate keys refused and plain scalars resolved by the YAML 1.2 core schema,
and checked for nesting depth and lone surrogates (which cannot be printed or
written back).
"""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import yaml

from sim.errors import MmsimError

MAX_CONFIG_BYTES = 16 << 20
"""Largest YAML or JSON input read (scenarios, sweeps, profiles): far above any real one."""
MAX_DEPTH = 64
"""Deepest nesting of lists and mappings accepted in a YAML or JSON input (real files nest < 10)."""
MAX_VALUES = 1_000_000
"""Most values (scalars and containers) one YAML or JSON input may hold."""


def check_regular_file(path: Path, what: str = "file") -> Path:
    """``path`` if it names an existing regular file, else a user error saying what it is instead."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise MmsimError(f"{what} not found", source=str(path)) from None
    except OSError as error:
        raise MmsimError(f"cannot read {what} ({error.strerror})", source=str(path)) from None
    except ValueError:  # a NUL byte, which no file name can hold (a YAML "\0" escape makes one)
        raise MmsimError(f"cannot read {what} (a file name cannot hold a NUL byte)", source=str(path)) from None
    article = "an" if what[:1] in "aeiou" else "a"
    if stat.S_ISDIR(mode):
        raise MmsimError(f"is a folder, not {article} {what}", source=str(path))
    if not stat.S_ISREG(mode):
        raise MmsimError(f"not a regular file (a device, FIFO or socket); expected {article} {what}", source=str(path))
    return path


def read_text(path: Path, what: str = "file", max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """The whole text of a small regular file, strict UTF-8 (a byte-order mark is dropped)."""
    path = check_regular_file(path, what)
    try:
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as error:
        raise MmsimError(f"cannot read {what} ({error.strerror})", source=str(path)) from None
    if len(data) > max_bytes:
        raise MmsimError(f"larger than {max_bytes >> 20} MiB, too large for a {what}", source=str(path))
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise MmsimError(f"not UTF-8 text (byte 0x{data[error.start]:02x} at line {line}); save the file as UTF-8",
                         source=str(path)) from None


class _UniqueKeys:
    """A mixin for PyYAML's safe loaders, refusing a mapping that names a key twice (YAML says keys are unique)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *base`` may be overridden: not a duplicate
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: PyYAML's own check reports it
                continue
            if duplicate:
                raise MmsimError(f"key {cut(key)!r} given twice (line {key_node.start_mark.line + 1}); keep one")
        return super().construct_mapping(node, deep)  # type: ignore[misc]


CORE_SCHEMA = {
    "tag:yaml.org,2002:null": r"null|Null|NULL|~|",
    "tag:yaml.org,2002:bool": r"true|True|TRUE|false|False|FALSE",
    "tag:yaml.org,2002:int": r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+",
    "tag:yaml.org,2002:float": r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)",
    "tag:yaml.org,2002:merge": r"<<",
}
"""The plain scalars each tag takes, by the YAML 1.2 core schema (checked in this order: ``5`` is an int, not a
float), plus the merge key ``<<: *base``. PyYAML's own resolvers are YAML 1.1, where ``10:30`` is the number 630,
``yes``/``on``/``off`` booleans, ``1_000`` a thousand and ``1e-6`` text: a typo became a value with no error. Here
everything else is text, which a number or boolean field then refuses, naming it."""
CORE_PATTERNS = {tag: re.compile(rf"(?:{pattern})\Z") for tag, pattern in CORE_SCHEMA.items()}
CORE_FIRST_CHARACTERS = {"tag:yaml.org,2002:null": [*"nN~", ""], "tag:yaml.org,2002:bool": [*"tTfF"],
                         "tag:yaml.org,2002:int": [*"-+0123456789"], "tag:yaml.org,2002:float": [*"-+.0123456789"],
                         "tag:yaml.org,2002:merge": ["<"]}
"""The characters a scalar of each tag can begin with: PyYAML tries only the resolvers listed for a scalar's first
character (an empty scalar's key is ``""``)."""


def _core_resolvers() -> dict[str, list[tuple[str, re.Pattern]]]:
    """PyYAML's table of implicit resolvers (first character: [(tag, pattern), ...]) for CORE_SCHEMA."""
    table: dict[str, list[tuple[str, re.Pattern]]] = {}
    for tag, first in CORE_FIRST_CHARACTERS.items():
        for character in first:
            table.setdefault(character, []).append((tag, CORE_PATTERNS[tag]))
    return table


def _core_scalar(loader, node, tag: str, what: str) -> str:
    """A scalar's text if the core schema reads it as ``tag``; else (an explicit ``!!int yes``) a YAML error."""
    text = loader.construct_scalar(node)
    if not CORE_PATTERNS[tag].match(text):
        raise yaml.constructor.ConstructorError(None, None, f"{cut(text)!r} is not {what}", node.start_mark)
    return text


def _construct_int(loader, node) -> int:
    """A YAML 1.2 integer: decimal (``010`` is ten), ``0o`` octal or ``0x`` hexadecimal."""
    text = _core_scalar(loader, node, "tag:yaml.org,2002:int", "a whole number")
    base = {"0o": 8, "0x": 16}.get(text[:2], 10)
    try:
        return int(text[2:] if base != 10 else text, base)
    except ValueError:  # over Python's 4,300 digits
        raise yaml.constructor.ConstructorError(None, None, f"a whole number of {len(text):,} digits is too long",
                                                node.start_mark) from None


def _construct_float(loader, node) -> float:
    """A YAML 1.2 float: ``1.5``, ``1e-6``, ``.inf``, ``-.inf`` or ``.nan`` (range checks come later)."""
    text = _core_scalar(loader, node, "tag:yaml.org,2002:float", "a number").lower()
    special = {".inf": "inf", "+.inf": "inf", "-.inf": "-inf", ".nan": "nan"}
    return float(special.get(text, text))


def _construct_bool(loader, node) -> bool:
    """A YAML 1.2 boolean: true or false (any of the three spellings of each)."""
    return _core_scalar(loader, node, "tag:yaml.org,2002:bool", "true or false").lower() == "true"


class _CoreSchema:
    """A mixin for PyYAML's safe loaders: plain scalars resolved and numbers built by the YAML 1.2 core schema
    (CORE_SCHEMA), replacing PyYAML's YAML 1.1 resolvers (none of them kept)."""

    yaml_implicit_resolvers = _core_resolvers()


class _UniqueKeyLoader(_UniqueKeys, _CoreSchema, yaml.SafeLoader):
    """PyYAML's own (Python) safe loader: nesting too deep for it ends in a RecursionError."""


class _FastUniqueKeyLoader(_UniqueKeys, _CoreSchema, getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The safe loader on libyaml where PyYAML was built with it: ~8x faster (a few ms of every run), but its
    composer recurses in C, so nesting in the tens of thousands overflows the stack instead of raising."""


for _loader in (_UniqueKeyLoader, _FastUniqueKeyLoader):
    _loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
    _loader.add_constructor("tag:yaml.org,2002:float", _construct_float)
    _loader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)

LIBYAML_MAX_MARKS = 2_000
"""Texts with at most this many of the characters that can open a nesting level (``[{-:?``) go to libyaml: they
cannot nest deeper than that, far within its stack. Longer ones take the Python loader, as deep as MAX_DEPTH."""


def _loader_for(text: str) -> type:
    marks = sum(text.count(mark) for mark in "[{-:?")
    return _FastUniqueKeyLoader if marks <= LIBYAML_MAX_MARKS else _UniqueKeyLoader


def parse_yaml(text: str, source: str) -> object:
    """Parse YAML text with the checks of this module; errors name ``source`` and the line."""
    try:
        data = yaml.load(text, Loader=_loader_for(text))  # noqa: S506 - a SafeLoader subclass
    except MmsimError as error:
        raise MmsimError(str(error), source=source) from None
    except RecursionError:
        raise MmsimError(f"nested too deeply (more than {MAX_DEPTH} levels)", source=source) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise MmsimError(f"not valid YAML{where}: {problem}", source=source) from None
    check_tree(data, source)
    return data


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        twice = next(key for key in keys if keys.count(key) > 1)
        raise ValueError(f"key {cut(twice)!r} given twice")
    return dict(pairs)


def parse_json(text: str | bytes, source: str) -> object:
    """Parse JSON text with duplicate keys refused, then the depth and text checks."""
    try:
        data = json.loads(text, object_pairs_hook=_unique_pairs)
    except json.JSONDecodeError as error:
        raise MmsimError(f"not valid JSON (line {error.lineno}, column {error.colno}: {error.msg})",
                         source=source) from None
    except RecursionError:
        raise MmsimError(f"nested too deeply (more than {MAX_DEPTH} levels)", source=source) from None
    except (ValueError, UnicodeDecodeError) as error:
        raise MmsimError(f"not valid JSON ({cut(str(error))})", source=source) from None
    check_tree(data, source)
    return data


def load_yaml(path: Path, what: str = "YAML file") -> object:
    """A YAML file read and parsed safely (see the module docstring)."""
    return parse_yaml(read_text(path, what), str(path))


def load_json(path: Path, what: str = "JSON file") -> object:
    """A JSON file read and parsed safely (see the module docstring)."""
    return parse_json(read_text(path, what), str(path))


def check_tree(data: object, source: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH, more than MAX_VALUES values (YAML aliases expanding like the
    "billion laughs") and strings with lone surrogates; iterative, so a deep file cannot exhaust the stack."""
    pending = [(data, 0)]
    visited = 0
    while pending:
        node, depth = pending.pop()
        visited += 1
        if visited > MAX_VALUES:
            raise MmsimError(f"more than {MAX_VALUES} values (counting what YAML aliases repeat)", source=source)
        if isinstance(node, str):
            if not node.isascii():
                try:
                    node.encode("utf-8")
                except UnicodeEncodeError:
                    raise MmsimError(f"text {cut(node.encode('utf-8', 'backslashreplace').decode())!r} holds a lone "
                                     "surrogate (an invalid \\ud800-\\udfff escape)", source=source) from None
            continue
        if isinstance(node, (dict, list)):
            if depth >= MAX_DEPTH:
                raise MmsimError(f"nested too deeply (more than {MAX_DEPTH} levels)", source=source)
            items = [*node.keys(), *node.values()] if isinstance(node, dict) else node
            pending.extend((item, depth + 1) for item in items)


def cut(text: object, limit: int = 80) -> str:
    """``text`` shortened to ``limit`` characters for messages (a 2 MB field must not be echoed whole)."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def counted(count: int, noun: str) -> str:
    """``count`` (thousands grouped, as the messages write numbers) and ``noun``, plural unless the count is one
    ("1 request", "1,350 requests")."""
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"


def safe_name(text: str, fallback: str) -> str:
    """``text`` as one path component: letters, digits and ``.+-_`` only, never ``.``/``..`` or empty.

    Names from data files (a scenario's or sweep's ``name``) end up in paths; ``../../x`` must not escape.
    """
    name = re.sub(r"[^A-Za-z0-9.+_-]+", "_", text).strip("._")[:120]
    return name or fallback
