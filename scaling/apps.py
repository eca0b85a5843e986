from django.apps import AppConfig


class ScalingConfig(AppConfig):
    """Scaling signals, capacity at SLO, desired replicas, exports and the what-if planner.

    The top app but for the API and the cross-app pages: it reads deployments (hosts),
    benchmark history (benchmarks) and sweeps (changes), and nothing below imports it."""

    name = "scaling"
