"""Workflows of the hosts app, one module per concern; each verb writes the audit log.

- ``hosts``: create and update hosts, accept a host key, the host's status (``set_status``).
- ``transports``: ``transport_for(host)`` (agent or SSH, hosts/transport/) and the poller's
  per-host transport cache.
- ``checks``: reachability checks (queued, run by the worker, swept by the scheduler) and the
  transport test that first talks to a host.
- ``inventory``: the host's ``Gpu`` rows and facts from what it reported.
- ``telemetry``: polling hosts, storing samples and engine states, downsampling to minutes.
- ``operations``: apply a config or restart an engine, one at a time per deployment.

Dependencies point one way: ``transports`` <- ``hosts`` <- ``inventory`` <- ``checks`` and
``telemetry`` <- ``operations``. Callers import the module they need
(``from hosts.services import operations``); this package re-exports nothing.
"""
