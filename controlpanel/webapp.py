"""What the production web tier serves (``controlpanel.webserver`` points uvicorn here):
``controlpanel.asgi``'s application, in a process whose garbage collector and GIL switch
interval are tuned for serving pages.

Why: a page view allocates thousands of objects (the template's nodes' output, querysets,
model instances), so with CPython's default thresholds (700 net allocations) the collector
ran several times a view (4 first-generation collections for the login page alone), and its
older generations hold the ~116,000 objects Django, the apps and their modules leave alive
after start-up. Those are moved out of its reach once the application is built
(``gc.freeze``, as Instagram's Django servers do), and a collection starts after 10,000 net
allocations rather than 700. Measured with scripts/bench_web.py
(2-core AMD EPYC, 20 viewers, 4,000 GPUs polled): 6.6-6.9 -> 6.3-6.5 ms of web CPU a page
view. Garbage is still collected: only the first generation's trigger moves.

The interpreter's switch interval (how long a thread holding the GIL keeps it while others
wait) goes from 5 ms to 1 ms: a request whose database or Redis answer has arrived waits for
the GIL behind another request's template render, up to the interval each time, and a page
view waits for about ten such answers. Same bench: p95 296-311 -> 277-283 ms at the same CPU
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
