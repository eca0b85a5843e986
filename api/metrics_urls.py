"""``/metrics``: the panel's own Prometheus metrics (filled in by the issue-16 work)."""

urlpatterns: list = []
