"""The host agent: the small program that runs ON a GPU server (pure: no Django).

    python -m hosts.agent --listen 0.0.0.0:9100 --token-file PATH --tls-cert F --tls-key F
        [--state-dir DIR] [--allow-exec PROGRAM ...] [--simulate GPU[:COUNT]]

Plain HTTP (no --tls-cert) is served on a loopback address only, unless --insecure-http.

HTTP API (JSON; every request needs ``Authorization: Bearer <token>``, compared in constant
time; a wrong or missing token gets 401 ``{"error": "..."}``; bad input 400, unknown engine
404, all with ``{"error": "..."}``). Engine names are ``[a-z0-9][a-z0-9-]{0,62}``.

    GET  /v1/info                    {"agent_version", "hostname", "telemetry_source", "detail",
                                     "libraries": {package: version}} (vllm, sglang, torch,
                                     transformers, triton, flashinfer-python, nvidia-nccl-cu12
                                     as installed for the agent's interpreter; absent ones
                                     left out)
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

Additions to those shapes (clients may ignore them): a 400 for a bad LaunchConfig also carries
``"errors": {field: message}`` (LaunchError.errors); an engine status carries ``"operation"``
(the id of the apply/restart running on it, or None), ``"recovery"`` (``{"at", "message"}``:
what the agent found at its start and did about it) and ``"interrupted"`` (an apply/restart a
previous agent process died in: ``{"operation", "kind", "started_at", "found_at", "outcome"}``,
kept until the next apply/restart), as do telemetry's engines, with ``"error"``; a state may
be ``"conflict"`` (see State below), an operation's kind ``"adopt"`` or ``"recover"`` (the
agent's own, at its start); an operation carries ``"steps"`` (its
progress, one timestamped line per step). A second apply/restart while one runs on the same
engine gets 409 naming the running operation; ``stop`` during an apply or restart cancels it
(the operation ends ``failed``, "stopped by request"). Engines keep running when the agent
exits (SIGTERM, SIGINT: ``systemctl restart`` and upgrades send SIGTERM) and the next agent
adopts them; only an explicit stop stops one, or ``--stop-engines-on-exit`` (the demo fleet,
whose agents own their engines' lifetime).

Decisions (see the modules for the why):
- Token file (``server.read_token``): refused when missing, empty, or accessible to every user
  (``o+r``/``o+w``: any local account could drive the agent); group access is allowed with a
  warning, so ``root:agent 0640`` works. The token is never logged.
- What may run (``policy``): the rendered argv's program must be on the allow-list — by default
  ``vllm``, ``python3``/``python``/this interpreter followed by ``-m sglang.launch_server``, and
  this interpreter followed by ``-m hosts.simulator``; ``--allow-exec`` (repeatable, a program
  name or absolute path optionally followed by required leading args) replaces that list.
  ``numactl`` (CPU/memory binding options only) and ``taskset -c LIST`` may prefix it. Names
  resolve on the agent's PATH and run by absolute path; never through a shell. A config may
  set only the environment variables named in hosts.engines.environment.SAFE_ENV (none names a file,
  directory or library to load: CUDA_INJECTION64_PATH, VLLM_LOGGING_CONFIG_PATH,
  NCCL_NET_PLUGIN, HF_HOME, LD_*, PYTHON* are refused, whatever the panel sends), and flags that
  load code (``--trust-remote-code``) only when the agent was started with
  ``--allow-code-loading``. The agent's own secrets (…TOKEN, …SECRET…, …PASSWORD…, except HF
  tokens) are not passed to engines; command lines are logged with secret flags masked.
- State (``--state-dir``, default a fresh temp dir): ``engines/<name>.json`` (mode 0600) holds
  each engine's config, the process it runs (pid, start time, command line, digest of what was
  launched) and the apply/restart under way; ``engines/<name>.out`` (0600) the engine's output,
  which outlives the agent. A restarted agent adopts the engines it finds running as recorded,
  reports ``conflict`` (and kills nothing) when a recorded process or the engine's port is now
  something else, reports gone engines stopped (not restarted), and resolves an apply it was
  killed in to the last good config (``supervisor``).
- Telemetry: NVML when it initialises; ``--simulate GPU[:COUNT]`` reports simulated GPUs
  instead, even where NVML works (the demo must show the GPUs its simulator engines use).
"""

AGENT_VERSION = "0.1.0"
DEFAULT_PORT = 9100
