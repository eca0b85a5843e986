"""How many browsers hold a live WebSocket to this process, for ``/metrics``.

The consumers (``controlpanel.consumers.ObjectConsumer``) call ``opened`` once a socket is
accepted and ``closed`` when it goes; the gauge is per process. With
``PROMETHEUS_MULTIPROC_DIR`` set, prometheus-client keeps it in a file that ``/metrics`` adds
up over the live processes (``livesum``), and a process that exits cleanly drops its file.
"""

from __future__ import annotations

import atexit
import os

from prometheus_client import Gauge

# Not in prometheus-client's default registry: /metrics builds its own (api.metrics), so the
# exposition holds llmpanel_* families only.
WEBSOCKETS = Gauge(
    "llmpanel_websocket_connections",
    "Open WebSocket connections of this process (all processes' in multiprocess mode), "
    "by kind of object watched.",
    ["kind"],
    registry=None,
    multiprocess_mode="livesum",
)


def opened(consumer) -> None:
    WEBSOCKETS.labels(consumer.group_kind or "other").inc()
    consumer.metrics_counted = True


def closed(consumer) -> None:
    # A refused socket (never accepted) was never counted; a disconnect may come twice.
    if getattr(consumer, "metrics_counted", False):
        consumer.metrics_counted = False
        WEBSOCKETS.labels(consumer.group_kind or "other").dec()


def _forget_this_process() -> None:
    """A live gauge's file outlives its process unless removed (prometheus-client's
    multiprocess documentation): done at a clean exit; a killed process's file stays until
    the directory is emptied at the next start."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory and os.path.isdir(directory):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(os.getpid(), directory)


atexit.register(_forget_this_process)
