"""Page parts that every viewer with the same permissions sees alike (the fleet's tables, the
dashboard's cards), rendered once and shared for ``PAGE_CACHE_SECONDS`` through the cache:
Redis in production, so every web process serves the part the first one rendered (issue 22).

Why: with 500 hosts polled every second, the hosts list, the history and the dashboard cost
20-35 ms of CPU a view, nearly all of it building the same HTML for everyone; 20 viewers
refreshing them left no CPU for the rest. A shared part costs one cache read.

What a shared part may hold: nothing of one user but what their permissions decide (the key
has a digest of them), nothing of the request but its path and query (in the key). A form's
CSRF token is stored as a placeholder (``csrf_placeholder``) and the tag writes each viewer's
own token in as the part is served (``with_csrf_tokens``), so a part may hold forms that
POST and no viewer is ever handed the token of the one who rendered it. The ``{% shared %}``
tag (templatetags/pagecache) marks such a part in a template.

Freshness: the key carries a generation that every committed save or delete of a panel model
(``post_save``/``post_delete``/``m2m_changed``, on commit) replaces, so the page an action
redirects to shows its result at once. What changes without a model signal (telemetry's
batched writes of the newest readings, queryset updates) shows within ``PAGE_CACHE_SECONDS``
(1 s by default in production: the telemetry poll interval; 0, off, in embedded mode and in
the test suite's own process).

One render per expiry: when a part's seconds are up, the first viewer to ask renders it anew
and the viewers asking meanwhile get the copy it replaces, for at most ``RENDER_GRACE_SECONDS``
more. Without that every request in flight rendered the same part at once (measured with
scripts/bench_web.py: ~3 renders of each part per expiry at 50 views/s, a quarter of the web
tier's CPU). A part whose generation is new (a write) has no copy to serve: it is rendered
by whoever asks, so a write still shows at once.

Each process also keeps the parts it served last in memory until their fresh time is up
(``LOCAL_PARTS``), under the same key: a viewer served from there costs no Redis round trip
(a hosts list part is ~100 KB; its GET was 4 % of the web worker's time under
scripts/bench_web.py). The key still carries the generation, so a write in any process
still shows at once; an expired copy goes the Redis way above.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils.crypto import salted_hmac

GENERATION_KEY = "pagecache:generation"
# How long past its PAGE_CACHE_SECONDS an expired part may still be served while another
# viewer renders it: the longest a render takes on a loaded machine, and the bound on how late
# a part can be if the process rendering it dies.
RENDER_GRACE_SECONDS = 3
# Models written many times a second or per request whose rows no shared part shows: the
# readings and points (telemetry, runs, scaling), per-request logs and tokens' last use.
QUIET = frozenset(
    {
        "hosts.GpuSample",
        "hosts.GpuSampleMinute",
        "hosts.GpuSampleHour",
        "benchmarks.RunPoint",
        "benchmarks.RunRequestLog",
        "benchmarks.RunShardChunk",
        "benchmarks.ProbeResult",
        "scaling.EngineSample",
        "api.ApiToken",
    }
)
# The apps whose rows pages show (auth: user names in the history's filters, roles).
WATCHED_APPS = frozenset({"hosts", "benchmarks", "changes", "scaling", "controlpanel", "auth"})


# This process's fresh copies: key -> (html, fresh until). A few dozen parts (roles x pages x
# filters viewed in the last second); past LOCAL_PARTS the expired go, else the oldest half.
LOCAL_PARTS = 64
_local: dict[str, tuple[str, float]] = {}
_local_lock = threading.Lock()


def _keep(key: str, html: str, fresh_until: float) -> None:
    with _local_lock:
        if len(_local) >= LOCAL_PARTS:
            now = time.time()
            gone = [k for k, (_html, until) in _local.items() if until <= now]
            for k in gone or list(_local)[: LOCAL_PARTS // 2]:
                del _local[k]
        _local[key] = (html, fresh_until)


def clear_local() -> None:
    """Forget this process's copies (the tests' cache is emptied between tests)."""
    with _local_lock:
        _local.clear()


def enabled() -> bool:
    return settings.PAGE_CACHE_SECONDS > 0


def generation_is_shared() -> bool:
    """Whether committed writes move the generation (``model_written``): the shared parts
    are on, or the cache is Redis, shared with the worker processes that write too."""
    return enabled() or bool(settings.REDIS_URL)


# Generations this process started: a request's remembered generation is used only while
# this has not moved (a write in the same process shows at once).
_bumps = 0


def generation(request=None) -> str:
    """The current generation ("0" until the first write since the cache was empty). With a
    ``request``, read once for it (its shared parts and permissions: one Redis round trip,
    not one per part) unless this process started a new generation since."""
    remembered = getattr(request, "_pagecache_generation", None)
    if remembered is not None and remembered[0] == _bumps:
        return remembered[1]
    value = cache.get(GENERATION_KEY) or "0"
    remember(request, value)
    return value


def remember(request, value: str) -> None:
    """Keep ``value``, just read from the cache, as ``request``'s generation."""
    if request is not None:
        request._pagecache_generation = (_bumps, value)


def bump() -> None:
    """A new generation: every shared part rendered before is not used again. A fresh random
    value rather than a counter, so an evicted key can never bring an old generation back."""
    global _bumps
    _bumps += 1
    cache.set(GENERATION_KEY, uuid.uuid4().hex, timeout=None)


def model_written(sender, **kwargs) -> None:
    """Receiver of the model signals (connected in controlpanel.apps): a write of a watched
    model moves the generation on once its transaction commits (a reader in between would
    otherwise cache the old rows under the new generation). Whenever the cache is shared
    (production, Redis), whatever this process's own PAGE_CACHE_SECONDS: a worker started
    with the parts off still writes rows the web processes show."""
    if not generation_is_shared():
        return
    meta = getattr(sender, "_meta", None)
    if meta is None or meta.app_label not in WATCHED_APPS or meta.label in QUIET:
        return
    transaction.on_commit(bump, using=kwargs.get("using"))


def permissions_digest(user) -> str:
    """What decides a shared part's buttons and sections: the user's permissions (the same for
    everyone of a role). get_all_permissions() is cached on the user for the request."""
    if not user.is_authenticated:
        return "anonymous"
    names = sorted(user.get_all_permissions())
    flags = f"{int(user.is_superuser)}{int(user.is_staff)}"
    return hashlib.sha256("\n".join([flags, *names]).encode()).hexdigest()[:24]


def part_key(request, name: str, vary: tuple = ()) -> str:
    """The cache key of one shared part as ``request`` would see it."""
    parts = [
        name,
        generation(request),
        permissions_digest(request.user),
        request.get_full_path(),
        *(str(v) for v in vary),
    ]
    return "pagecache:part:" + hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def csrf_placeholder() -> str:
    """What a shared part holds where a CSRF token goes: the same in every process with this
    SECRET_KEY (parts are shared through Redis) and unguessable by users, so nothing they
    enter (a host's notes, a link) can have the panel write a viewer's token into it."""
    return "csrf" + salted_hmac("controlpanel.pagecache", "csrf", algorithm="sha256").hexdigest()


def with_csrf_tokens(html: str, token) -> str:
    """``html`` with the viewer's CSRF ``token`` (the page's ``csrf_token``, evaluated only if
    needed: that sends the CSRF cookie, as ``{% csrf_token %}`` does) where the part holds the
    placeholder."""
    placeholder = csrf_placeholder()
    if placeholder not in html:
        return html
    return html.replace(placeholder, str(token))


def shared(request, name: str, render, vary: tuple = ()) -> str:
    """The HTML of part ``name`` for ``request``: from the cache, or ``render()`` stored for the
    next viewer. Off (always rendered) when PAGE_CACHE_SECONDS is 0 or there is no request."""
    if not enabled() or request is None or not hasattr(request, "user"):
        return render()
    key = part_key(request, name, vary)
    local = _local.get(key)
    if local is not None and time.time() < local[1]:
        return local[0]
    stored = cache.get(key)  # (html, fresh until), kept RENDER_GRACE_SECONDS past that
    rendering = key.replace(":part:", ":rendering:", 1)
    if stored is not None:
        html, fresh_until = stored
        if time.time() < fresh_until:
            _keep(key, html, fresh_until)
            return html
        # Expired: whoever takes the render lock renders; the rest serve this copy meanwhile.
        if not cache.add(rendering, 1, timeout=RENDER_GRACE_SECONDS):
            return html
    else:
        rendering = None
    try:
        html = str(render())
        seconds = settings.PAGE_CACHE_SECONDS
        fresh_until = time.time() + seconds
        cache.set(key, (html, fresh_until), timeout=seconds + RENDER_GRACE_SECONDS)
        _keep(key, html, fresh_until)
    finally:
        if rendering:
            cache.delete(rendering)
    return html
