"""API resources: runs (filled in by the issue-16 work)."""

urlpatterns: list = []
