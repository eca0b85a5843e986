"""A logged-in user's permissions (and role names) read from the shared cache instead of the
database on every request (issue 22).

Every page asks ``user.has_perm`` (the navigation, the view's own check, the shared parts'
key): Django's ModelBackend answers from two queries a request (the user's own permissions and
their groups'), about 9 % of the web tier's CPU under load (py-spy, scripts/bench_web.py).
They change only when an account, a role or a group's permissions are written, and every such
write moves the shared parts' generation (``controlpanel.pagecache``: auth is a watched app,
``m2m_changed`` included). So the set ModelBackend computed is kept in the cache with the
generation it was read under, and used only while that generation is still current: a role
taken away shows on the next request, as before. Only where the generation moves in every
process (``pagecache.generation_is_shared``); otherwise ModelBackend reads as it always did.

Kept per user and superuser flag. An inactive user never gets here (``auth.get_user`` logs
them out), and ModelBackend itself answers for anything asked about an object.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache
from django.utils.deprecation import MiddlewareMixin

from controlpanel import pagecache
from controlpanel.roles import role_names

BACKEND = "django.contrib.auth.backends.ModelBackend"
TIMEOUT = 3600  # seconds; the generation decides freshness, this only bounds the memory


def key(user) -> str:
    return f"permcache:{user.pk}:{int(user.is_superuser)}"


def warm(user, request=None) -> bool:
    """Give ``user`` (a ModelBackend user of ``request``) its permission set from the cache,
    or read it and store it there. Returns whether the cache had it. The generation read
    with it is the request's (pagecache.generation) for its shared parts."""
    got = cache.get_many([pagecache.GENERATION_KEY, key(user)])
    generation = got.get(pagecache.GENERATION_KEY)
    if generation is None:
        # No generation (a new, flushed or evicting cache): start one, and read the database
        # this time. Were "none" a generation of its own, a set stored under it before a role
        # change could come back when the generation key is lost again.
        pagecache.bump()
        return False
    pagecache.remember(request, generation)
    stored = got.get(key(user))
    if stored is not None and stored[0] == generation:
        # Where ModelBackend.get_all_permissions and roles.role_names keep what they read.
        user._perm_cache, user._role_names = stored[1], stored[2]
        return True
    perms = ModelBackend().get_all_permissions(user)
    cache.set(key(user), (generation, set(perms), role_names(user)), timeout=TIMEOUT)
    return False


class PermissionCacheMiddleware(MiddlewareMixin):
    """After AuthenticationMiddleware: a logged-in user's permissions from the cache. A
    MiddlewareMixin like Django's own, so it runs in whichever mode the chain runs."""

    def process_request(self, request):
        if (
            pagecache.generation_is_shared()
            and BACKEND in settings.AUTHENTICATION_BACKENDS
            # Only a session with a login (no user row read for anyone else).
            and SESSION_KEY in request.session
            and request.user.is_authenticated
            and request.user.is_active
        ):
            warm(request.user, request)
