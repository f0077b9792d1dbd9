"""A project's first Prefect database comes from the machine's migrated copy: at the head of
Prefect's own migrations, copied only where Prefect would create a new SQLite file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL, temporary_settings

from layerwise.flows.cli.prefect_database import SQLITE, seed_project_database


def _revision(database: Path) -> str:
    with sqlite3.connect(database) as connection:
        [(revision,)] = connection.execute("select version_num from alembic_version").fetchall()
    return revision


def _prefect_head() -> str:
    """The last of Prefect's SQLite migrations (its env.py names their folder per dialect)."""
    from alembic.script import ScriptDirectory
    from prefect.server.database import provide_database_interface
    from prefect.server.database.alembic_commands import alembic_config

    config = alembic_config()
    config.set_main_option("version_locations",
                           str(provide_database_interface().orm.versions_dir))
    [head] = ScriptDirectory.from_config(config).get_heads()
    return head


def test_a_new_project_database_is_a_copy_at_prefects_head_and_an_old_one_is_kept(tmp_path):
    database = tmp_path / ".prefect" / "prefect.db"
    with temporary_settings({PREFECT_API_DATABASE_CONNECTION_URL: f"{SQLITE}{database}"}):
        assert seed_project_database() == database
        assert _revision(database) == _prefect_head()
        assert list(database.parent.iterdir()) == [database]  # nothing half-written beside it
        database.write_bytes(b"the project's own database")
        assert seed_project_database() is None
    assert database.read_bytes() == b"the project's own database"


@pytest.mark.parametrize("url", ["postgresql+asyncpg://prefect@db:5432/prefect",
                                 f"{SQLITE}:memory:"])
def test_a_database_that_is_not_a_sqlite_file_is_left_to_prefect(tmp_path, url):
    with temporary_settings({PREFECT_API_DATABASE_CONNECTION_URL: url}):
        assert seed_project_database() is None
    assert list(tmp_path.iterdir()) == []


def test_a_cache_that_cannot_be_written_leaves_the_migration_to_prefect(tmp_path, monkeypatch):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    database = tmp_path / "project" / "prefect.db"
    with temporary_settings({PREFECT_API_DATABASE_CONNECTION_URL: f"{SQLITE}{database}"}):
        assert seed_project_database() is None
    assert not database.parent.exists()


def test_a_database_another_start_made_meanwhile_is_not_replaced(tmp_path, monkeypatch):
    """Two first starts in one project: the one that finds the database made while it copied
    leaves that one in place (a rename would swap it under the other's server)."""
    import shutil

    database = tmp_path / ".prefect" / "prefect.db"
    copy = shutil.copyfile

    def copy_then_another_start(source, target):  # the other start wins the race
        copy(source, target)
        database.write_bytes(b"the other start's database")

    monkeypatch.setattr(shutil, "copyfile", copy_then_another_start)
    with temporary_settings({PREFECT_API_DATABASE_CONNECTION_URL: f"{SQLITE}{database}"}):
        assert seed_project_database() is None
    assert database.read_bytes() == b"the other start's database"
    assert list(database.parent.iterdir()) == [database]
