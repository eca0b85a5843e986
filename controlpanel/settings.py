"""Settings for the control panel: one file, everything from the environment.

Two modes share this file. With ``REDIS_URL`` unset the panel runs *embedded*: SQLite under
``var/``, a Celery worker and beat running as threads inside the web process on Celery's in-memory
transport, and Channels' in-memory layer. With ``REDIS_URL`` set it runs in *production* mode:
Redis is the Celery broker and the Channels layer, and web, worker and beat are separate
processes (see docker-compose.yml). docs/configuration.md documents every variable read here.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from controlpanel import private_files, timelimits
from controlpanel.env import (
    EnvError,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_networks,
    env_secret,
    env_str,
    env_url,
)

BASE_DIR = Path(__file__).resolve().parent.parent


def _settings():
    # Wrapped so that every EnvError surfaces as ImproperlyConfigured with the variable's name.
    try:
        return _read()
    except EnvError as exc:
        raise ImproperlyConfigured(str(exc)) from None


def _read():
    var_dir = Path(env_str("VAR_DIR", str(BASE_DIR / "var"))).resolve()
    redis_url = env_url("REDIS_URL", None, ("redis", "rediss", "unix"))
    embedded = redis_url is None
    debug = env_bool("DEBUG", False)
    if embedded:
        # var/ holds the database (sessions), the secret key and the demo password: owner-only.
        private_files.private_dir(var_dir)

    secret_key = env_secret("SECRET_KEY")
    if not secret_key:
        if not embedded:
            raise EnvError("SECRET_KEY", "", "a secret (or SECRET_KEY_FILE) in production mode")
        secret_key = _embedded_secret_key(var_dir)

    default_db = f"sqlite:///{var_dir / 'db.sqlite3'}"
    database_url = env_url(
        "DATABASE_URL", default_db, ("sqlite", "postgres", "postgresql", "pgsql")
    )
    try:
        # A kept connection is checked before its first use in each request or task, so one
        # PostgreSQL dropped (a restart, a failover) is reconnected, never a failed apply.
        database = dj_database_url.parse(
            database_url,
            conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 0, minimum=0),
            conn_health_checks=True,
        )
    except ValueError as exc:
        raise EnvError("DATABASE_URL", database_url, f"a database URL ({exc})") from None
    pool_size = env_int("DATABASE_POOL_SIZE", 0, minimum=0)
    if pool_size and database["ENGINE"] != "django.db.backends.sqlite3":
        # Under ASGI every request runs in its own thread and a persistent connection belongs
        # to its thread: with CONN_MAX_AGE each finished request's thread leaves an open
        # connection behind until PostgreSQL refuses new ones ("too many clients", measured by
        # scripts/bench_web.py). Django's docs: disable persistent connections under ASGI and
        # pool instead. psycopg's pool hands each request a connection and takes it back.
        database["CONN_MAX_AGE"] = 0
        database.setdefault("OPTIONS", {})["pool"] = {
            "min_size": 1,
            "max_size": pool_size,
            # A request waits this long for a free connection, then fails with an error
            # instead of hanging behind a saturated pool.
            "timeout": 10,
        }
    if database["ENGINE"] == "django.db.backends.sqlite3":
        name = Path(str(database.get("NAME") or ""))
        if str(name) not in ("", ":memory:") and name.parent.is_dir():
            # Created owner-only before SQLite creates it world-readable (its -wal and -shm
            # files take the database file's mode).
            private_files.private_file(name)
        database.setdefault("OPTIONS", {}).update(
            {
                # The embedded worker threads write while the web thread reads: WAL lets readers
                # proceed and IMMEDIATE transactions make writers queue instead of deadlocking.
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
            }
        )
    # Behind TLS (a proxy or load balancer) in production; plain http on 127.0.0.1 when embedded.
    https = env_bool("HTTPS", not embedded)
    return {
        "VAR_DIR": var_dir,
        "STATIC_ROOT": Path(env_str("STATIC_ROOT", str(var_dir / "static"))),
        "REDIS_URL": redis_url,
        "WEB_MAX_IN_FLIGHT": env_int("WEB_MAX_IN_FLIGHT", pool_size or 10, minimum=1),
        "WEB_QUEUE_SECONDS": env_float("WEB_QUEUE_SECONDS", 5.0, minimum=0),
        "PAGE_CACHE_SECONDS": env_int("PAGE_CACHE_SECONDS", 0 if embedded else 1, minimum=0),
        "EMBEDDED": embedded,
        "DEBUG": debug,
        "SECRET_KEY": secret_key,
        "DATABASE": database,
        "HTTPS": https,
        "ALLOWED_HOSTS": env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"]),
        "CSRF_TRUSTED_ORIGINS": env_list("CSRF_TRUSTED_ORIGINS", []),
        "TRUST_X_FORWARDED_PROTO": env_bool("TRUST_X_FORWARDED_PROTO", False),
        "HSTS_SECONDS": env_int("SECURE_HSTS_SECONDS", 31536000 if https else 0, minimum=0),
        "HSTS_SUBDOMAINS": env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", https),
        "HSTS_PRELOAD": env_bool("SECURE_HSTS_PRELOAD", https),
        "TIME_ZONE": env_str("TIME_ZONE", "UTC"),
        "LOG_LEVEL": env_choice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR")),
        "TASK_TIME_LIMIT": env_int("CELERY_TASK_TIME_LIMIT", 900, minimum=1),
        "EMBEDDED_WORKER_CONCURRENCY": env_int("EMBEDDED_WORKER_CONCURRENCY", 4, minimum=1),
        "HOST_CHECK_INTERVAL": env_float("HOST_CHECK_INTERVAL_SECONDS", 300.0, minimum=0),
        "HOST_CHECK_TIMEOUT": env_float("HOST_CHECK_TIMEOUT_SECONDS", 3.0, minimum=0.1),
        "HOST_CHECK_RETENTION_DAYS": env_int("HOST_CHECK_RETENTION_DAYS", 7, minimum=1),
        "CURRENCY": env_str("PANEL_CURRENCY", "USD"),
        "ENCRYPTION_KEYS": [
            k.strip() for k in (env_secret("PANEL_ENCRYPTION_KEY") or "").split(",") if k.strip()
        ],
        "TELEMETRY_INTERVAL": env_float("TELEMETRY_INTERVAL_SECONDS", 1.0, minimum=0),
        "TELEMETRY_RAW_MINUTES": env_int("TELEMETRY_RAW_RETENTION_MINUTES", 60, minimum=1),
        "TELEMETRY_MINUTE_DAYS": env_int("TELEMETRY_MINUTE_RETENTION_DAYS", 30, minimum=1),
        "TELEMETRY_HOUR_DAYS": env_int("TELEMETRY_HOUR_RETENTION_DAYS", 400, minimum=1),
        "TELEMETRY_SHARDS": env_int("TELEMETRY_SHARDS", 0, minimum=0),
        "TELEMETRY_POLL_CONNECTIONS": env_int("TELEMETRY_POLL_CONNECTIONS", 100, minimum=1),
        "TELEMETRY_BATCH_DEADLINE": env_float("TELEMETRY_BATCH_DEADLINE", 0.7, minimum=0),
        "TELEMETRY_DELETE_CHUNK": env_int("TELEMETRY_DELETE_CHUNK", 50000, minimum=100),
        "TRANSPORT_TIMEOUT": env_float("TRANSPORT_TIMEOUT_SECONDS", 5.0, minimum=0.1),
        "ENGINE_READY_TIMEOUT": env_float("ENGINE_READY_TIMEOUT_SECONDS", 600.0, minimum=1),
        "SSH_REMOTE_DIR": env_str("SSH_REMOTE_DIR", "~/.llm-panel"),
        "SSH_KEY_DIR": env_str("SSH_KEY_DIR", str(var_dir / "ssh-keys")),
        "AGENT_ALLOW_CLEARTEXT": env_bool("AGENT_ALLOW_CLEARTEXT", False),
        "BENCHMARK_MAX_SECONDS": env_float("BENCHMARK_MAX_SECONDS", 3 * 3600.0, minimum=10),
        "BENCHMARK_READY_TIMEOUT": env_float("BENCHMARK_READY_TIMEOUT_SECONDS", 60.0, minimum=0.5),
        "BENCHMARK_STALE_SECONDS": env_float("BENCHMARK_STALE_SECONDS", 300.0, minimum=10),
        "BENCHMARK_MAX_ERROR_PCT": env_int(
            "BENCHMARK_MAX_ERROR_PERCENT", 50, minimum=0, maximum=100
        ),
        "BENCHMARK_ERROR_WINDOW": env_int("BENCHMARK_ERROR_WINDOW_REQUESTS", 50, minimum=1),
        "BENCHMARK_NO_SUCCESS": env_int("BENCHMARK_NO_SUCCESS_REQUESTS", 10, minimum=1),
        "CHANGE_PRODUCTION_LABEL": env_str("CHANGE_PRODUCTION_LABEL", "env=production"),
        "CHANGE_PRODUCTION_APPROVALS": env_int(
            "CHANGE_PRODUCTION_APPROVALS", 2, minimum=1, maximum=5
        ),
        "CHANGE_HEALTH_TIMEOUT": env_float("CHANGE_HEALTH_TIMEOUT_SECONDS", 30.0, minimum=1),
        "CHANGE_HEARTBEAT_SECONDS": env_float("CHANGE_HEARTBEAT_SECONDS", 10.0, minimum=0.5),
        "LOST_WORK_HEARTBEAT_SECONDS": env_float("LOST_WORK_HEARTBEAT_SECONDS", 10.0, minimum=0.5),
        "LOST_WORK_AFTER_SECONDS": env_float("LOST_WORK_AFTER_SECONDS", 120.0, minimum=2.0),
        "SWEEPS_PREDICTING_PER_USER": env_int("SWEEPS_PREDICTING_PER_USER", 2, minimum=1),
        "SWEEPS_OPEN_PER_USER": env_int("SWEEPS_OPEN_PER_USER", 5, minimum=1),
        "QUALITY_PROBE_SET": env_str("QUALITY_PROBE_SET", "panel-core"),
        "CHANGE_NOTIFY_EMAILS": env_list("CHANGE_NOTIFY_EMAILS", []),
        "CHANGE_WEBHOOK_URL": env_secret("CHANGE_WEBHOOK_URL"),
        "PANEL_URL": env_str("PANEL_URL", "http://127.0.0.1:8000").rstrip("/"),
        "EMAIL_HOST": env_str("EMAIL_HOST", ""),
        "EMAIL_PORT": env_int("EMAIL_PORT", 25, minimum=1, maximum=65535),
        "EMAIL_HOST_USER": env_str("EMAIL_HOST_USER", ""),
        "EMAIL_HOST_PASSWORD": env_secret("EMAIL_HOST_PASSWORD") or "",
        "EMAIL_USE_TLS": env_bool("EMAIL_USE_TLS", False),
        "EMAIL_USE_SSL": env_bool("EMAIL_USE_SSL", False),
        "DEFAULT_FROM_EMAIL": env_str("DEFAULT_FROM_EMAIL", "llm-panel@localhost"),
        "LOGIN_FAILURE_LIMIT": env_int("LOGIN_FAILURE_LIMIT", 5, minimum=1),
        "LOGIN_ADDRESS_FAILURE_LIMIT": env_int("LOGIN_ADDRESS_FAILURE_LIMIT", 20, minimum=1),
        "LOGIN_LOCKOUT_MINUTES": env_int("LOGIN_LOCKOUT_MINUTES", 15, minimum=1),
        "METRICS_ALLOWED_ADDRESSES": env_networks("METRICS_ALLOWED_ADDRESSES"),
        "PROMETHEUS_MULTIPROC_DIR": _multiproc_dir(),
        "ADVISOR_INTERVAL": env_float("ADVISOR_INTERVAL_SECONDS", 60.0, minimum=0),
        "ADVISOR_SCRAPE_SECONDS": env_float("ADVISOR_SCRAPE_SECONDS", 5.0, minimum=0),
        "ADVISOR_TELEMETRY_SECONDS": env_float("ADVISOR_TELEMETRY_SECONDS", 300.0, minimum=1),
        "SCALING_SIGNAL_INTERVAL": env_float("SCALING_SIGNAL_INTERVAL_SECONDS", 1.0, minimum=0),
        "SCALING_SAMPLE_MINUTES": env_int("SCALING_SAMPLE_RETENTION_MINUTES", 60, minimum=10),
        "SCALING_SLO_TTFT_P95_MS": env_float("SCALING_SLO_TTFT_P95_MS", 500.0, minimum=1),
    }


def _multiproc_dir() -> str | None:
    # Read by prometheus-client itself from the environment; checked here so a missing
    # directory stops the process at start rather than at its first request.
    path = env_str("PROMETHEUS_MULTIPROC_DIR")
    if path and not Path(path).is_dir():
        raise EnvError("PROMETHEUS_MULTIPROC_DIR", path, "an existing directory")
    return path


def _embedded_secret_key(var_dir: Path) -> str:
    """A key kept under var/ so logins survive restarts of the embedded panel."""
    path = var_dir / "secret_key"
    private_files.private_dir(var_dir)
    private_files.private_file(path)
    key = path.read_text().strip()
    if not key:
        key = secrets.token_urlsafe(50)
        path.write_text(key)
    return key


_env = _settings()

VAR_DIR = _env["VAR_DIR"]
EMBEDDED = _env["EMBEDDED"]
DEBUG = _env["DEBUG"]
SECRET_KEY = _env["SECRET_KEY"]
ALLOWED_HOSTS = _env["ALLOWED_HOSTS"]
CSRF_TRUSTED_ORIGINS = _env["CSRF_TRUSTED_ORIGINS"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "channels",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's assets, served from here (no CDN)
    # Login throttling; before the panel's apps so its signal handlers have counted a failed
    # login when controlpanel.signals audits it.
    "axes",
    # The project's apps, bottom layer first; each imports only those listed before it
    # (import-linter contracts in pyproject.toml).
    "controlpanel",
    "hosts",
    "benchmarks",
    "changes",
    "scaling",
    "api",
    "home",
]

MIDDLEWARE = [
    # First: counts and times every request, including those the others answer (/metrics).
    "api.metrics_middleware.MetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # A logged-in user's permissions from the cache while no role changed (controlpanel.permcache).
    "controlpanel.permcache.PermissionCacheMiddleware",
    # Every page needs a login unless its view is marked @login_not_required.
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last but the pass-through below, as django-axes requires: turns a locked-out login
    # into the lockout page (429).
    "axes.middleware.AxesMiddleware",
    # Innermost and sync-only: the chain above runs as sync code in one thread under ASGI
    # instead of hopping threads at every middleware method (controlpanel.onethread).
    "controlpanel.onethread.OneThreadMiddleware",
]

ROOT_URLCONF = "controlpanel.urls"
ASGI_APPLICATION = "controlpanel.asgi.application"

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
                "home.context_processors.panel",
            ],
        },
    },
]

DATABASES = {"default": _env["DATABASE"]}
# Admission control of each web process (controlpanel.admission): HTTP requests in Django at
# once, by default the database pool's size (each request holds one of its connections), and
# how long the next ones may wait for a turn before a 503 with Retry-After.
WEB_MAX_IN_FLIGHT = _env["WEB_MAX_IN_FLIGHT"]
WEB_QUEUE_SECONDS = _env["WEB_QUEUE_SECONDS"]
# Page parts every viewer of a role sees alike (fleet tables, dashboard cards) are shared for
# this long through the cache (controlpanel.pagecache); a committed write shows at once.
PAGE_CACHE_SECONDS = _env["PAGE_CACHE_SECONDS"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# The throttling backend comes first: it refuses a locked-out account or address before the
# password is checked (controlpanel/accounts.py says what is counted).
AUTHENTICATION_BACKENDS = [
    "controlpanel.accounts.LoginThrottleBackend",
    "django.contrib.auth.backends.ModelBackend",
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = _env["TIME_ZONE"]
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = _env["STATIC_ROOT"]
STATICFILES_DIRS = [BASE_DIR / "static"]
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    # plotly.js comes from the installed plotly package, so its version follows the pin.
    "controlpanel.staticfinders.PlotlyJsFinder",
]
# Embedded, var/ (static files, uploads) is the panel's alone; Django would chmod each stored
# file 0644. A production image collects static files as another user at build time.
FILE_UPLOAD_PERMISSIONS = 0o600 if EMBEDDED else 0o644
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

# --- Security ------------------------------------------------------------------------------
HTTPS = _env["HTTPS"]
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_SSL_REDIRECT = HTTPS
SECURE_HSTS_SECONDS = _env["HSTS_SECONDS"]
SECURE_HSTS_INCLUDE_SUBDOMAINS = _env["HSTS_SUBDOMAINS"]
SECURE_HSTS_PRELOAD = _env["HSTS_PRELOAD"]
if _env["TRUST_X_FORWARDED_PROTO"]:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# The health endpoint is probed, and /metrics scraped, over plain http inside the compose
# network (/metrics still needs a token or an allowed address).
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
SESSION_COOKIE_HTTPONLY = True
# With Redis (production) a request reads its session from the cache; every write still goes
# to the database, which stays the truth (the sockets' batched rechecks read it there).
if _env["REDIS_URL"]:
    SESSION_ENGINE = "django.contrib.sessions.backends.cached_db"
X_FRAME_OPTIONS = "DENY"
# Error pages (DEBUG=true) and error mails hide every secret setting and URL password.
DEFAULT_EXCEPTION_REPORTER_FILTER = "controlpanel.redaction.SecretsExceptionReporterFilter"
DEFAULT_EXCEPTION_REPORTER = "controlpanel.redaction.SecretsExceptionReporter"

# --- Login throttling (django-axes) ----------------------------------------------------------
# An account is locked after LOGIN_FAILURE_LIMIT failures from any address, and an address
# after LOGIN_ADDRESS_FAILURE_LIMIT failures for any accounts, for LOGIN_LOCKOUT_MINUTES after
# the last failure. Admins unlock from the admin (Access attempts) or `manage.py axes_reset`.
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_FAILURE_LIMIT = _env["LOGIN_FAILURE_LIMIT"]
LOGIN_ADDRESS_FAILURE_LIMIT = _env["LOGIN_ADDRESS_FAILURE_LIMIT"]
AXES_COOLOFF_TIME = timedelta(minutes=_env["LOGIN_LOCKOUT_MINUTES"])
AXES_HANDLER = "controlpanel.accounts.LoginThrottleHandler"
AXES_LOCKOUT_CALLABLE = "controlpanel.accounts.lockout_response"
# Attempts go to the audit log (controlpanel.signals); axes keeps no log of its own beyond the
# counters, and none of successful logins.
AXES_DISABLE_ACCESS_LOG = True
AXES_VERBOSE = False  # no banner at every manage.py command

# --- The JSON API (api/, Django REST framework) --------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "api.auth.BearerTokenAuthentication",
        # The pages' own scripts; DRF checks CSRF on its unsafe methods.
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["api.permissions.PanelPermission"],
    "DEFAULT_PAGINATION_CLASS": "api.pagination.Pagination",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "api.errors.problem_handler",
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "DEFAULT_PARSER_CLASSES": ["api.parsers.UserJSONParser"],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "LLM control panel API",
    "DESCRIPTION": "Everything the pages do, for scripts and CI. Authenticate with "
    "`Authorization: Bearer <token>` (make one on the API tokens page or with "
    "`manage.py create_api_token`). Errors are problem details (RFC 9457).",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "api.schema.nullable_refs",
    ],
}
# Bad tokens from one address before it gets 429 for the rest of the window (api.auth).
API_TOKEN_FAILURE_LIMIT = 20
API_TOKEN_FAILURE_WINDOW = 600  # seconds
# The throttle's counters, sessions and shared page parts: shared by every process through
# Redis when there is one (one client and connection pool per process: controlpanel.rediscache).
CACHES = {
    "default": (
        {"BACKEND": "controlpanel.rediscache.SharedRedisCache", "LOCATION": _env["REDIS_URL"]}
        if _env["REDIS_URL"]
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}

# --- Celery --------------------------------------------------------------------------------
REDIS_URL = _env["REDIS_URL"]
CELERY_BROKER_URL = REDIS_URL or "memory://localhost/"
# Every background operation records its outcome on its own row, so results are not kept.
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_TIME_LIMIT = _env["TASK_TIME_LIMIT"]
CELERY_TASK_SOFT_TIME_LIMIT = max(1, _env["TASK_TIME_LIMIT"] - 30)
CELERY_TASK_ACKS_LATE = True
# A worker process killed mid-task (OOM, SIGKILL) gives its message back at once instead of
# acknowledging it: the redelivered copy then finds its row still running and closes it.
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Celery's fixup would close database connections around every task; controlpanel.task_db
# applies CONN_MAX_AGE instead (the fixup closes only after this many tasks: never, in effect).
CELERY_DB_REUSE_MAX = 10**9
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# Lets `celery inspect ping -d celerybeat@HOST` (the compose healthcheck) reach beat too.
CELERY_BEAT_ENABLE_REMOTE_CONTROL = not EMBEDDED
HOST_CHECK_INTERVAL = _env["HOST_CHECK_INTERVAL"]
HOST_CHECK_TIMEOUT = _env["HOST_CHECK_TIMEOUT"]
HOST_CHECK_RETENTION_DAYS = _env["HOST_CHECK_RETENTION_DAYS"]
CELERY_BEAT_SCHEDULE = {}
if HOST_CHECK_INTERVAL > 0:
    CELERY_BEAT_SCHEDULE["check-all-hosts"] = {
        "task": "hosts.tasks.check_all_hosts",
        "schedule": HOST_CHECK_INTERVAL,
    }
EMBEDDED_WORKER_CONCURRENCY = _env["EMBEDDED_WORKER_CONCURRENCY"]
# Every worker imports these at start: signal receivers that count tasks and heartbeats for
# /metrics (in Redis, which the web process reads) and keep database connections by age.
CELERY_IMPORTS = ["controlpanel.task_stats", "controlpanel.task_db"]

# --- /metrics (api/metrics.py) ---------------------------------------------------------------
# Scrapers from these addresses (IPs or CIDR networks) need no token; empty: tokens only.
METRICS_ALLOWED_ADDRESSES = _env["METRICS_ALLOWED_ADDRESSES"]
# Set: prometheus-client's multiprocess mode, the numbers of every web process added up.
PROMETHEUS_MULTIPROC_DIR = _env["PROMETHEUS_MULTIPROC_DIR"]


# --- Channels ------------------------------------------------------------------------------
def redis_channel_layers(url: str) -> dict:
    """CHANNEL_LAYERS on the Redis at ``url`` (the tests' processes use this same definition)."""
    return {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                # redis-py 8 reads with a 5 s socket timeout by default, the same 5 s that
                # channels_redis blocks in BZPOPMIN waiting for messages: an idle process's
                # receive loop raised TimeoutError and killed a socket every 5 s. Reads may
                # wait longer than the blocking pop.
                "hosts": [{"address": url, "socket_timeout": 15}],
                # Every socket of one web process shares one Redis queue, whose capacity is
                # this: at the default 100 a burst to 250 sockets was dropped silently.
                "capacity": 2000,
            },
        }
    }


if _env["REDIS_URL"]:
    CHANNEL_LAYERS = redis_channel_layers(REDIS_URL)
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

PANEL_CURRENCY = _env["CURRENCY"]
PANEL_ENCRYPTION_KEYS = _env["ENCRYPTION_KEYS"]

# --- Reaching hosts ------------------------------------------------------------------------
TELEMETRY_INTERVAL = _env["TELEMETRY_INTERVAL"]
TELEMETRY_RAW_RETENTION_MINUTES = _env["TELEMETRY_RAW_MINUTES"]
TELEMETRY_MINUTE_RETENTION_DAYS = _env["TELEMETRY_MINUTE_DAYS"]
TELEMETRY_HOUR_RETENTION_DAYS = _env["TELEMETRY_HOUR_DAYS"]
# Fleet scale (hosts.services.telemetry_fleet): 0 polls every host from one task on threads
# (a small fleet); N >= 1 makes beat's poll enqueue N shard tasks a second, each polling its
# hosts (id % N) concurrently and storing them in batches. Connections: per shard at once.
# Deadline: seconds after which a shard stores what has answered (late hosts follow).
TELEMETRY_SHARDS = _env["TELEMETRY_SHARDS"]
TELEMETRY_POLL_CONNECTIONS = _env["TELEMETRY_POLL_CONNECTIONS"]
TELEMETRY_BATCH_DEADLINE = _env["TELEMETRY_BATCH_DEADLINE"]
# Retention deletes (hosts.services.telemetry_sql): at most this many rows a statement and
# transaction, so a backlog of expired samples never becomes one giant delete.
TELEMETRY_DELETE_CHUNK = _env["TELEMETRY_DELETE_CHUNK"]
TRANSPORT_TIMEOUT = _env["TRANSPORT_TIMEOUT"]
ENGINE_READY_TIMEOUT = _env["ENGINE_READY_TIMEOUT"]
# The longest a benchmark may run (its task's time limit) when its profile does not bound it.
BENCHMARK_MAX_SECONDS = _env["BENCHMARK_MAX_SECONDS"]
# How long a run waits for the engine to answer /health and /v1/models before failing.
BENCHMARK_READY_TIMEOUT = _env["BENCHMARK_READY_TIMEOUT"]
# A running run with no new point for this long (or a queued one past its time limit) is
# failed by the sweep: its worker is gone and no redelivery came to close it.
BENCHMARK_STALE_SECONDS = _env["BENCHMARK_STALE_SECONDS"]
# A run stops and fails when more than this share of its last BENCHMARK_ERROR_WINDOW finished
# requests failed (a profile's max_error_rate replaces the share), or when its first
# BENCHMARK_NO_SUCCESS_REQUESTS all failed: its numbers would describe a broken engine.
BENCHMARK_MAX_ERROR_RATE = _env["BENCHMARK_MAX_ERROR_PCT"] / 100
BENCHMARK_ERROR_WINDOW = _env["BENCHMARK_ERROR_WINDOW"]
BENCHMARK_NO_SUCCESS_REQUESTS = _env["BENCHMARK_NO_SUCCESS"]
SSH_REMOTE_DIR = _env["SSH_REMOTE_DIR"]
# ssh_private_key=file:NAME reads keys from this directory only (empty: no key files).
SSH_KEY_DIR = _env["SSH_KEY_DIR"]
# Plain-HTTP agents on other machines (token and settings readable on the wire): off.
AGENT_ALLOW_CLEARTEXT = _env["AGENT_ALLOW_CLEARTEXT"]
# Redis must not hand a still-running task to a second worker: the visibility timeout outlasts
# the longest task's hard limit (controlpanel/timelimits.py holds every task's limits).
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": timelimits.visibility_timeout(
        benchmark_max=BENCHMARK_MAX_SECONDS,
        ready_timeout=ENGINE_READY_TIMEOUT,
        health_timeout=_env["CHANGE_HEALTH_TIMEOUT"],
        default_hard=CELERY_TASK_TIME_LIMIT,
    )
}
# Every long job's claim is stamped this often; one older than LOST_WORK_AFTER_SECONDS is a lost
# worker's, which the sweep below ends or resumes (controlpanel.lostwork, docs/workers.md).
LOST_WORK_HEARTBEAT_SECONDS = _env["LOST_WORK_HEARTBEAT_SECONDS"]
LOST_WORK_AFTER_SECONDS = _env["LOST_WORK_AFTER_SECONDS"]
CELERY_BEAT_SCHEDULE["sweep-lost-work"] = {
    "task": "controlpanel.tasks.sweep_lost_work",
    "schedule": 60.0,
}

# --- Changes -------------------------------------------------------------------------------
# Hosts carrying this label (key=value) need CHANGE_PRODUCTION_APPROVALS approvals, others one.
CHANGE_PRODUCTION_LABEL = _env["CHANGE_PRODUCTION_LABEL"]
CHANGE_PRODUCTION_APPROVALS = _env["CHANGE_PRODUCTION_APPROVALS"]
# How long the pipeline's own health check waits for /health and /v1/models after a restart.
CHANGE_HEALTH_TIMEOUT = _env["CHANGE_HEALTH_TIMEOUT"]
# A running pipeline stamps its change this often; three missed beats make it resumable.
CHANGE_HEARTBEAT_SECONDS = _env["CHANGE_HEARTBEAT_SECONDS"]
# Quotas: a user's sweeps predicting (each scores its whole space on a worker) and not finished.
SWEEPS_PREDICTING_PER_USER = _env["SWEEPS_PREDICTING_PER_USER"]
SWEEPS_OPEN_PER_USER = _env["SWEEPS_OPEN_PER_USER"]
# The probe set a change touching the model's answers (model, dtype, quantisation, KV-cache
# dtype) is verified with: the newest version of this name (built-in or uploaded).
QUALITY_PROBE_SET = _env["QUALITY_PROBE_SET"]
# Notifications: always the proposer and (for new proposals) the approvers with an address,
# plus these addresses; and a Slack-compatible webhook when set (a secret: _FILE works).
CHANGE_NOTIFY_EMAILS = _env["CHANGE_NOTIFY_EMAILS"]
CHANGE_WEBHOOK_URL = _env["CHANGE_WEBHOOK_URL"]
# Where people reach the panel, for links in notifications.
PANEL_URL = _env["PANEL_URL"]
# Mail goes through SMTP when EMAIL_HOST is set; otherwise to the log (console backend).
EMAIL_HOST = _env["EMAIL_HOST"]
EMAIL_BACKEND = (
    "django.core.mail.backends.smtp.EmailBackend"
    if EMAIL_HOST
    else "django.core.mail.backends.console.EmailBackend"
)
EMAIL_PORT = _env["EMAIL_PORT"]
EMAIL_HOST_USER = _env["EMAIL_HOST_USER"]
EMAIL_HOST_PASSWORD = _env["EMAIL_HOST_PASSWORD"]
EMAIL_USE_TLS = _env["EMAIL_USE_TLS"]
EMAIL_USE_SSL = _env["EMAIL_USE_SSL"]
EMAIL_TIMEOUT = 10
DEFAULT_FROM_EMAIL = _env["DEFAULT_FROM_EMAIL"]
SERVER_EMAIL = DEFAULT_FROM_EMAIL

if TELEMETRY_INTERVAL > 0:
    CELERY_BEAT_SCHEDULE["poll-telemetry"] = {
        "task": "hosts.tasks.poll_telemetry",
        "schedule": TELEMETRY_INTERVAL,
        # A poll that could not start in time is stale: the next one is already due.
        "options": {"expires": max(TELEMETRY_INTERVAL * 2, 2.0)},
    }
CELERY_BEAT_SCHEDULE["downsample-telemetry"] = {
    "task": "hosts.tasks.downsample_telemetry",
    "schedule": 60.0,
}

# --- The advisor (changes.services.diagnosis) ----------------------------------------------
# How often every deployment on an online host is re-evaluated (0: never, only on request).
ADVISOR_INTERVAL_SECONDS = _env["ADVISOR_INTERVAL"]
# How long an evaluation watches the engine's /metrics (its live window).
ADVISOR_SCRAPE_SECONDS = _env["ADVISOR_SCRAPE_SECONDS"]
# The GPU telemetry an evaluation averages (within the raw samples' retention).
ADVISOR_TELEMETRY_SECONDS = _env["ADVISOR_TELEMETRY_SECONDS"]
if ADVISOR_INTERVAL_SECONDS > 0:
    CELERY_BEAT_SCHEDULE["diagnose-fleet"] = {
        "task": "changes.tasks.diagnose_fleet",
        "schedule": ADVISOR_INTERVAL_SECONDS,
        # A sweep that could not start before the next is due is stale.
        "options": {"expires": ADVISOR_INTERVAL_SECONDS},
    }

# --- Scaling (scaling.services) ---------------------------------------------------------------
# How often the engines' /metrics are scraped for the live scaling signals (0: never).
SCALING_SIGNAL_INTERVAL = _env["SCALING_SIGNAL_INTERVAL"]
# Engine samples (one per deployment per scrape) are kept this long; the 5-minute windows
# need at least 5 of them, charts show up to this much.
SCALING_SAMPLE_RETENTION_MINUTES = _env["SCALING_SAMPLE_MINUTES"]
# The SLO a deployment without its own scaling policy is judged by (p95 TTFT, ms).
SCALING_SLO_TTFT_P95_MS = _env["SCALING_SLO_TTFT_P95_MS"]
if SCALING_SIGNAL_INTERVAL > 0:
    CELERY_BEAT_SCHEDULE["poll-engine-signals"] = {
        "task": "scaling.tasks.poll_engine_signals",
        "schedule": SCALING_SIGNAL_INTERVAL,
        # A scrape that could not start before the next is due is stale.
        "options": {"expires": max(SCALING_SIGNAL_INTERVAL * 2, 2.0)},
    }

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {
        "quiet_polls": {"()": "controlpanel.logfilters.QuietFrequentTasks"},
        "redact": {"()": "controlpanel.logfilters.RedactSecrets"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["quiet_polls", "redact"],
        }
    },
    "root": {"handlers": ["console"], "level": _env["LOG_LEVEL"]},
    "loggers": {
        "django.db.backends": {"level": "INFO"},
        # httpx logs every request at INFO: thousands a second during a load test.
        "httpx": {"level": "WARNING"},
        # uvicorn's access log (a password reset link's token is in its path) goes through the
        # same redacting handler as everything else.
        "uvicorn.access": {"handlers": ["console"], "propagate": False},
        "uvicorn.error": {"handlers": ["console"], "propagate": False},
    },
}
