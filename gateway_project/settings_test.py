"""Test settings: the base settings with fast password hashing. DATABASE_URL picks the engine
(Postgres in CI's first pass, SQLite otherwise)."""

from __future__ import annotations

from gateway_project.settings import *  # noqa: F401,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# SQLite: test against a file (WAL, busy timeout) like the embedded store, not the in-memory
# shared-cache database, whose table locks fail at once when job threads and requests overlap.
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):  # noqa: F405
    import os
    import tempfile

    DATABASES["default"]["TEST"] = {  # noqa: F405
        "NAME": os.path.join(tempfile.gettempdir(), f"gateway-test-{os.getpid()}.sqlite3")
    }
