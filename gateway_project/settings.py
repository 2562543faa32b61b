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
    "gateway_project.apps.DaphneCommands",  # daphne's runserver, its reactor not installed at setup (D118)
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "rest_framework",
    "drf_spectacular",  # the control plane's OpenAPI description (GET /openapi.json)
    "inference",
    "administration",
    "responses_api",
    "standins",  # runmockworker: the stand-in worker of make run, tests and bench
]

# Django's security, common, CSRF and frame-options middleware, their hooks called on the event loop
# under ASGI rather than a thread hop each (administration/inline_middleware.py, D109).
MIDDLEWARE = [
    "administration.inline_middleware.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "administration.inline_middleware.CommonMiddleware",
    "administration.inline_middleware.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "administration.inline_middleware.XFrameOptionsMiddleware",
    # The history store's client routes: the tenant rate limit and the store-outage answer, before the view.
    "responses_api.api.admission.ClientStoreAdmission",
    # A console list asked with a NUL in its query (Postgres text cannot hold one): the list, unfiltered.
    "administration.console_query.ConsoleQueryMiddleware",
    # Innermost, so the first to see a view's exception: a store outage is a 503, never a 500.
    "administration.store_outage.StoreOutageMiddleware",
]
# check --deploy looks for Django's own paths of these three; the inline classes above wrap them
# (tests/gateway_project/test_inline_middleware.py checks that each is there).
SILENCED_SYSTEM_CHECKS = ["security.W001", "security.W002", "security.W003"]

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
# in-process on a background thread (see administration/celery_app.py, the one app every process uses).
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL")
CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND")
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# Sending a job to a broker that is down fails within a few seconds (one retry, for a connection the
# broker dropped as it restarted); the job then runs in the gateway process (administration/jobs.py).
BROKER_TIMEOUT_SECS = 2.0
CELERY_BROKER_CONNECTION_TIMEOUT = BROKER_TIMEOUT_SECS
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 1, "interval_start": 0, "interval_step": 0.5, "interval_max": 0.5,
}
if (CELERY_BROKER_URL or "").startswith(("redis://", "rediss://")):  # Redis as the broker: its socket timeouts
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "socket_connect_timeout": BROKER_TIMEOUT_SECS, "socket_timeout": BROKER_TIMEOUT_SECS,
    }
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True  # a worker started before its broker waits for it

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
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
# GET /openapi.json (administration/api/openapi.py): the DRF views and the async views' declarations.
SPECTACULAR_SETTINGS = {
    "PREPROCESSING_HOOKS": ["administration.api.openapi.add_async_views"],
    "SERVE_INCLUDE_SCHEMA": False,
    "DESCRIPTION": "The gateway's control plane (spec 3): worker registry, cache flush, loads, profiling.",
    "DISABLE_ERRORS_AND_WARNINGS": False,
}

LOG_LEVEL = (env_str("GW_LOG_LEVEL", "info") or "info").upper()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s [%(process)d] %(levelname)s %(name)s %(message)s"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    # An exception escaping a Django view is logged once, by inference.escapes with the request id.
    "filters": {"one_escape_record": {"()": "gateway_project.escapes.OneEscapeRecord"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "inference": {"level": LOG_LEVEL, "handlers": ["console"], "propagate": False},
        "administration": {"level": LOG_LEVEL, "handlers": ["console"], "propagate": False},
        "standins": {"level": LOG_LEVEL, "handlers": ["console"], "propagate": False},
        "django": {"level": "WARNING"},
        "django.request": {"filters": ["one_escape_record"]},
        # The pool warns at each reconnection attempt while Postgres is down; the outage is logged
        # once each way instead (common/outages.py).
        "psycopg.pool": {"level": "ERROR"},
    },
}
