"""Safe reading of the user's input files and checks of output paths, shared by every command.

Inputs: only regular files are read (a FIFO would block, ``/dev/zero`` never
ends), YAML and JSON are read up to a size cap, decoded as strict UTF-8, parsed
with duplicate keys refused, and checked for nesting depth and lone surrogates
(which cannot be printed or written back). Outputs: a folder or file target is
checked before any work starts, so a run does not fail on a read-only or
misnamed ``--out`` after minutes of simulation.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

import yaml

from sim.errors import MmsimError

MAX_CONFIG_BYTES = 16 << 20
"""Largest YAML or JSON input read (scenarios, sweeps, profiles): far above any real one."""
MAX_DEPTH = 64
"""Deepest nesting of lists and mappings accepted in a YAML or JSON input (real files nest < 10)."""
MAX_VALUES = 1_000_000
"""Most values (scalars and containers) one YAML or JSON input may hold."""
DISK_ERRORS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
               errno.EROFS: "read-only file system", errno.EACCES: "permission denied", errno.EFBIG: "file too large"}


def check_regular_file(path: Path, what: str = "file") -> Path:
    """``path`` if it names an existing regular file, else a user error saying what it is instead."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise MmsimError(f"{what} not found", source=str(path)) from None
    except OSError as error:
        raise MmsimError(f"cannot read {what} ({error.strerror})", source=str(path)) from None
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


def _nearest_existing(path: Path) -> Path:
    """The nearest folder (or file) at or above ``path`` that exists, following links to what they name."""
    path = Path(os.path.abspath(path))
    while path != path.parent:
        if os.path.lexists(path):
            _check_link(path)  # a link that loops is there but leads nowhere: OSError, not a folder to make under
            if path.exists():
                break
            path = Path(os.path.realpath(path))  # a link to nothing yet: what gets made is what it names
        else:
            path = path.parent
    return path


def _probe_writable(folder: Path, source: str) -> None:
    """Create and remove a file in ``folder``: the only test that also holds for root and odd mounts."""
    try:
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".mmsim-probe-")
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise MmsimError(f"cannot write there ({error.strerror})", source=source) from None


def written_through(path: Path) -> Path:
    """Where writing ``path`` lands: the file a symbolic link names (replacing the link with a new file would
    leave the file it named stale), else ``path`` itself."""
    path = Path(path)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def check_output_dir(path: Path) -> Path:
    """A folder that can be created (or exists) and written to, checked before any work starts."""
    path = Path(path)
    try:
        return _check_output_dir(path)
    except OSError as error:  # a name too long, a symbolic link that loops: found before the run, not after it
        raise MmsimError(f"cannot write there ({error.strerror or error})", source=str(path)) from None


def _check_link(path: Path) -> None:
    """Raise OSError for a symbolic link that loops (ELOOP); one that names nothing yet is a target to create."""
    if path.is_symlink():
        try:
            os.stat(path)
        except FileNotFoundError:
            pass


def _check_output_dir(path: Path) -> Path:
    _check_link(path)
    if path.exists() and not path.is_dir():
        raise MmsimError("exists and is not a folder; give a folder for the results", source=str(path))
    _check_new_names(path)
    existing = _nearest_existing(path)
    if not existing.is_dir():
        raise MmsimError(f"cannot create a folder under {existing}: it is not a folder", source=str(path))
    _probe_writable(existing, str(path))
    return path


def check_output_file(path: Path) -> Path:
    """A file target that is not a folder or device, in a folder that exists (or can be created) and is writable."""
    path = Path(path)
    try:
        return _check_output_file(path)
    except OSError as error:
        raise MmsimError(f"cannot write there ({error.strerror or error})", source=str(path)) from None


def _check_output_file(path: Path) -> Path:
    _check_link(path)
    if path.is_dir():
        raise MmsimError("is a folder; give a file name", source=str(path))
    if path.exists() and not path.is_file():
        raise MmsimError("not a regular file (a device or FIFO); give a file name", source=str(path))
    parent = path.parent if str(path.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise MmsimError(f"the output folder {parent} is not a folder", source=str(path))
    _check_new_names(path)
    check_output_dir(parent)
    return path


NAME_MAX = 255
"""Longest name (path component) in bytes where the file system does not say: Linux's and most others' limit."""


def _check_new_names(path: Path) -> None:
    """Refuse a name that writing ``path`` would create (the folders and file below the nearest one that exists)
    longer than the file system takes. The system reports a long name only once the folder above it exists, so
    under a new folder it passed every check and failed after the run, leaving the new folder behind."""
    parts = Path(os.path.abspath(path)).parts
    existing = len(parts)
    while existing > 1 and not os.path.lexists(Path(*parts[:existing])):
        existing -= 1
    longest = _name_max(Path(*parts[:existing]))
    for name in parts[existing:]:
        size = len(os.fsencode(name))
        if size > longest:
            raise MmsimError(f"cannot write there (File name too long: the name {name[:24]!r}... is {size:,} "
                             f"bytes, the file system takes at most {longest:,})", source=str(path))


def _name_max(folder: Path) -> int:
    """The longest name in bytes the file system of ``folder`` takes (NAME_MAX where it cannot be asked)."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return NAME_MAX


PAGE_START = b"<!DOCTYPE html"
"""How every HTML page mmsim writes begins (comparison, sweep and reproduction reports)."""


def check_page_target(path: Path, *, inputs: Iterable[Path] = (), folders: Iterable[Path] = (),
                      force: bool | None = None) -> Path:
    """An HTML page to write, checked before any work: writable, none of the command's inputs, and not replacing
    a file mmsim did not write. ``force`` is None for a command without --force."""
    check_output_file(path)
    check_not_input(path, inputs, folders)
    check_replaceable(path, force)
    return path


def check_not_input(path: Path, inputs: Iterable[Path] = (), folders: Iterable[Path] = ()) -> None:
    """Refuse an output that is one of the command's input files or lies in one of its input folders: the page
    would replace what the command reads, and every later command on it would fail."""
    target = path.resolve()  # a symbolic link or a ../ spelling names the same file
    for source in inputs:
        if target == source.resolve() or (path.exists() and source.exists() and path.samefile(source)):
            raise MmsimError("the output is also an input of this command; give a new file for the page",
                             source=str(path))
    for folder in folders:
        if target.is_relative_to(folder.resolve()):
            raise MmsimError(f"the output lies inside the input folder {folder}, whose files the command reads; "
                             "give a file outside it", source=str(path))


def check_replaceable(path: Path, force: bool | None = None) -> None:
    """Refuse to replace an existing file that is not a page mmsim wrote (a scenario, a trace, a run's JSON):
    re-running a command onto its own earlier page still works."""
    if force or not path.is_file():
        return
    with path.open("rb") as handle:
        if handle.read(len(PAGE_START)) == PAGE_START:
            return
    remedy = "give another file, or --force to replace it" if force is False else "give another file or remove it"
    raise MmsimError(f"exists and is not an HTML page written by mmsim; {remedy}", source=str(path))


def disk_error(error: OSError, path: Path | str) -> MmsimError | None:
    """A one-line user error for a write that failed for want of space, quota or permission, else None."""
    reason = DISK_ERRORS.get(error.errno) if error.errno is not None else None
    if reason is None:
        return None
    return MmsimError(f"cannot write: {reason}", source=str(path))
