"""Atomic file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from layerwise.strategies.errors import FailedError, LayerwiseError, shown
from layerwise.strategies.files.documents import read_json

Model = TypeVar("Model", bound=BaseModel)


def writable_file(path: str | Path, option: str = "") -> Path:
    """`path` as a file layerwise can create or replace, checked before any work is done for
    it; else LayerwiseError (one line) naming `option` (e.g. "--out") and what is in the way.

    Writes are atomic renames, which replace whatever the path names: so a symbolic link, a
    device, a pipe or a socket there is refused rather than replaced by a regular file (as
    root, `--save /dev/null` would otherwise replace the system's /dev/null)."""
    target = Path(path)
    name = f"{option} {target}" if option else str(target)
    if target.is_symlink():  # an atomic write replaces the link, never writes through it
        raise LayerwiseError(f"cannot write {name}: it is a symbolic link; name the file "
                             "itself, or a new path")
    if target.is_dir():
        raise LayerwiseError(f"cannot write {name}: it is a directory; name a file (e.g. "
                             f"{target / 'out.json'})")
    if target.exists() and not target.is_file():
        raise LayerwiseError(f"cannot write {name}: it is not a regular file (a device, a "
                             "pipe or a socket); name a file")
    _check_ancestor(target.parent, name)
    return target


def creatable_folder(path: str | Path, option: str = "") -> Path:
    """`path` as a folder that exists or can be made, checked before any work is done for
    it; else LayerwiseError (one line) naming `option` and what is in the way."""
    target = Path(path)
    name = f"{option} {target}" if option else str(target)
    if target.exists() and not target.is_dir():
        raise LayerwiseError(f"cannot write in {name}: it is a file, not a folder")
    _check_ancestor(target, name)
    return target


def _check_ancestor(folder: Path, name: str) -> None:
    """The nearest existing folder of `folder` (itself included) must be a folder we may
    write in."""
    ancestor = folder
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise LayerwiseError(f"cannot write {name}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise LayerwiseError(f"cannot write {name}: no permission to write in {ancestor}")


def _cannot_write(target: Path, problem: OSError,
                  error: type[LayerwiseError] = FailedError) -> LayerwiseError:
    """A write that failed (a full disk: FailedError) or a path that cannot be created
    (bad input: LayerwiseError)."""
    return error(f"cannot write {target}: {problem.strerror or problem}")


@contextlib.contextmanager
def atomic_path(path: str | Path, make_folder: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path` in one rename.
    A path that cannot be written is a one-line LayerwiseError before anything is written.
    `make_folder=False` writes only into a folder that exists: a worker writing into its
    launcher's temporary folder must not make it again after the launcher removed it."""
    target = writable_file(path)
    try:
        if make_folder:
            target.parent.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                        suffix=target.suffix or ".tmp")
    except OSError as problem:
        raise _cannot_write(target, problem, LayerwiseError) from None
    os.close(handle)
    temporary = Path(name)
    try:
        yield temporary
        umask = os.umask(0)
        os.umask(umask)
        try:
            os.chmod(temporary, 0o666 & ~umask)  # mkstemp creates 0600
            os.replace(temporary, target)
        except OSError as problem:
            raise _cannot_write(target, problem) from None
    finally:
        temporary.unlink(missing_ok=True)


def write_atomic(path: str | Path, text: str, make_folder: bool = True) -> Path:
    """Write `text` to `path` atomically (fsynced before the rename); `make_folder` as in
    `atomic_path`."""
    with atomic_path(path, make_folder) as temporary:
        _write_text(temporary, text, Path(path))
    return Path(path)


def write_atomic_together(texts: Mapping[Path, str]) -> None:
    """Write every file or none: all texts go to temporaries first, so a full disk leaves none
    of them; then the renames, the first file named last (the one whose presence says the
    others are there)."""
    with contextlib.ExitStack() as renames:  # exits last-entered first
        temporaries = [(renames.enter_context(atomic_path(path)), text, path)
                       for path, text in texts.items()]
        for temporary, text, path in temporaries:
            _write_text(temporary, text, path)


def _write_text(temporary: Path, text: str, target: Path) -> None:
    try:
        with open(temporary, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
    except OSError as problem:
        raise _cannot_write(target, problem) from None


# free bytes below which a failed write is the disk's being full
FULL_DISK_BYTES = 1 << 20


def save_tensors(payload: object, temporary: Path, target: Path) -> None:
    """torch.save `payload` into `temporary` (an `atomic_path`'s) for `target`. torch says a
    write that failed on a full disk as "unexpected pos N vs M"; that becomes one line
    saying so."""
    import torch

    try:
        torch.save(payload, temporary)
    except RuntimeError as problem:
        free = shutil.disk_usage(temporary.parent).free
        lines = str(problem).strip().splitlines() or ["no message"]
        reason = "No space left on device" if free < FULL_DISK_BYTES else lines[-1]
        raise FailedError(f"cannot write {target}: {reason}") from None


def read_json_model(model: type[Model], path: str | Path, what: str, fix: str,
                    error: type[LayerwiseError] = LayerwiseError) -> Model:
    """Load a pydantic contract from JSON; any problem is one line ending in how to `fix` it.

    Checks the file, the JSON, the contract's `schema_version` and then the fields.
    """
    source = Path(path)
    if not source.is_file():
        state = "is a directory" if source.is_dir() else "does not exist"
        raise error(f"{what} {source} {state}; {fix}")
    data = read_json(source, f"{what} {source}", error, fix)
    expected = model.model_fields["schema_version"].default
    version = data.get("schema_version", expected) if isinstance(data, dict) else None
    if version != expected:
        raise error(f"{what} {source} has schema_version {shown(version)}, this layerwise reads "
                    f"{expected}; {fix}")
    try:
        return model.model_validate(data)
    except ValidationError as problem:
        raise error(f"{what} {source}: {first_error(problem)}; {fix}") from None


def first_error(problem: ValidationError) -> str:
    """`field.path: message` of a validation's first error: the one line a user reads."""
    first = problem.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "top level"
    return f"{where}: {str(first['msg']).removeprefix('Value error, ')}"
