"""Values every page needs: the navigation the user may see (it names every app's pages, so it
lives in the top app), their roles, the currency."""

from functools import cache, lru_cache

from django.conf import settings
from django.urls import get_script_prefix, reverse

from controlpanel.roles import role_names
from home.attention import reviews_waiting

NAVIGATION = (
    ("Dashboard", "dashboard", "hosts.view_host"),
    ("Hosts", "hosts:list", "hosts.view_host"),
    ("Benchmarks", "benchmarks:list", "benchmarks.view_benchmarkrun"),
    ("Changes", "changes:list", "changes.view_changerequest"),
    ("Sweeps", "changes:sweeps", "changes.view_sweep"),
    ("Scaling", "scaling:fleet", "hosts.view_deployment"),
    ("Cost", "cost", "benchmarks.view_benchmarkrun"),
    ("Audit log", "audit", "controlpanel.view_auditentry"),
)
# Entries that show how many reviews wait for the user: which of reviews_waiting's lists.
REVIEW_COUNTS = {"changes:list": 0, "changes:sweeps": 1}


class _Count:
    """A review count that queries only when a template shows it (partials rendered with
    this context never ask), once per request for all the entries."""

    def __init__(self, lists, which: int):
        self.lists, self.which = lists, which

    def __int__(self) -> int:
        return len(self.lists()[self.which])

    def __bool__(self) -> bool:
        return int(self) > 0

    def __str__(self) -> str:
        return str(int(self))


@lru_cache(maxsize=8)
def _nav_urls(script_prefix: str) -> tuple[str, ...]:
    """The entries' URLs under ``script_prefix`` (the same for every request of a deployment:
    the URLconf does not change while the process runs); reversed once, not on every page."""
    return tuple(reverse(name) for _, name, _ in NAVIGATION)


def panel(request):
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"nav": [], "roles": [], "currency": settings.PANEL_CURRENCY}
    path = request.path
    nav = []
    urls = _nav_urls(get_script_prefix())
    waiting = cache(lambda: reviews_waiting(user))
    for (label, name, perm), url in zip(NAVIGATION, urls, strict=True):
        if not user.has_perm(perm):
            continue
        # The longest matching entry is the page's (/changes/sweeps/ is Sweeps, not Changes).
        longer = any(o != url and o.startswith(url) and path.startswith(o) for o in urls)
        active = path == url if url == "/" else path.startswith(url) and not longer
        item = {"label": label, "url": url, "active": active}
        if name in REVIEW_COUNTS:
            item["waiting"] = _Count(waiting, REVIEW_COUNTS[name])
        nav.append(item)
    return {
        "nav": nav,
        "roles": role_names(user),
        "currency": settings.PANEL_CURRENCY,
        "embedded": settings.EMBEDDED,
    }
