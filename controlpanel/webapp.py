"""What the production web tier serves (``controlpanel.webserver`` points uvicorn here):
``controlpanel.asgi``'s application, in a process whose garbage collector and GIL switch
interval are tuned for serving pages.

Why: Django, the apps and their modules leave ~116,000 objects the collector tracks after
start-up, and each collection that reaches the oldest generation walks them all; a page
view allocates thousands more (template output, querysets, model instances), which with
CPython's default first threshold (700 net allocations) starts the younger collections
often. The start-up objects are moved out of its reach once the application is built
(``gc.freeze``, as Instagram's Django servers do), and a collection starts after 10,000 net
allocations rather than 700. Measured with scripts/bench_web.py
(2-core AMD EPYC, 20 viewers, 4,000 GPUs polled): 6.6-6.9 -> 6.3-6.5 ms of web CPU a page
view. Garbage is still collected: only the first generation's trigger moves.

The interpreter's switch interval (how long a thread holding the GIL keeps it while others
wait) goes from 5 ms to 1 ms: a request whose database or Redis answer has arrived waits for
the GIL behind another request's template render, up to the interval each time, and a page
view waits for several such answers. Same bench: p95 296-311 -> 277-283 ms at the same CPU
a page view.

A module of its own, not ``controlpanel.asgi``: tests and tools import that one, and the
settings here are for a long-lived server process only.
"""

import gc
import sys

from controlpanel.asgi import application

# (first generation, second, third): the first from 700; the others count collections of the
# generation below, 50 and 100 so that the older generations are walked as rarely as before
# relative to the allocations.
GC_THRESHOLDS = (10_000, 50, 100)
SWITCH_INTERVAL = 0.001  # seconds

gc.freeze()
gc.set_threshold(*GC_THRESHOLDS)
sys.setswitchinterval(SWITCH_INTERVAL)

__all__ = ["application"]
