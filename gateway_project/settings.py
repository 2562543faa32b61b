"""Django settings, read from the environment (12-factor).

Embedded defaults: SQLite under ./data, an in-memory channel layer, jobs in-process. Set
DATABASE_URL (postgres://...), REDIS_URL and CELERY_BROKER_URL for a deployment.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from common.envconf import channel_layer_from_url, database_from_url, env_bool, env_list, env_secret, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("GW_DATA_DIR", str(BASE_DIR / "data")) or BASE_DIR / "data")


def _secret_key() -> str:
    configured = env_secret("DJANGO_SECRET_KEY")
    if configured:
        return configured
    # Embedded mode: one random key kept next to the SQLite file, so admin sessions survive restarts.
    key_file = DATA_DIR / "secret_key"
    try:
        return key_file.read_text().strip()
    except FileNotFoundError:
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        key = secrets.token_urlsafe(50)
        key_file.write_text(key)
        key_file.chmod(0o600)
        return key


SECRET_KEY = _secret_key()
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["*"])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "rest_framework",
    "inference",
    "administration",
    "responses_api",
    "standins",  # runmockworker: the stand-in worker of make run, tests and bench
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "gateway_project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

ASGI_APPLICATION = "gateway_project.asgi.application"
WSGI_APPLICATION = None

DATABASE_URL = env_str("DATABASE_URL") or f"sqlite:///{DATA_DIR / 'gateway.sqlite3'}"
DATABASES = {"default": database_from_url(DATABASE_URL, base_dir=BASE_DIR)}
EMBEDDED_DATABASE = DATABASES["default"]["ENGINE"].endswith("sqlite3")
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL")
CHANNEL_LAYERS = {"default": channel_layer_from_url(REDIS_URL)}

# Celery: with a broker, jobs go to `celery -A gateway_project worker`; without one they run
# in-process on a background thread (see gateway_project/celery.py).
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL")
CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND")
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"

REST_FRAMEWORK = {
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "UNAUTHENTICATED_USER": None,
    # Control-plane routes: a control-plane key or admin JWT, else the shared --api-key rules.
    "DEFAULT_AUTHENTICATION_CLASSES": ["administration.api.auth.ControlPlaneAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["administration.api.auth.IsControlPlaneAdmin"],
    "EXCEPTION_HANDLER": "administration.api.errors.exception_handler",
}

LOG_LEVEL = (env_str("GW_LOG_LEVEL", "info") or "info").upper()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s [%(process)d] %(levelname)s %(name)s %(message)s"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "inference": {"level": LOG_LEVEL, "handlers": ["console"], "propagate": False},
        "administration": {"level": LOG_LEVEL, "handlers": ["console"], "propagate": False},
        "django": {"level": "WARNING"},
    },
}
