"""The database seam: URLs, secrets kept out of messages, the reserved key name."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.settings import ServerSettings
from sessions.database import (
    DatabaseUnavailable, SqliteDatabase, open_database, redact, sqlite_url,
)
from tests.support.ports import free_port


def test_sqlite_urls(tmp_path) -> None:
    assert sqlite_url(None) == "sqlite://"
    url = sqlite_url(str(tmp_path))
    assert url == f"sqlite:///{tmp_path}/poolgate.sqlite3"
    for given, path in ((url, f"{tmp_path}/poolgate.sqlite3"), ("sqlite://", ":memory:"),
                        (f"sqlite:///{tmp_path}/x.db", f"{tmp_path}/x.db")):
        db = open_database(given)
        try:
            assert isinstance(db, SqliteDatabase) and db.path == path
        finally:
            db.close()
    with pytest.raises(ValueError, match="database_url"):
        open_database("mysql://x")


def test_a_password_never_reaches_a_log_line_or_an_error() -> None:
    url = f"postgresql://poolgate:hunter2-secret@127.0.0.1:{free_port()}/poolgate"
    assert redact(url) == url.replace("hunter2-secret", "***")
    with pytest.raises(DatabaseUnavailable) as refused:
        open_database(url)  # nothing listens there
    assert "hunter2" not in str(refused.value) and str(refused.value)
    settings = ServerSettings(database_url=url)
    assert "hunter2" not in repr(settings)
    with pytest.raises(ValidationError, match="database_url"):
        ServerSettings(database_url="mysql://x")


def test_anonymous_is_not_a_key_name() -> None:
    with pytest.raises(ValidationError, match="reserved"):
        ServerSettings(api_keys={"anonymous": "sk-x"})
    with pytest.raises(ValidationError, match="reserved"):
        ServerSettings(keys={"anonymous": {"secret": "sk-x"}})
