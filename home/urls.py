"""Pages that span the apps, at the top of the URL space (included without a namespace)."""

from django.urls import path

from benchmarks.views import cost as cost_views
from home import views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("favicon.ico", views.favicon, name="favicon"),
    # The cost page prices runs on every host, so it lives at the top rather than under
    # /benchmarks/.
    path("cost/", cost_views.cost, name="cost"),
]
