"""An explicit transaction on an autocommit (isolation_level=None) SQLite connection."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def transaction(db: sqlite3.Connection, begin: str = "BEGIN") -> Iterator[None]:
    """`begin`: "BEGIN IMMEDIATE" takes the write lock at once, before anything is read."""
    db.execute(begin)
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
