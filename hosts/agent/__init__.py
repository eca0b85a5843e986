"""The host agent: the small program that runs ON a GPU server (pure: no Django).

    python -m hosts.agent --listen 0.0.0.0:9100 --token-file PATH [--tls-cert F --tls-key F]
        [--state-dir DIR] [--allow-exec PROGRAM ...] [--simulate GPU[:COUNT]]

HTTP API (JSON; every request needs ``Authorization: Bearer <token>``, compared in constant
time; a wrong or missing token gets 401 ``{"error": "..."}``; bad input 400, unknown engine
404, all with ``{"error": "..."}``). Engine names are ``[a-z0-9][a-z0-9-]{0,62}``.

    GET  /v1/info                    {"agent_version", "hostname", "telemetry_source", "detail"}
    GET  /v1/inventory               the shape of hosts.transport.base.Transport.inventory()
    GET  /v1/telemetry               the shape of Transport.telemetry()
    GET  /v1/engines                 {"engines": {name: status}}
    GET  /v1/engines/<name>          status: the shape of Transport.engine_status()
    POST /v1/engines/<name>/apply    {"config": LaunchConfig.to_dict(), "ready_timeout_s": s}
                                     → 202 {"operation": id}; the agent stores the config,
                                     restarts, waits for /health then /v1/models, and rolls
                                     back to the previous config if it is not ready in time
    POST /v1/engines/<name>/restart  {"ready_timeout_s": s} → 202 {"operation": id}
    POST /v1/engines/<name>/stop     → 200 status
    GET  /v1/engines/<name>/logs?lines=N        {"lines": [...]}
    GET  /v1/operations/<id>         {"id", "engine", "kind": "apply"|"restart",
                                     "state": "running"|"ready"|"rolled_back"|"failed",
                                     "error", "log_lines": [...], "started_at", "finished_at"}
"""

AGENT_VERSION = "0.1.0"
DEFAULT_PORT = 9100
