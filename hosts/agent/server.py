"""The agent's HTTP API (stdlib ``http.server``, optionally over TLS) and its command line.

Routes and shapes are the contract in ``hosts/agent/__init__.py``. A threaded server is
enough: the panel polls a handful of endpoints, and the long work (applies) runs in the
supervisor's own threads while requests return at once.
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import re
import signal
import socket
import ssl
import stat
import sys
import tempfile
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import psutil

from hosts.addresses import is_loopback
from hosts.agent import AGENT_VERSION, DEFAULT_PORT
from hosts.agent.engine import AgentError, NotFound
from hosts.agent.host import host_identity, host_readings, library_versions, process_affinity
from hosts.agent.nvml import NvmlReader
from hosts.agent.policy import ENGINE_NAME, ExecPolicy
from hosts.agent.simulated import SimulatedGpus, parse_simulate
from hosts.agent.supervisor import Supervisor

log = logging.getLogger("hosts.agent")

MAX_BODY = 1 << 20  # a LaunchConfig is a few KB
MAX_LOG_LINES = 5000
NAME = r"(?P<name>[^/]+)"


class TokenFileError(Exception):
    """The token file cannot be used; ``str()`` tells the operator what to fix."""


def read_token(path: Path) -> str:
    """The bearer token from ``path``. Refused when missing, empty, or readable or writable by
    everyone (any local user could then drive the agent); group access only gets a warning,
    so a service group can share it (``root:agent 0640``)."""
    try:
        info = path.stat()
        token = path.read_text().strip()
    except OSError as exc:
        raise TokenFileError(f"cannot read the token file {path}: {exc.strerror}") from None
    if info.st_mode & (stat.S_IROTH | stat.S_IWOTH):
        raise TokenFileError(
            f"the token file {path} is accessible to every user (mode "
            f"{stat.S_IMODE(info.st_mode):04o}); run: chmod 600 {path}"
        )
    if info.st_mode & (stat.S_IRGRP | stat.S_IWGRP):
        log.warning(
            "the token file %s is group-accessible (mode %04o); 0600 is safer",
            path,
            stat.S_IMODE(info.st_mode),
        )
    if not token:
        raise TokenFileError(f"the token file {path} is empty")
    if any(c.isspace() for c in token):
        raise TokenFileError(f"the token in {path} contains whitespace")
    return token


class Agent:
    """Telemetry and inventory of this host, plus its engine supervisor."""

    def __init__(
        self,
        supervisor: Supervisor,
        *,
        simulate: str | None = None,
        simulate_seed: str = "",
        nvml: NvmlReader | None = None,
    ):
        self.supervisor = supervisor
        self.nvml = nvml if nvml is not None else NvmlReader()
        self.simulated = None
        if simulate:
            spec, count = parse_simulate(simulate)
            self.simulated = SimulatedGpus(spec, count, seed=simulate_seed)
        psutil.cpu_percent(interval=None)  # the first call only starts the measurement

    @property
    def source(self) -> str:
        # An explicit --simulate wins over a real GPU: the demo on a workstation with a GPU
        # must show the simulated fleet the simulator engines reserve memory on.
        if self.simulated is not None:
            return "simulator"
        return "nvml" if self.nvml.available else "none"

    def gpu_count(self) -> int | None:
        if self.simulated is not None:
            return self.simulated.count
        return self.nvml.device_count() if self.nvml.available else None

    def note(self) -> str:
        if self.simulated is not None:
            sim = self.simulated
            text = f"simulated GPUs ({sim.count} × {sim.spec.nvml_name}, --simulate)"
            if self.nvml.available:
                return text + f"; NVML sees {self.nvml.device_count()} real GPU(s), not reported"
            return text + f"; NVML is not available: {self.nvml.reason}"
        if self.nvml.available:
            return f"NVML, driver {self.nvml.driver_version}, CUDA {self.nvml.cuda_version}"
        return f"NVML is not available: {self.nvml.reason}"

    def info(self) -> dict:
        return {
            "agent_version": AGENT_VERSION,
            "hostname": socket.gethostname(),
            "telemetry_source": self.source,
            "detail": self.note(),
            "libraries": library_versions(),
        }

    def inventory(self) -> dict:
        source = self.source
        if source == "simulator":
            gpus = self.simulated.inventory_gpus()
            driver = cuda = None
        else:
            gpus = self.nvml.inventory_gpus()
            driver, cuda = self.nvml.driver_version, self.nvml.cuda_version
        return {
            **host_identity(),
            "driver_version": driver,
            "cuda_version": cuda,
            "source": source,
            "note": self.note(),
            "gpus": gpus,
        }

    def telemetry(self) -> dict:
        source = self.source
        if source == "simulator":
            gpus = self.simulated.gpus(self.supervisor.simulator_engines())
        else:
            gpus = self.nvml.gpus()
        return {
            "time": time.time(),
            "source": source,
            "note": self.note(),
            "gpus": gpus,
            "host": host_readings(),
            "engines": self.supervisor.engine_readings(process_affinity),
        }


def lines_param(query: dict) -> int:
    raw = query.get("lines", ["200"])[-1]
    try:
        value = int(raw)
    except ValueError:
        raise AgentError("lines must be an integer") from None
    return max(0, min(value, MAX_LOG_LINES))


class Handler(BaseHTTPRequestHandler):
    """One request. Authentication comes before routing, so an unauthenticated caller learns
    nothing, not even which engines exist."""

    server_version = f"hosts-agent/{AGENT_VERSION}"
    protocol_version = "HTTP/1.1"
    timeout = 60  # a stalled client must not hold a thread for ever

    ROUTES = [
        ("GET", re.compile(r"/v1/info"), "info"),
        ("GET", re.compile(r"/v1/inventory"), "inventory"),
        ("GET", re.compile(r"/v1/telemetry"), "telemetry"),
        ("GET", re.compile(r"/v1/engines"), "engines"),
        ("GET", re.compile(rf"/v1/engines/{NAME}"), "status"),
        ("POST", re.compile(rf"/v1/engines/{NAME}/apply"), "apply"),
        ("POST", re.compile(rf"/v1/engines/{NAME}/restart"), "restart"),
        ("POST", re.compile(rf"/v1/engines/{NAME}/stop"), "stop"),
        ("GET", re.compile(rf"/v1/engines/{NAME}/logs"), "logs"),
        ("GET", re.compile(r"/v1/operations/(?P<op>[0-9a-f]{1,64})"), "operation"),
    ]

    @property
    def agent(self) -> Agent:
        return self.server.agent

    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        # The request line and status only: headers (the token) are never logged.
        log.info("%s %s", self.address_string(), format % args)

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        if not self._authorized():
            # The body stays unread (nothing of an unauthenticated caller is parsed), so the
            # connection cannot be reused.
            self.close_connection = True
            return self._send(
                401,
                {"error": "missing or wrong bearer token"},
                {"WWW-Authenticate": 'Bearer realm="hosts-agent"', "Connection": "close"},
            )
        try:
            body = self._read_body()
        except AgentError as exc:
            self.close_connection = True
            return self._send(exc.status, {"error": str(exc)}, {"Connection": "close"})
        url = urlsplit(self.path)
        path = url.path.rstrip("/") or "/"
        allowed = []
        for route_method, pattern, action in self.ROUTES:
            match = pattern.fullmatch(path)
            if not match:
                continue
            if route_method != method:
                allowed.append(route_method)
                continue
            try:
                status, payload = getattr(self, f"_{action}")(
                    body=body, query=parse_qs(url.query), **match.groupdict()
                )
            except AgentError as exc:
                payload = {"error": str(exc)}
                if exc.errors:
                    payload["errors"] = exc.errors
                return self._send(exc.status, payload)
            except Exception:  # noqa: BLE001 - answer 500 rather than drop the connection
                log.exception("%s %s failed", method, path)
                return self._send(500, {"error": "internal error in the agent (see its log)"})
            return self._send(status, payload)
        if allowed:
            return self._send(405, {"error": f"use {' or '.join(allowed)}"}, {"Allow": allowed[0]})
        return self._send(404, {"error": f"no endpoint {path}"})

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization", "")
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer" or not presented:
            return False
        return hmac.compare_digest(presented.strip().encode(), self.server.token.encode())

    def _read_body(self):
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raise AgentError("send the body with a Content-Length")
        if not length:
            return None
        try:
            size = int(length)
        except ValueError:
            raise AgentError("bad Content-Length") from None
        if size > MAX_BODY:
            err = AgentError(f"the body is larger than {MAX_BODY} bytes")
            err.status = 413
            raise err
        raw = self.rfile.read(size)
        if not raw:
            return None
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            # Judged by the action: GETs ignore bodies, POSTs answer 400.
            return _BadJson()

    def _send(self, status: int, payload: dict, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status, HTTPStatus(status).phrase)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    # -- actions --------------------------------------------------------------------------

    @staticmethod
    def _json_object(body) -> dict:
        if isinstance(body, _BadJson):
            raise AgentError("the body is not valid JSON")
        if body is None:
            return {}
        if not isinstance(body, dict):
            raise AgentError("the body must be a JSON object")
        return body

    @staticmethod
    def _name(name: str) -> str:
        if not ENGINE_NAME.fullmatch(name):
            raise NotFound(f"no engine named {name!r} (names are [a-z0-9][a-z0-9-]{{0,62}})")
        return name

    def _info(self, **_):
        return 200, self.agent.info()

    def _inventory(self, **_):
        return 200, self.agent.inventory()

    def _telemetry(self, **_):
        return 200, self.agent.telemetry()

    def _engines(self, **_):
        return 200, {"engines": self.agent.supervisor.statuses()}

    def _status(self, name, **_):
        return 200, self.agent.supervisor.get(self._name(name)).status()

    def _apply(self, name, body, **_):
        body = self._json_object(body)
        if "config" not in body:
            raise AgentError('the body needs "config": a LaunchConfig as a JSON object')
        op = self.agent.supervisor.apply(name, body)
        return 202, {"operation": op.id}

    def _restart(self, name, body, **_):
        op = self.agent.supervisor.restart(self._name(name), self._json_object(body))
        return 202, {"operation": op.id}

    def _stop(self, name, **_):
        return 200, self.agent.supervisor.stop(self._name(name))

    def _logs(self, name, query, **_):
        lines = lines_param(query)
        return 200, {"lines": self.agent.supervisor.logs(self._name(name), lines)}

    def _operation(self, op, **_):
        return 200, self.agent.supervisor.operation(op).to_dict()


class _BadJson:
    """Marks a body that did not parse."""


class AgentServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address, agent: Agent, token: str, tls: ssl.SSLContext | None = None):
        host = address[0]
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.agent = agent
        self.token = token
        super().__init__(address, Handler)
        if tls is not None:
            # The handshake happens in the request's thread on first read, so one slow
            # client cannot stall the accept loop.
            self.socket = tls.wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False
            )

    def handle_error(self, request, client_address):
        # TLS handshake failures and clients hanging up are routine; log them in one line.
        exc = sys.exc_info()[1]
        log.info("connection from %s ended: %s", client_address[0], exc)


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


def cleartext_refusal(host: str, tls: bool, insecure_http: bool) -> str | None:
    """Why the agent must not serve on ``host`` as asked, or None: plain HTTP would put the
    bearer token and every engine setting on the network in clear."""
    if tls or insecure_http or is_loopback(host):
        return None
    return (
        f"--listen {host} is reachable from other machines: serve HTTPS (--tls-cert/--tls-key; "
        "the panel pins the certificate) or, on a closed test network only, pass --insecure-http"
    )


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[v6]:PORT`` or ``:PORT`` (all interfaces)."""
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = value, str(DEFAULT_PORT)
    host = host.strip("[]") or "0.0.0.0"  # noqa: S104 - the operator asked for all interfaces
    try:
        number = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad port in {value!r}") from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range in {value!r}")
    return host, number


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hosts.agent",
        description="Host agent: GPU telemetry and engine supervision behind a token.",
    )
    parser.add_argument(
        "--listen",
        type=parse_listen,
        default=("127.0.0.1", DEFAULT_PORT),
        metavar="HOST:PORT",
        help=f"address to serve on (default 127.0.0.1:{DEFAULT_PORT}; port 0 picks one)",
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        required=True,
        help="file holding the bearer token (must not be readable by every user)",
    )
    parser.add_argument("--tls-cert", help="PEM certificate (chain) to serve HTTPS with")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    parser.add_argument(
        "--insecure-http",
        action="store_true",
        help="serve plain HTTP on a non-loopback address (the token and engine settings cross "
        "the network readable; only for a closed test network)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        help="where engine configs are kept across restarts (default: a fresh temp dir)",
    )
    parser.add_argument(
        "--allow-exec",
        action="append",
        metavar="PROGRAM",
        help="program allowed to run as an engine, optionally with required leading args "
        "('python3 -m sglang.launch_server'); repeatable; replaces the default list "
        "(vllm, python -m sglang.launch_server, this python -m hosts.simulator)",
    )
    parser.add_argument(
        "--allow-code-loading",
        action="store_true",
        help="let engines run flags that load code the panel never saw (--trust-remote-code); "
        "refused by default, whatever the panel sends",
    )
    parser.add_argument(
        "--simulate",
        metavar="GPU[:COUNT]",
        help="report simulated GPUs of this catalog model (e.g. h100-sxm:2)",
    )
    parser.add_argument(
        "--stop-engines-on-exit",
        action="store_true",
        help="stop the engines when the agent exits (SIGTERM, SIGINT): for an agent that owns "
        "its engines' lifetime (the demo fleet). By default they keep running and the next "
        "agent adopts them: `systemctl restart` and upgrades send SIGTERM, and an engine "
        "stops only when the panel asks",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # httpx logs every request at INFO: the readiness polls would drown the agent's own log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together")
    if args.simulate:
        try:
            parse_simulate(args.simulate)
        except ValueError as exc:
            parser.error(f"--simulate: {exc}")
    try:
        token = read_token(args.token_file)
    except TokenFileError as exc:
        print(f"agent: {exc}", file=sys.stderr)
        return 2
    try:
        policy = ExecPolicy(args.allow_exec, allow_code_loading=args.allow_code_loading)
    except ValueError as exc:
        parser.error(f"--allow-exec: {exc}")
    refusal = cleartext_refusal(args.listen[0], bool(args.tls_cert), args.insecure_http)
    if refusal:
        parser.error(refusal)
    tls = None
    if args.tls_cert:
        try:
            tls = tls_context(args.tls_cert, args.tls_key)
        except (OSError, ssl.SSLError) as exc:
            print(f"agent: cannot load the TLS certificate/key: {exc}", file=sys.stderr)
            return 2
    if args.state_dir is None:
        state_dir = Path(tempfile.mkdtemp(prefix="hosts-agent-"))
        log.warning("no --state-dir: engine configs live in %s and are lost on reboot", state_dir)
    else:
        state_dir = args.state_dir
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    host, port = args.listen
    try:
        # Bind first, so the supervisor can keep engines off the agent's own port.
        server = AgentServer((host, port), None, token, tls)
    except OSError as exc:
        print(f"agent: cannot listen on {host}:{port}: {exc.strerror}", file=sys.stderr)
        return 2
    real_port = server.server_address[1]
    supervisor = Supervisor(state_dir, policy, reserved_ports=(real_port,))
    # The seed keeps simulated GPU UUIDs stable for one host across restarts and distinct
    # between the demo's hosts, which share a machine but not an address.
    agent = server.agent = Agent(supervisor, simulate=args.simulate, simulate_seed=f"{host}:{port}")
    supervisor.gpu_count = agent.gpu_count

    def shut_down(signum, frame):
        log.info(
            "signal %d: stopping the server%s",
            signum,
            " and the engines" if args.stop_engines_on_exit else " (the engines keep running)",
        )
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shut_down)
    signal.signal(signal.SIGINT, shut_down)
    shown = f"[{host}]" if ":" in host else host
    print(f"agent listening on {shown}:{real_port}", flush=True)
    log.info(
        "serving %s on %s:%d; telemetry: %s",
        "HTTPS" if tls else "HTTP",
        host,
        real_port,
        server.agent.note(),
    )
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        if args.stop_engines_on_exit:
            supervisor.shutdown()
        else:
            supervisor.detach()
        server.server_close()
        server.agent.nvml.close()
        log.info("stopped")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
