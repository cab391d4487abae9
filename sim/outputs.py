"""Checks of output paths, shared by every command: a folder or file target is checked before any work starts, so a
run does not fail on a read-only or misnamed ``--out`` after minutes of simulation, and a report never replaces
an input."""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from sim.errors import MmsimError

DISK_ERRORS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
               errno.EROFS: "read-only file system", errno.EACCES: "permission denied", errno.EFBIG: "file too large"}
PATH_ERRORS = {errno.ENAMETOOLONG: "a name in it is too long", errno.ELOOP: "its symbolic links loop"}
"""What makes a path given on the command line or in an input file unusable, whatever it was meant to name."""


def _nearest_existing(path: Path) -> Path:
    """The nearest folder (or file) at or above ``path`` that exists, following links to what they name."""
    path = Path(os.path.abspath(path))
    while path != path.parent:
        if os.path.lexists(path):
            _check_link(path)  # a link that loops is there but leads nowhere: OSError, not a folder to make under
            if path.exists():
                break
            path = Path(os.path.realpath(path))  # a file's link to nothing yet: what gets made is what it names
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


def cannot_write(error: OSError, path: Path | str) -> MmsimError:
    """The one-line error for an output path the system refuses (a name too long, a link that loops)."""
    return MmsimError(f"cannot write there ({error.strerror or error})", source=str(path))


def check_output_dir(path: Path) -> Path:
    """A folder that can be created (or exists) and written to, checked before any work starts."""
    path = Path(path)
    try:
        return _check_output_dir(path)
    except OSError as error:  # a name too long, a symbolic link that loops: found before the run, not after it
        raise cannot_write(error, path) from None


def _check_link(path: Path) -> None:
    """Raise OSError for a symbolic link that loops (ELOOP); one that names nothing yet is a target to create."""
    if path.is_symlink():
        try:
            os.stat(path)
        except FileNotFoundError:
            pass


def _check_broken_links(path: Path, *, itself: bool) -> None:
    """Refuse a symbolic link to nothing where a folder has to be (``path`` itself if ``itself``, and every folder
    above it): the folder it names would have to be made first, and every command's ``mkdir`` fails on the link
    (FileExistsError, after the run). A link to a missing folder is most often one to a disk not mounted or a
    folder since removed: making that folder afresh would write where the user did not mean to."""
    parts = Path(path).parts  # as given: the system follows a link before a ``..`` after it
    for end in range(1, len(parts) + (1 if itself else 0)):
        folder = Path(*parts[:end])
        if not os.path.lexists(folder):
            return  # nothing below a missing name exists
        if os.path.islink(folder):
            try:
                os.stat(folder)  # a link that loops (or leads through a file) raises its own OSError
            except FileNotFoundError:
                raise MmsimError(f"{folder} is a symbolic link to {os.readlink(folder)}, which does not exist; "
                                 "create the folder it names, or give a path without a broken link",
                                 source=str(path)) from None


def _check_output_dir(path: Path) -> Path:
    _check_link(path)
    _check_broken_links(path, itself=True)
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
        raise cannot_write(error, path) from None


def _check_output_file(path: Path) -> Path:
    _check_link(path)
    _check_broken_links(path, itself=False)  # the file itself may be a link to a file to create
    if path.is_dir():
        raise MmsimError("is a folder; give a file name", source=str(path))
    if path.exists() and not path.is_file():
        raise MmsimError("not a regular file (a device or FIFO); give a file name", source=str(path))
    parent = path.parent if str(path.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise MmsimError(f"the output folder {parent} is not a folder", source=str(path))
    _check_new_names(path)
    check_output_dir(parent)
    if path.is_symlink():  # what is written is the file the link names, in that file's folder
        check_output_dir(written_through(path).parent)
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


def path_error(error: OSError) -> MmsimError | None:
    """A one-line user error for a path the system cannot look up (a name too long, links that loop), else None."""
    reason = PATH_ERRORS.get(error.errno) if error.errno is not None else None
    if reason is None or error.filename is None:
        return None
    return MmsimError(f"cannot use this path: {reason}", source=str(error.filename))
