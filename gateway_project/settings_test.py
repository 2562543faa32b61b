"""Test settings: the base settings with fast password hashing. DATABASE_URL picks the engine
(Postgres in CI's first pass, SQLite otherwise). Each test run has a test database of its own (named
for its process), so runs on one machine at once never create or drop each other's."""

from __future__ import annotations

import os
import tempfile

from gateway_project.settings import *  # noqa: F401,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# SQLite: test against a file (WAL, busy timeout) like the embedded store, not the in-memory
# shared-cache database, whose table locks fail at once when job threads and requests overlap.
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):  # noqa: F405
    DATABASES["default"]["TEST"] = {  # noqa: F405
        "NAME": os.path.join(tempfile.gettempdir(), f"gateway-test-{os.getpid()}.sqlite3")
    }
else:
    DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_{os.getpid()}"}  # noqa: F405
