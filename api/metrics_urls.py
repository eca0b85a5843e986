"""``/metrics``: the panel's own Prometheus metrics (``api.metrics``)."""

from django.urls import path

from api.metrics import metrics

urlpatterns = [path("metrics", metrics, name="metrics")]
