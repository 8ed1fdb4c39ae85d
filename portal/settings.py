"""Settings, read from the environment.

Every value comes through a tiny helper that refuses a bad value loudly (ImproperlyConfigured
names the variable), so a typo in production stops the process at start, not half-way.
With nothing set the portal runs embedded: SQLite and Celery's filesystem transport under var/.
"""

from __future__ import annotations

import os
import secrets
from datetime import timedelta
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
# PRODUCTION=1 turns every transport-security default on (HTTPS redirect, HSTS, secure cookies,
# static files from collectstatic's manifest); each can still be set alone. docs/DEPLOYMENT.md.
PRODUCTION = envbool("PRODUCTION", False)
if PRODUCTION and DEBUG:
    raise ImproperlyConfigured("PRODUCTION=1 with DEBUG=1: a production portal never runs DEBUG")
if PRODUCTION and "SECRET_KEY" not in os.environ:
    raise ImproperlyConfigured("PRODUCTION=1 needs SECRET_KEY (50 random characters or more)")
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
    "axes",
    "portal.apps.PortalConfig",
]

MIDDLEWARE = [
    # First: the correlation id, the API's body bounds and its JSON errors (portal/middleware.py).
    "portal.middleware.RequestGuardMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last: locks out a username after AXES_FAILURE_LIMIT wrong passwords.
    "axes.middleware.AxesMiddleware",
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
# The README's demo logins (seed_demo) exist only in the embedded default: no DATABASE_URL, no
# PRODUCTION, and DEBUG not set to 0. Anywhere else `up` disables any left from a demo run.
DEMO_ACCOUNTS = (
    not _database_url
    and not PRODUCTION
    and os.environ.get("DEBUG", "").strip().lower() not in _FALSE - {""}
)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
# Login throttling (django-axes): AXES_FAILURE_LIMIT wrong passwords for one username lock that
# account for AXES_COOLOFF_MINUTES, and as many from one address lock that address; a right
# password is refused too until the lock expires (`manage.py axes_reset_username NAME` lifts it).
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_ENABLED = envbool("AXES_ENABLED", True)
AXES_FAILURE_LIMIT = envint("AXES_FAILURE_LIMIT", 20, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=envint("AXES_COOLOFF_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]  # either one reaching the limit locks
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False
# Behind a proxy the client's address is in X-Forwarded-For: how many proxies to look through
# (else every client has the proxy's address and 20 failures anywhere would lock everyone out).
AXES_IPWARE_PROXY_COUNT = (
    envint("AXES_PROXY_COUNT", 1 if envbool("TRUST_X_FORWARDED_PROTO", False) else 0, minimum=0)
    or None
)

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
# The SMTP backend's port, login and encryption (used only with EMAIL_HOST): by default port 25,
# no login and no encryption, a local relay. STARTTLS (EMAIL_USE_TLS, usually port 587) and
# implicit TLS (EMAIL_USE_SSL, usually port 465) exclude each other.
EMAIL_PORT = envint("EMAIL_PORT", 25, minimum=1)
if EMAIL_PORT > 65535:
    raise ImproperlyConfigured(f"EMAIL_PORT={EMAIL_PORT} is not a port (1 to 65535)")
EMAIL_HOST_USER = envstr("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = envstr("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = envbool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = envbool("EMAIL_USE_SSL", False)
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ImproperlyConfigured(
        "EMAIL_USE_TLS and EMAIL_USE_SSL are both set: choose one (STARTTLS or implicit TLS)"
    )
DEFAULT_FROM_EMAIL = envstr("DEFAULT_FROM_EMAIL", "factory@localhost")

LANGUAGE_CODE = "en-gb"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(envstr("STATIC_ROOT") or VAR_DIR / "static")
# WhiteNoise serves static files from the WSGI app (gunicorn needs no separate file server). In
# production from collectstatic's output, with hashed names cached for a year; elsewhere straight
# from the app and project folders, so no collectstatic step is needed to try the portal.
WHITENOISE_USE_FINDERS = not PRODUCTION
try:
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # (WhiteNoise warns of a missing one)
except OSError:
    pass
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "whitenoise.storage.CompressedManifestStaticFilesStorage"
            if PRODUCTION
            else "django.contrib.staticfiles.storage.StaticFilesStorage"
        )
    },
}
MEDIA_URL = "/media/"
MEDIA_ROOT = Path(envstr("MEDIA_ROOT") or VAR_DIR / "media")
# Customer uploads are declarative text (a manifest and optionally a kernel source).
DATA_UPLOAD_MAX_MEMORY_SIZE = envint("DATA_UPLOAD_MAX_MEMORY_SIZE", 5 * 1024 * 1024, minimum=1)
# Any request body (the largest is a results file of up to 64 MiB) is refused past this, by its
# declared length before it is read, and by the bytes received for a file part as they arrive;
# file parts go to anonymous temporary files that vanish with the process (upload_handlers.py).
UPLOAD_MAX_BYTES = envint("UPLOAD_MAX_BYTES", 65 * 1024 * 1024, minimum=1024)
FILE_UPLOAD_MAX_MEMORY_SIZE = 0  # (every file part goes through the handler below)
FILE_UPLOAD_HANDLERS = ["portal.upload_handlers.BoundedTemporaryFileUploadHandler"]
FILE_UPLOAD_TEMP_DIR = envstr("FILE_UPLOAD_TEMP_DIR") or None

# --- Transport security (on by default with PRODUCTION=1; each overridable) ---------------------
# Behind a proxy that terminates TLS, set TRUST_X_FORWARDED_PROTO=1 so Django sees https.
if envbool("TRUST_X_FORWARDED_PROTO", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", PRODUCTION)
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 31536000 if PRODUCTION else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", PRODUCTION)
SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", PRODUCTION)
SESSION_COOKIE_SECURE = envbool("SESSION_COOKIE_SECURE", PRODUCTION)
CSRF_COOKIE_SECURE = envbool("CSRF_COOKIE_SECURE", PRODUCTION)
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Scripts only from our own origin: plotly.js and htmx are served from static/. The charts that
# plotly renders into the page and the upload form carry inline scripts, hence 'unsafe-inline'
# for scripts and styles; no other origin may load code, frame the portal or receive a form.
CONTENT_SECURITY_POLICY = envstr(
    "CONTENT_SECURITY_POLICY",
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; object-src 'none'; "
    "base-uri 'self'; form-action 'self'; frame-ancestors 'none'",
)

# The API refuses a body larger than this, or JSON nested deeper, before any view parses it.
API_MAX_BODY_BYTES = envint("API_MAX_BODY_BYTES", DATA_UPLOAD_MAX_MEMORY_SIZE, minimum=1024)
API_MAX_JSON_DEPTH = envint("API_MAX_JSON_DEPTH", 16, minimum=2)

# Logs: the portal's own loggers and Django's request logger (every unhandled exception with its
# traceback and the request's correlation id) to the console and to LOG_FILE ("" for none).
LOG_LEVEL = envstr("LOG_LEVEL", "INFO")
LOG_FILE = envstr("LOG_FILE", str(VAR_DIR / "log" / "portal.log"))
_log_handlers = ["console"]
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"correlation_id": {"()": "portal.middleware.CorrelationIdFilter"}},
    "formatters": {
        "plain": {
            "format": "%(asctime)s %(levelname)s %(name)s [%(correlation_id)s] %(message)s",
        }
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "filters": ["correlation_id"],
            "formatter": "plain",
        }
    },
    "loggers": {
        "portal": {"handlers": _log_handlers, "level": LOG_LEVEL},
        "django.request": {"handlers": _log_handlers, "level": "WARNING", "propagate": False},
    },
}
if LOG_FILE:
    Path(LOG_FILE).parent.mkdir(parents=True, exist_ok=True)
    LOGGING["handlers"]["file"] = {
        "class": "logging.handlers.RotatingFileHandler",
        "filename": LOG_FILE,
        "maxBytes": 10 * 1024 * 1024,
        "backupCount": 5,
        "filters": ["correlation_id"],
        "formatter": "plain",
    }
    _log_handlers.append("file")

# --- Cache --------------------------------------------------------------------------------------
# Derived pages (charts, the candidate table, results.csv, evidence) are kept per job version. By
# default each process keeps its own copy; with several web workers set CACHE_URL to a Redis
# database so that one build serves them all (docs/DEPLOYMENT.md).
CACHE_URL = envstr("CACHE_URL")
if CACHE_URL and not CACHE_URL.startswith(("redis://", "rediss://")):
    raise ImproperlyConfigured(
        f"CACHE_URL={CACHE_URL!r}: use redis://host:port/db (or leave it unset)"
    )
if CACHE_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": CACHE_URL,
            "KEY_PREFIX": "ptxf",
        }
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
# Heartbeats of running stages (portal.pipeline.heartbeat): a stage stamps its job every
# HEARTBEAT_EVERY_S seconds; one silent for HEARTBEAT_SILENT_S (a GPU batch, whose beats come
# through the broker: HEARTBEAT_GPU_SILENT_S) is sent again, and after HEARTBEAT_REQUEUES such
# re-queues its job fails with the reason. A stage beats for at most its HEARTBEAT_MAX_*_S, so
# one that hangs falls silent too.
HEARTBEAT_EVERY_S = envint("HEARTBEAT_EVERY_S", 10, minimum=1)
HEARTBEAT_SILENT_S = envint("HEARTBEAT_SILENT_S", 45, minimum=3)
HEARTBEAT_GPU_SILENT_S = envint("HEARTBEAT_GPU_SILENT_S", 180, minimum=3)
HEARTBEAT_REQUEUES = envint("HEARTBEAT_REQUEUES", 2, minimum=0)
HEARTBEAT_MAX_AGENTS_S = envint("HEARTBEAT_MAX_AGENTS_S", 1800, minimum=10)
HEARTBEAT_MAX_BUILD_S = envint("HEARTBEAT_MAX_BUILD_S", 600, minimum=10)

# False on deployments whose GPU hosts reach no broker: batches then wait for a results file
# carried back and imported (`manage.py import_results`).
GPU_DISPATCH = envbool("GPU_DISPATCH", True)

# API tokens expire this many days after they are made (0: never); tokens made before expiry
# existed never expire.
API_TOKEN_DAYS = envint("API_TOKEN_DAYS", 90, minimum=0)

# Per organisation: at most this many jobs queued or searching at once (0: no limit).
ORG_MAX_ACTIVE_JOBS = envint("ORG_MAX_ACTIVE_JOBS", 10, minimum=0)
# ... and at most this many seconds of GPU time over the last 24 hours (0: no limit).
ORG_GPU_SECONDS_PER_DAY = envint("ORG_GPU_SECONDS_PER_DAY", 24 * 3600, minimum=0)

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
# A batch asks for those its family makes (factory.families: Family.baselines).
GPU_BASELINES = envlist(
    "GPU_BASELINES",
    [
        "customer",
        "torch_eager",
        "torch_compile",
        "torch_compile_max_autotune",
        "triton",
        "liger",
        "sdpa_flash",
        "sdpa_cudnn",
        "flex_attention",
    ],
)

ANTHROPIC_API_KEY = envstr("ANTHROPIC_API_KEY")
ANTHROPIC_MODEL = envstr("ANTHROPIC_MODEL", "claude-sonnet-4-5")
ANTHROPIC_MAX_TOKENS = envint("ANTHROPIC_MAX_TOKENS", 8192, minimum=256)
if FACTORY_BACKEND == "anthropic" and not ANTHROPIC_API_KEY:
    raise ImproperlyConfigured("FACTORY_BACKEND=anthropic needs ANTHROPIC_API_KEY")
