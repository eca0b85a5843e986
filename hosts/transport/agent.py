"""The agent transport: our host agent's HTTP API (``hosts/agent/__init__.py``) over httpx.

The agent does the work on the host (NVML telemetry, supervising engines, waiting for
readiness, rolling back); this client only translates: bearer token in, the agent's JSON out,
and every failure into a ``TransportError`` that says what to fix (401 → ``AuthError``; the
agent's own ``{"error": …}`` message otherwise). Applies and restarts are asynchronous on the
agent (202 + an operation id), so they are polled here until the operation finishes.
"""

from __future__ import annotations

import ssl
import time

import httpx

from hosts.engines.launch import LaunchConfig
from hosts.transport.base import (
    ApplyOutcome,
    AuthError,
    Transport,
    TransportError,
    check_engine_name,
)
from hosts.transport.jsontext import decode  # also what the fleet poll reads with
from hosts.transport.tls import system_trust

POLL_INTERVAL = 0.25
# Slack on top of the agent's own waiting (process start/stop, a busy host, the network).
OPERATION_MARGIN_S = 30.0
POLL_RETRIES = 3  # a network blip while polling must not lose track of a running operation


class AgentTransport(Transport):
    """One host running ``python -m hosts.agent``. ``address`` may be a name, IPv4 or IPv6;
    ``tls`` switches to HTTPS, verified against ``ca_cert`` (PEM text or a PEM file) or the
    system CAs."""

    kind = "agent"

    def __init__(
        self,
        address: str,
        port: int,
        token: str,
        *,
        tls: bool = False,
        ca_cert: str | None = None,
        timeout: float = 10.0,
    ):
        self.address, self.port = address, int(port)
        host = address.strip("[]")
        authority = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
        self.where = authority
        scheme = "https" if tls else "http"
        verify = system_trust()
        if tls and ca_cert:
            try:
                # PEM text (as the panel stores it on the host) or a path to a PEM file.
                pem = "-----BEGIN" in ca_cert
                verify = ssl.create_default_context(
                    cadata=ca_cert if pem else None, cafile=None if pem else ca_cert
                )
            except (OSError, ssl.SSLError) as exc:
                shown = "(PEM text)" if pem else ca_cert
                raise TransportError(f"cannot load the CA certificate {shown}: {exc}") from None
        self.timeout = timeout
        # Also what the fleet poll's own client (hosts.services.telemetry_loop) sends.
        self.base_url = f"{scheme}://{authority}"
        self.headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self._client = httpx.Client(
            base_url=self.base_url,
            headers=self.headers,
            timeout=timeout,
            verify=verify,
            trust_env=False,  # the agent is reached directly, never through a proxy from env
        )

    # ------------------------------------------------------------------ HTTP

    def _request(self, method: str, path: str, *, json: dict | None = None, params=None):
        """One call → (status, JSON object). Raises TransportError for anything but a 2xx or
        404 JSON answer (404 is the caller's to interpret: an engine that does not exist)."""
        try:
            response = self._client.request(method, path, json=json, params=params)
        except httpx.TimeoutException:
            raise TransportError(
                f"the agent at {self.where} did not answer within {self.timeout:g} s"
            ) from None
        except httpx.ConnectError as exc:
            reason = _reason(exc)
            raise TransportError(f"cannot reach the agent at {self.where}: {reason}") from None
        except httpx.HTTPError as exc:
            raise TransportError(f"talking to the agent at {self.where} failed: {exc}") from None
        try:
            payload = decode(response.content)
        except ValueError:
            payload = None
        if response.status_code == 401:
            raise AuthError(f"the agent at {self.where} refused the token")
        if not isinstance(payload, dict):
            raise TransportError(
                f"the agent at {self.where} answered {response.status_code} without a JSON "
                f"object: {response.text[:200]!r} (is something else listening on that port?)"
            )
        if response.status_code >= 400 and response.status_code != 404:
            message = payload.get("error") or response.reason_phrase
            raise TransportError(
                f"the agent at {self.where} refused {method} {path}: {message}"
                f" ({response.status_code})"
            )
        return response.status_code, payload

    def _get(self, path: str, **kwargs) -> dict:
        status, payload = self._request("GET", path, **kwargs)
        if status == 404:
            raise TransportError(f"the agent at {self.where}: {payload.get('error', 'not found')}")
        return payload

    # ------------------------------------------------------------------ Transport API

    def info(self) -> dict:
        payload = self._get("/v1/info")
        return {
            "kind": "agent",
            "hostname": payload.get("hostname", ""),
            "agent_version": payload.get("agent_version"),
            "libraries": payload.get("libraries") or {},  # {} from an older agent
            "telemetry_source": payload.get("telemetry_source", "none"),
            "detail": payload.get("detail", ""),
        }

    def inventory(self) -> dict:
        return self._get("/v1/inventory")

    def telemetry(self) -> dict:
        return self._get("/v1/telemetry")

    def engine_status(self, name: str) -> dict:
        status, payload = self._request("GET", f"/v1/engines/{check_engine_name(name)}")
        if status == 404:
            # Never deployed here (or forgotten with the agent's state dir): nothing runs.
            return {
                "name": name,
                "state": "stopped",
                "pid": None,
                "exit_code": None,
                "started_at": None,
                "ready_at": None,
                "error": "",
                "last_lines": [],
                "config": None,
            }
        return payload

    def apply_config(
        self,
        name: str,
        launch: LaunchConfig,
        *,
        previous: LaunchConfig | None,
        ready_timeout_s: float,
    ) -> ApplyOutcome:
        # ``previous`` is not sent: the agent keeps the config that ran before and rolls back
        # to it by itself, which also covers a panel that never knew what ran there.
        body = {"config": launch.to_dict(), "ready_timeout_s": ready_timeout_s}
        return self._operate(name, "apply", body, ready_timeout_s)

    def restart_engine(self, name: str, *, ready_timeout_s: float) -> ApplyOutcome:
        return self._operate(name, "restart", {"ready_timeout_s": ready_timeout_s}, ready_timeout_s)

    def _operate(self, name: str, verb: str, body: dict, ready_timeout_s: float) -> ApplyOutcome:
        check_engine_name(name)
        status, payload = self._request("POST", f"/v1/engines/{name}/{verb}", json=body)
        if status == 404:
            raise TransportError(f"the agent at {self.where}: {payload.get('error', 'not found')}")
        op_id = payload.get("operation")
        if not op_id:
            raise TransportError(f"the agent at {self.where} started no operation: {payload}")
        # The agent may wait the whole timeout twice: for the new config, then for the previous
        # one it rolls back to.
        deadline = time.monotonic() + 2 * ready_timeout_s + OPERATION_MARGIN_S
        failures = 0
        while True:
            try:
                op = self._get(f"/v1/operations/{op_id}")
                failures = 0
            except AuthError:
                raise
            except TransportError:
                failures += 1
                if failures > POLL_RETRIES:
                    raise
                op = {"state": "running"}
            if op.get("state") != "running":
                return ApplyOutcome(
                    state=op.get("state", "failed"),
                    error=op.get("error", ""),
                    log_lines=list(op.get("log_lines") or []),
                    detail={
                        "operation": op_id,
                        "kind": op.get("kind", verb),
                        "started_at": op.get("started_at"),
                        "finished_at": op.get("finished_at"),
                    },
                )
            if time.monotonic() >= deadline:
                raise TransportError(
                    f"the agent at {self.where} did not finish operation {op_id} ({verb} "
                    f"{name}) in time; it may still be running there"
                )
            time.sleep(POLL_INTERVAL)

    def stop_engine(self, name: str) -> None:
        self._request("POST", f"/v1/engines/{check_engine_name(name)}/stop")  # 404: not there

    def logs(self, name: str, lines: int = 200) -> list[str]:
        path = f"/v1/engines/{check_engine_name(name)}/logs"
        status, payload = self._request("GET", path, params={"lines": int(lines)})
        return [] if status == 404 else list(payload.get("lines") or [])

    def close(self) -> None:
        self._client.close()


def _reason(exc: httpx.ConnectError) -> str:
    """The OS's words ("Connection refused", "Name or service not known") without httpx's
    wrapping."""
    cause = exc.__cause__ or exc.__context__
    while cause is not None and cause.__cause__ is not None:
        cause = cause.__cause__
    text = getattr(cause, "strerror", None) or str(cause or exc)
    return text.strip() or type(exc).__name__
