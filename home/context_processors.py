"""Values every page needs: the navigation the user may see (it names every app's pages, so it
lives in the top app), their roles, the currency."""

from django.conf import settings
from django.urls import reverse

from controlpanel.roles import role_names

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


def panel(request):
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"nav": [], "roles": [], "currency": settings.PANEL_CURRENCY}
    path = request.path
    nav = []
    urls = [reverse(name) for _, name, _ in NAVIGATION]
    for (label, _, perm), url in zip(NAVIGATION, urls, strict=True):
        if not user.has_perm(perm):
            continue
        # The longest matching entry is the page's (/changes/sweeps/ is Sweeps, not Changes).
        longer = any(o != url and o.startswith(url) and path.startswith(o) for o in urls)
        active = path == url if url == "/" else path.startswith(url) and not longer
        nav.append({"label": label, "url": url, "active": active})
    return {
        "nav": nav,
        "roles": role_names(user),
        "currency": settings.PANEL_CURRENCY,
        "embedded": settings.EMBEDDED,
    }
