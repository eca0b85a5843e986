"""Is a login still good? Many at once, in a fixed number of queries.

A live socket re-checks the login behind it every few seconds (``controlpanel.consumers``). One
check is what a page request does: ``auth.get_user`` on the session (it exists and is unexpired,
names a configured backend, its user still exists and is active, and its password hash still
matches) and ``user.has_perm``. Done per socket that is ~4 queries and one thread hop each: with
500 sockets of 500 logins the checks queued on each process's database thread and held events
back 4.4 s at p99 (issue 22). ``verdicts`` answers a batch of checks with the same rules in
about four queries whatever the batch's size: the sessions, the users, and who holds each
permission asked.

Unlike ``auth.get_user`` it changes nothing: a session verified by a fallback secret is not
cycled, and one that fails is not flushed; the next page request does either.
"""

from __future__ import annotations

from importlib import import_module

from django.conf import settings
from django.contrib import auth
from django.contrib.auth.backends import BaseBackend, ModelBackend
from django.contrib.sessions.backends.db import SessionStore as DatabaseStore
from django.db.models import Q
from django.utils import timezone
from django.utils.crypto import constant_time_compare

# (session key, user pk, permission "app_label.codename")
Check = tuple[str, object, str]


def verdicts(checks: list[Check]) -> dict[Check, bool]:
    """Whether each check's session still logs in its user, who still holds its permission."""
    sessions = _sessions({key for key, _, _ in checks})
    logins = {key: _login(data) for key, data in sessions.items()}
    users = _users({login for login in logins.values() if login})
    holders = {perm: _holders(perm, users.values()) for perm in {perm for _, _, perm in checks}}
    out = {}
    for check in checks:
        key, pk, perm = check
        login = logins.get(key)
        user = users.get(login) if login else None
        out[check] = bool(
            user is not None
            and user.pk == pk
            and _hash_matches(sessions[key], user)
            and (user.pk in holders[perm] if holders[perm] is not None else user.has_perm(perm))
        )
    return out


def _store_class():
    return import_module(settings.SESSION_ENGINE).SessionStore


def _sessions(keys: set[str]) -> dict[str, dict]:
    """The decoded data of the sessions that exist and have not expired."""
    store = _store_class()
    if issubclass(store, DatabaseStore):  # db and cached_db: one query, the table is the truth
        rows = store.get_model_class().objects.filter(
            session_key__in=keys, expire_date__gt=timezone.now()
        )
        return {row.session_key: store().decode(row.session_data) for row in rows}
    found = {}
    for key in keys:  # cache, file, signed cookies: the store's own load, one by one
        data = store(session_key=key).load()
        if data:
            found[key] = data
    return found


def _login(data: dict) -> tuple[str, object] | None:
    """(backend path, user pk) a session's data names, if the backend is still configured."""
    backend = data.get(auth.BACKEND_SESSION_KEY)
    if backend not in settings.AUTHENTICATION_BACKENDS:
        return None
    try:
        return backend, auth.get_user_model()._meta.pk.to_python(data.get(auth.SESSION_KEY))
    except Exception:  # noqa: BLE001 - a session that names no valid pk logs in nobody
        return None


def _users(logins: set[tuple[str, object]]) -> dict:
    """What each backend's ``get_user`` returns for each login (absent where None), keyed by
    (backend path, pk); ModelBackend's users in one query."""
    model = auth.get_user_model()
    by_backend: dict[str, set] = {}
    for path, pk in logins:
        by_backend.setdefault(path, set()).add(pk)
    users = {}
    for path, pks in by_backend.items():
        backend = auth.load_backend(path)
        if isinstance(backend, ModelBackend) and type(backend).get_user is ModelBackend.get_user:
            found = [u for u in model._default_manager.filter(pk__in=pks)]
            found = [u for u in found if backend.user_can_authenticate(u)]
        else:
            found = [u for u in map(backend.get_user, pks) if u is not None]
        users.update(((path, user.pk), user) for user in found)
    return users


def _hash_matches(data: dict, user) -> bool:
    """``auth.get_user``'s password-hash rule for a session's data and its user."""
    if not hasattr(user, "get_session_auth_hash"):
        return True
    session_hash = data.get(auth.HASH_SESSION_KEY)
    if not session_hash:
        return False
    if constant_time_compare(session_hash, user.get_session_auth_hash()):
        return True
    return any(
        constant_time_compare(session_hash, fallback)
        for fallback in user.get_session_auth_fallback_hash()
    )


def _plain_permissions() -> bool:
    """Every configured backend answers ``has_perm`` as ModelBackend does or not at all, so the
    bulk answer of ``_holders`` is what ``user.has_perm`` would say."""
    for path in settings.AUTHENTICATION_BACKENDS:
        # A backend without has_perm is skipped by user.has_perm (axes' is one).
        has_perm = getattr(type(auth.load_backend(path)), "has_perm", None)
        if has_perm not in (None, ModelBackend.has_perm, BaseBackend.has_perm):
            return False
    return True


def _holders(perm: str, users) -> set | None:
    """The pks among ``users`` that hold ``perm`` (active superusers, or through their own
    permissions or a group's), in one query; None when another backend could grant it."""
    if not users or not _plain_permissions():
        return None
    app_label, _, codename = perm.partition(".")
    own = Q(
        user_permissions__codename=codename, user_permissions__content_type__app_label=app_label
    )
    grouped = Q(
        groups__permissions__codename=codename,
        groups__permissions__content_type__app_label=app_label,
    )
    model = auth.get_user_model()
    return set(
        model._default_manager.filter(pk__in={user.pk for user in users}, is_active=True)
        .filter(Q(is_superuser=True) | own | grouped)
        .values_list("pk", flat=True)
        .distinct()
    )
