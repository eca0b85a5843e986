"""The fleet poll's HTTP client (hosts.services.telemetry_loop, aiohttp): the same answers and
errors as the agent transport, the token sent only to the address it was stored for (no
redirect followed, the token of each request its own host's), NaN read as null, kept-alive
connections reused. Against tiny HTTP servers on the loopback, no Django database needed."""

import asyncio
import queue
import socket
import threading

import pytest

from hosts.services import telemetry_loop
from hosts.transport.agent import AgentTransport, decode
from hosts.transport.base import AuthError, TransportError


class Server:
    """An HTTP/1.1 server on a free port in a loop of its own that answers every request with
    ``answer(path, headers) -> (status, extra header lines, body)``, or never (None); records
    each request's headers and counts connections."""

    def __init__(self, answer):
        self.answer, self.seen, self.connections = answer, [], 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self.handle, "127.0.0.1", 0), self.loop
        ).result(10)
        self.port = self.server.sockets[0].getsockname()[1]

    async def handle(self, reader, writer):
        self.connections += 1
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in head[1:] if line)
                }
                self.seen.append(headers)
                answered = self.answer(head[0].split(" ")[1], headers)
                if answered is None:
                    await asyncio.sleep(30)
                    return
                status, extra, body = answered
                writer.write(
                    f"HTTP/1.1 {status} X\r\n{extra}Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def stop(self):
        async def close():
            self.server.close()
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def servers():
    made = []
    yield lambda answer: made.append(Server(answer)) or made[-1]
    telemetry_loop.close_clients()
    for server in made:
        server.stop()


def fetch(*transports):
    answers = queue.Queue()
    telemetry_loop.fetch_agents([(n, t) for n, t in enumerate(transports)], answers)
    return dict(answers.get_nowait() for _ in transports)


def ok(body=b'{"time": 1.0, "gpus": []}'):
    return lambda path, headers: (200, "Content-Type: application/json\r\n", body)


def test_a_reading_is_the_agents_json_with_nan_and_infinity_as_null(servers):
    server = servers(ok(b'{"time": 1.0, "gpus": [{"power_w": NaN, "x": -Infinity}]}'))
    (reading,) = fetch(AgentTransport("127.0.0.1", server.port, "tok")).values()
    assert reading == {"time": 1.0, "gpus": [{"power_w": None, "x": None}]}
    assert server.seen[0]["authorization"] == "Bearer tok"
    assert decode(b'{"a": Infinity}') == {"a": None}  # the transport's own parser, the same


def test_nul_characters_from_an_agent_are_dropped_before_anything_stores_them():
    # Valid JSON, but PostgreSQL takes a NUL in neither text nor jsonb: one such string failed
    # the whole batch of hosts it was polled with.
    body = b'{"note": "a\\u0000b", "gpus": [{"name": "H\\u0000100"}], "k\\u0000": 1}'
    assert decode(body) == {"note": "ab", "gpus": [{"name": "H100"}], "k": 1}
    assert decode(body.decode()) == decode(body)
    # An escaped backslash before "u0000" is text, not a NUL: kept as it is.
    assert decode(b'{"note": "\\\\u0000"}') == {"note": "\\u0000"}


def test_each_request_carries_its_own_hosts_token_on_kept_alive_connections(servers):
    server = servers(ok())
    fetch(AgentTransport("127.0.0.1", server.port, "first"))
    fetch(AgentTransport("127.0.0.1", server.port, "rotated"))
    assert [h["authorization"] for h in server.seen] == ["Bearer first", "Bearer rotated"]
    assert server.connections == 1  # the second poll reused the first one's connection


def test_a_redirect_is_not_followed_so_the_token_never_leaves_its_address(servers):
    elsewhere = servers(ok())
    server = servers(
        lambda path, headers: (
            302,
            f"Location: http://127.0.0.1:{elsewhere.port}/v1/telemetry\r\n",
            b"",
        )
    )
    (outcome,) = fetch(AgentTransport("127.0.0.1", server.port, "secret")).values()
    assert isinstance(outcome, TransportError) and "answered 302" in str(outcome)
    assert elsewhere.seen == []


def test_errors_are_the_agent_transports(servers):
    refused = servers(lambda path, headers: (401, "", b'{"error": "no"}'))
    html = servers(lambda path, headers: (200, "", b"<html>not an agent</html>"))
    silent = servers(lambda path, headers: None)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nobody = closed.getsockname()[1]  # a port no one listens on once closed
    outcomes = fetch(
        AgentTransport("127.0.0.1", refused.port, "t"),
        AgentTransport("127.0.0.1", html.port, "t"),
        AgentTransport("127.0.0.1", silent.port, "t", timeout=0.3),
        AgentTransport("127.0.0.1", nobody, "t"),
    )
    assert isinstance(outcomes[0], AuthError) and "refused the token" in str(outcomes[0])
    assert isinstance(outcomes[1], TransportError)
    assert "answered 200: '<html>not an agent</html>'" in str(outcomes[1])
    assert isinstance(outcomes[2], TransportError)
    assert f"127.0.0.1:{silent.port} did not answer within 0.3 s" in str(outcomes[2])
    assert isinstance(outcomes[3], TransportError)
    assert f"cannot reach the agent at 127.0.0.1:{nobody}" in str(outcomes[3])
