"""A project's first Prefect database, copied from one migrated once per machine.

Prefect's local API server migrates a new SQLite database on its first start in a project: the
same ~150 Alembic migrations every time, 8-10 s of the first `layerwise run` in a project on 2
idle cores and 20 s on a loaded one (its next starts find the head revision and skip them). A
migrated, empty database holds nothing but that revision, so the first start on a machine
migrates one into the user's cache (`$XDG_CACHE_HOME/layerwise/`, else `~/.cache/layerwise/`;
one file per Prefect version) and every project's first start copies it in. Prefect still
checks the revision at each start and migrates whatever a newer copy of itself adds.

Nothing is copied when the project already has its database (or another start makes it first:
the copy takes its name by a hard link, which never replaces a file), when Prefect's database is
not a SQLite file (PREFECT_API_DATABASE_CONNECTION_URL naming PostgreSQL), or when the cache or
the project cannot be written (Prefect then migrates as before).

    python -m layerwise.flows.cli.prefect_database FILE   # migrate a new database at FILE
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

from layerwise.strategies.jobs.tether import tethered
from layerwise.strategies.processes.owned_folder import owned_folder

SQLITE = "sqlite+aiosqlite:///"


def cache_folder() -> Path:
    """The user's cache folder of layerwise (XDG's base directory rule)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "layerwise"


def seed_project_database() -> Path | None:
    """Copy the machine's migrated database to where Prefect's local server will open its
    own, if that is a SQLite file not there yet; the copy's path, else None."""
    import prefect
    from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL

    url = str(PREFECT_API_DATABASE_CONNECTION_URL.value() or "")
    if not url.startswith(SQLITE) or ":memory:" in url:
        return None
    database = Path(url.removeprefix(SQLITE))
    if database.exists():
        return None
    try:
        template = migrated_template(cache_folder() / f"prefect-{prefect.__version__}.db")
        database.parent.mkdir(parents=True, exist_ok=True)
        handle, copy = tempfile.mkstemp(dir=database.parent, prefix=f".{database.name}.")
        os.close(handle)
        try:
            shutil.copyfile(template, copy)
            # a new name for the whole copy, never over a database that another start in this
            # project made meanwhile (a rename would swap it under its server)
            os.link(copy, database)
        finally:
            os.unlink(copy)
    except (OSError, subprocess.CalledProcessError):
        return None  # Prefect's server migrates a new database itself, as without a cache
    return database


def migrated_template(template: Path) -> Path:
    """`template`, migrated to this Prefect's head revision by a child process first if it is
    not there (written whole or not at all: a killed migration leaves nothing)."""
    if template.is_file():
        return template
    template.parent.mkdir(parents=True, exist_ok=True)
    with owned_folder("prefect-database-", parent=template.parent) as folder:
        migrated = folder / template.name
        subprocess.run(tethered([sys.executable, "-m", __name__, str(migrated)]), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       env={**os.environ,
                            "PREFECT_API_DATABASE_CONNECTION_URL": f"{SQLITE}{migrated}"})
        os.replace(migrated, template)
    return template


def main(argv: list[str]) -> None:
    """Migrate a new database at argv[0] (PREFECT_API_DATABASE_CONNECTION_URL names it)."""
    from prefect.server.database import provide_database_interface

    asyncio.run(provide_database_interface().create_db())
    # the engines are disposed with the event loop; the last connection to close folds
    # SQLite's write-ahead log into the file, so that the one file is the whole database
    sqlite3.connect(argv[0]).close()


if __name__ == "__main__":
    main(sys.argv[1:])
