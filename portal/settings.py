"""Settings, read from the environment.

Every value comes through a tiny helper that refuses a bad value loudly (ImproperlyConfigured
names the variable), so a typo in production stops the process at start, not half-way.
With nothing set the portal runs embedded: SQLite and Celery's filesystem transport under var/.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("PTXF_VAR_DIR") or BASE_DIR / "var")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def envstr(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def envbool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    if raw.strip().lower() in _TRUE:
        return True
    if raw.strip().lower() in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no)")


def envint(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} must be at least {minimum}")
    return value


def envlist(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def database_from_url(url: str) -> dict:
    """postgres://user:pass@host:port/name?sslmode=require -> a Django DATABASES entry.
    sqlite:///absolute/path is accepted too. Anything else is refused."""
    parts = urlsplit(url)
    if parts.scheme in ("postgres", "postgresql", "pgsql"):
        name = unquote(parts.path.lstrip("/"))
        if not name:
            raise ImproperlyConfigured(f"DATABASE_URL={url!r} names no database")
        try:
            port = parts.port
        except ValueError:
            raise ImproperlyConfigured(f"DATABASE_URL={url!r} has a bad port") from None
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(port or ""),
            "OPTIONS": dict(parse_qsl(parts.query)),
            # Short-lived connections per request; workers reconnect after a broken connection.
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
        }
    if parts.scheme == "sqlite":
        if not parts.path or parts.path == "/":
            raise ImproperlyConfigured(f"DATABASE_URL={url!r} names no file")
        return sqlite_database(Path(parts.path))
    raise ImproperlyConfigured(
        f"DATABASE_URL={url!r}: the scheme must be postgres:// (or sqlite:///path)"
    )


def sqlite_database(path: Path) -> dict:
    # WAL lets the web server read while a worker writes; IMMEDIATE takes the write lock at BEGIN
    # so two workers queue on the timeout instead of failing with "database is locked" mid-way.
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(path),
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }


def _secret_key() -> str:
    key = os.environ.get("SECRET_KEY")
    if key is not None:
        if len(key) < 32:
            raise ImproperlyConfigured("SECRET_KEY must be at least 32 characters")
        return key
    # Embedded mode: one random key per installation, kept under var/ so sessions survive restarts.
    path = VAR_DIR / "secret_key"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        key = secrets.token_urlsafe(50)
        path.write_text(key)
        path.chmod(0o600)
        return key


SECRET_KEY = _secret_key()
DEBUG = envbool("DEBUG", False)
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])
SITE_URL = envstr("SITE_URL", "http://127.0.0.1:8000")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "portal.apps.PortalConfig",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "portal.urls"
WSGI_APPLICATION = "portal.wsgi.application"

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

_database_url = os.environ.get("DATABASE_URL", "")
if _database_url:
    DATABASES = {"default": database_from_url(_database_url)}
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {"default": sqlite_database(VAR_DIR / "db.sqlite3")}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"

# Mail (review decisions to customers): printed to the console unless an SMTP host is configured.
EMAIL_HOST = envstr("EMAIL_HOST")
EMAIL_BACKEND = (
    "django.core.mail.backends.smtp.EmailBackend"
    if EMAIL_HOST
    else "django.core.mail.backends.console.EmailBackend"
)
DEFAULT_FROM_EMAIL = envstr("DEFAULT_FROM_EMAIL", "factory@localhost")

LANGUAGE_CODE = "en-gb"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"
MEDIA_URL = "/media/"
MEDIA_ROOT = Path(envstr("MEDIA_ROOT") or VAR_DIR / "media")
# Customer uploads are declarative text (a manifest and optionally a kernel source).
DATA_UPLOAD_MAX_MEMORY_SIZE = envint("DATA_UPLOAD_MAX_MEMORY_SIZE", 5 * 1024 * 1024, minimum=1)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"portal": {"handlers": ["console"], "level": envstr("LOG_LEVEL", "INFO")}},
}

# --- Celery -------------------------------------------------------------------------------------
# The longest task is a GPU batch: its hard limit plus slack. The broker's visibility timeout must
# be longer, or Redis would hand a task that is still running to a second worker.
GPU_BATCH_TIME_LIMIT_S = envint("GPU_BATCH_TIME_LIMIT_S", 1800, minimum=10)
CELERY_BROKER_URL = envstr("CELERY_BROKER_URL")
BROKER_DIR = VAR_DIR / "broker"
if CELERY_BROKER_URL and not CELERY_BROKER_URL.startswith(("redis://", "rediss://", "memory://")):
    raise ImproperlyConfigured(
        f"CELERY_BROKER_URL={CELERY_BROKER_URL!r}: use redis://host:port/db (or leave it unset)"
    )
CELERY_EMBEDDED = not CELERY_BROKER_URL
CELERY_TASK_ALWAYS_EAGER = envbool("CELERY_TASK_ALWAYS_EAGER", False)
# How long a job may sit in one stage before `requeue_stuck` sends its task again (embedded mode
# loses a message whose worker died: the filesystem transport is at-most-once).
STUCK_AFTER_S = envint("STUCK_AFTER_S", 600, minimum=5)

# False on deployments whose GPU hosts reach no broker: batches then wait for a results file
# carried back and imported (`manage.py import_results`).
GPU_DISPATCH = envbool("GPU_DISPATCH", True)

# --- The factory --------------------------------------------------------------------------------
FACTORY_POPULATION = envint("FACTORY_POPULATION", 8, minimum=1)
FACTORY_GENERATIONS = envint("FACTORY_GENERATIONS", 4, minimum=1)
FACTORY_BACKEND = envstr("FACTORY_BACKEND", "offline")
if FACTORY_BACKEND not in ("offline", "anthropic"):
    raise ImproperlyConfigured(f"FACTORY_BACKEND={FACTORY_BACKEND!r}: use offline or anthropic")
FACTORY_DEFAULT_GPU = envstr("FACTORY_DEFAULT_GPU", "sm_90")
# The stages the pipeline calls, as dotted paths, so a deployment (or a test) can swap one.
FACTORY_PROPOSE = envstr("FACTORY_PROPOSE", "factory.loop.propose")
FACTORY_SHOULD_STOP = envstr("FACTORY_SHOULD_STOP", "factory.loop.should_stop")
FACTORY_REVIEW = envstr("FACTORY_REVIEW", "factory.agents.review")
# nvJitLink reports kept on disk by the hash of what was compiled (factory.compile): the agents,
# the build stage and later jobs read them back instead of compiling the same PTX again. Each
# host keeps its own; "off" turns it off.
COMPILE_CACHE_DIR = envstr("COMPILE_CACHE_DIR", str(VAR_DIR / "compile-cache"))
if COMPILE_CACHE_DIR.strip().lower() in ("", "off", "0", "false", "no"):
    COMPILE_CACHE_DIR = None
GPU_BASELINES = envlist(
    "GPU_BASELINES",
    ["customer", "torch_eager", "torch_compile", "torch_compile_max_autotune", "triton", "liger"],
)

ANTHROPIC_API_KEY = envstr("ANTHROPIC_API_KEY")
ANTHROPIC_MODEL = envstr("ANTHROPIC_MODEL", "claude-sonnet-4-5")
ANTHROPIC_MAX_TOKENS = envint("ANTHROPIC_MAX_TOKENS", 8192, minimum=256)
if FACTORY_BACKEND == "anthropic" and not ANTHROPIC_API_KEY:
    raise ImproperlyConfigured("FACTORY_BACKEND=anthropic needs ANTHROPIC_API_KEY")
