"""Run folders claimed before anything is written into them, and held while a run uses them.

Checking that a folder is empty and writing into it seconds later let two launches a moment
apart both pass the check and train over each other. So the check happens under a lock: a
launch first takes an exclusive flock on the folder's lock file (`run.lock`), which one process
holds at a time, and only then looks whether the folder is empty; it keeps the flock for the
run's life, so a second launch into the folder, new or `--resume`, is refused with one line
while the first lives. The kernel drops a flock when its holder exits, even on SIGKILL, so a
killed run's folder can be resumed at once. Auto-named folders are made with mkdir, which
fails for everyone but their creator. The lock file stays after the run (removing it would let
two later launches lock two different files of one name); a claim given up before anything was
written removes it and the folder it made, so bad input leaves nothing behind.

The nodes of a several-machine run share one folder: node 0 claims it as a single machine
does, node I > 0 holds its own lock file (`run.node{I}.lock`, and writes its own log), and the
run's files are node 0's.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import os
import re
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from layerwise.strategies.errors import LayerwiseError
from layerwise.strategies.files.locations import LOCK_FILE

_OTHER_NODES_FILE = re.compile(r"[^.]+\.node\d+\.\w+")  # node_file_name's, for nodes > 0


def node_file_name(name: str, node_rank: int) -> str:
    """The file `name` of node `node_rank` in a shared run folder: NAME.nodeI.EXT for I > 0."""
    stem, dot, suffix = name.partition(".")
    return name if node_rank == 0 else f"{stem}.node{node_rank}{dot}{suffix}"


def lock_file_name(node_rank: int) -> str:
    """The lock file node `node_rank` holds in a (shared) run folder."""
    return node_file_name(LOCK_FILE, node_rank)


class FolderClaim:
    """A run folder this process holds (an open descriptor with an exclusive flock on its lock
    file) until `release()`; as a context manager, released on leaving."""

    def __init__(self, path: Path, lock: Path, descriptor: int, created: bool) -> None:
        self.path = path
        self._lock = lock
        self._descriptor: int | None = descriptor
        self._created = created

    def __enter__(self) -> FolderClaim:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.release()

    @contextlib.contextmanager
    def released_on_error(self) -> Iterator[FolderClaim]:
        """Release the claim if the block raises (a run refused after its folder was claimed);
        keep it held otherwise."""
        try:
            yield self
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Let the folder go. One that holds nothing but this claim's lock file was claimed
        for a run that never started: the lock goes, and the folder if this claim made it."""
        if self._descriptor is None:
            return
        try:
            if [entry.name for entry in self.path.iterdir()] == [self._lock.name]:
                self._lock.unlink()
                if self._created:
                    self.path.rmdir()
        except OSError:
            pass  # another process wrote into it meanwhile: the folder is theirs to keep
        finally:
            os.close(self._descriptor)
            self._descriptor = None


def claim_new_folder(out: Path, node_rank: int = 0) -> FolderClaim:
    """`out` for a new run: created if missing; refused (one line) if it holds files or a live
    launch holds it. Node I > 0 of a shared folder takes only its own lock: node 0 writes the
    run's files, before or after this node starts."""
    created = _make_folder(out)
    lock = out / lock_file_name(node_rank)
    claim = FolderClaim(out, lock, _hold(lock, f"--out {out}", "choose a new folder"), created)
    if node_rank == 0 and any(entry.name != LOCK_FILE
                              and not _OTHER_NODES_FILE.fullmatch(entry.name)
                              for entry in _entries(out)):
        claim.release()
        raise LayerwiseError(f"--out {out} already holds files; continue that run with "
                             f"--resume {out} or choose a new folder")
    return claim


def claim_stamped_folder(parent: Path, name: str) -> FolderClaim:
    """A new folder `parent/NAME-TIMESTAMP` (`make_stamped_folder`), locked for the run."""
    folder = make_stamped_folder(parent, name)
    lock = folder / LOCK_FILE
    return FolderClaim(folder, lock, _hold(lock, str(folder), "launch again"), created=True)


def make_stamped_folder(parent: Path, name: str, stamp: str | None = None) -> Path:
    """A new folder `parent/NAME-STAMP` (STAMP: now, to the second), with `-2`, `-3`, ... when
    that exists: mkdir decides, so launches in the same second get different folders."""
    _make_folder(parent)
    stamp = stamp or datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{name}-{stamp}")
    suffix = 1
    while True:
        folder = parent / (base if suffix == 1 else f"{base}-{suffix}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            suffix += 1
        except OSError as error:
            raise LayerwiseError(f"cannot create a run folder in {parent} "
                                 f"({error.strerror})") from None


def claim_existing_run(folder: Path, node_rank: int = 0) -> FolderClaim:
    """The folder of a run to continue; refused (one line) while a live launch holds it."""
    lock = folder / lock_file_name(node_rank)
    return FolderClaim(folder, lock, _hold(lock, f"--resume {folder}",
                                           "wait for it to end or stop it"), created=False)


def _make_folder(folder: Path) -> bool:
    """Create `folder` (and its parents) if missing; whether this call created it."""
    try:
        folder.mkdir(parents=True)
    except FileExistsError:
        if folder.is_dir():
            return False  # made before, or by another launch a moment ago: the lock decides
        raise LayerwiseError(f"{folder} is a file, not a folder; choose a new folder") from None
    except OSError as error:
        raise LayerwiseError(f"cannot create the folder {folder} ({error.strerror})") from None
    return True


def _entries(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError as error:
        raise LayerwiseError(f"cannot read the folder {folder} ({error.strerror})") from None


def _hold(lock: Path, subject: str, fix: str) -> int:
    """A descriptor of `lock` (created if missing) holding its exclusive flock, with this
    process's id written in; while another process holds it, LayerwiseError: `subject` is in
    use by a live run (pid N); `fix`.

    A lock file removed between opening and locking it (a claim given up) is not the one at
    the path any more: locking it would let a second launch lock the new one, so it is
    opened again.
    """
    while True:
        try:
            # never through a link: a planted run.lock symlink must not redirect the pid write
            descriptor = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise LayerwiseError(f"the lock file {lock} is a symbolic link; remove it "
                                     "(layerwise writes its own)") from None
            raise LayerwiseError(f"cannot write the lock file {lock} "
                                 f"({error.strerror})") from None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(descriptor)
            if error.errno in (errno.EAGAIN, errno.EACCES):
                raise LayerwiseError(f"{subject} is in use by a live run{_holder(lock)}; "
                                     f"{fix}") from None
            raise LayerwiseError(f"cannot lock {lock} ({error.strerror})") from None
        if _same_file(descriptor, lock):
            break
        os.close(descriptor)
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
    return descriptor


def _same_file(descriptor: int, path: Path) -> bool:
    try:
        there = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(descriptor)
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


def _holder(lock: Path) -> str:
    """' (pid N)' from the lock file, once its holder has written it."""
    with contextlib.suppress(OSError, ValueError):
        return f" (pid {int(lock.read_text(encoding='ascii'))})"
    return ""
