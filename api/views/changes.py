"""API resources: changes (filled in by the issue-16 work)."""

urlpatterns: list = []
