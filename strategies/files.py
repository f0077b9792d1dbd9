"""Atomic file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from strategies.errors import LayerwiseError

Model = TypeVar("Model", bound=BaseModel)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path` in one rename."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                    suffix=target.suffix or ".tmp")
    os.close(handle)
    temporary = Path(name)
    try:
        yield temporary
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # mkstemp creates 0600
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def write_atomic(path: str | Path, text: str) -> Path:
    """Write `text` to `path` atomically (fsynced before the rename)."""
    with atomic_path(path) as temporary, open(temporary, "w", encoding="utf-8") as stream:
        stream.write(text)
        stream.flush()
        os.fsync(stream.fileno())
    return Path(path)


def read_json_model(model: type[Model], path: str | Path, what: str, fix: str,
                    error: type[LayerwiseError] = LayerwiseError) -> Model:
    """Load a pydantic contract from JSON; any problem is one line ending in how to `fix` it.

    Checks the file, the JSON, the contract's `schema_version` and then the fields.
    """
    source = Path(path)
    if not source.is_file():
        state = "is a directory" if source.is_dir() else "does not exist"
        raise error(f"{what} {source} {state}; {fix}")
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as problem:
        raise error(f"cannot read {what} {source}: {problem}; {fix}") from None
    except json.JSONDecodeError as problem:
        raise error(f"{what} {source} is not valid JSON (line {problem.lineno}, column "
                    f"{problem.colno}: {problem.msg}); {fix}") from None
    expected = model.model_fields["schema_version"].default
    version = data.get("schema_version", expected) if isinstance(data, dict) else None
    if version != expected:
        raise error(f"{what} {source} has schema_version {version!r}, this layerwise reads "
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
