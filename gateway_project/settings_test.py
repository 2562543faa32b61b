"""Test settings: the base settings with fast password hashing. DATABASE_URL picks the engine
(Postgres in CI's first pass, SQLite otherwise)."""

from __future__ import annotations

from gateway_project.settings import *  # noqa: F401,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
