"""Where MLflow tracks, checked before anything opens it (no MLflow import: a second saved)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from layerwise.strategies.errors import FailedError, LayerwiseError
from layerwise.strategies.text import printable

TRACKING_VARIABLE = "MLFLOW_TRACKING_URI"
# the stores MLflow opens by URI scheme (mlflow.tracking._tracking_service.utils)
_STORE_SCHEMES = ("sqlite", "file", "http", "https", "postgresql", "mysql", "mssql",
                  "databricks", "databricks-uc", "uc")
_SQLITE_HEADER = b"SQLite format 3\x00"


def check_tracking_uri(uri: str) -> None:
    """A tracking URI MLflow can open (a scheme it knows, or a plain local path), and a SQLite
    file there that is a database (an empty or missing one is made): else one line naming
    MLFLOW_TRACKING_URI, not MLflow's or SQLAlchemy's traceback later."""
    scheme = uri.partition(":")[0].partition("+")[0].lower()
    if ":" in uri and scheme not in _STORE_SCHEMES:  # a plain path is a local file store
        raise LayerwiseError(f"{TRACKING_VARIABLE}={printable(uri)} names no store MLflow can "
                             "open: use sqlite:///PATH, http(s)://HOST:PORT or a database URL")
    store = sqlite_path(uri)
    if store is None or not store.is_file() or store.stat().st_size == 0:
        return
    with open(store, "rb") as database:
        header = database.read(len(_SQLITE_HEADER))
    if header != _SQLITE_HEADER or not _schema_readable(store):
        raise FailedError(f"the MLflow store {store} ({TRACKING_VARIABLE}) is not a SQLite "
                          "database, or a damaged one: move it aside, and a new one is made, "
                          f"or point {TRACKING_VARIABLE} at another store")


def _schema_readable(store: Path) -> bool:
    """Whether SQLite reads the file's table list (a truncated file fails here)."""
    try:
        with contextlib.closing(sqlite3.connect(f"{store.as_uri()}?mode=ro", uri=True)) as db:
            db.execute("SELECT name FROM sqlite_master").fetchall()
    except sqlite3.DatabaseError:
        return False
    return True


def default_tracking_uri(project: Path) -> str:
    """The embedded store: a SQLite file in the project (absolute paths take four slashes)."""
    return f"sqlite:///{(project / 'mlflow.db').resolve()}"


def sqlite_path(uri: str) -> Path | None:
    """The file of a sqlite:/// store; None for any other."""
    prefix = "sqlite:///"
    return Path(uri[len(prefix):]) if uri.startswith(prefix) else None
