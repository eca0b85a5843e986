"""The TLS context every panel-side HTTP client verifies servers with (pure: no Django).

httpx builds a new ``ssl.SSLContext`` for each client made with ``verify=True`` (the default),
even for plain-HTTP URLs, and loading certifi's CA bundle costs about 20 ms of CPU each time.
The panel makes short-lived clients in its hot loops (the engine-signal poll every few
seconds, each live diagnosis, each health check): an idle demo panel spent about a third of
its CPU there (py-spy, 2026-12-07). One context a process, shared: an ``SSLContext`` is safe
to use from many threads once configured, and nothing here changes it after it is made."""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache  # functools.cache is thread-safe: at worst two threads build it once each
def system_trust() -> ssl.SSLContext:
    """What a server's certificate is verified against when nothing more specific is
    configured: the context httpx builds for ``verify=True`` (certifi's CAs; proxies and
    SSL_CERT_FILE from the environment are not read), made once a process."""
    return httpx.create_ssl_context(trust_env=False)
