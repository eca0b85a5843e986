"""``python -m benchmarks.quality``: check, run against a real local server, compare."""

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from benchmarks.quality.builtin import builtin_set
from benchmarks.quality.items import prompt_text

ROOT = Path(__file__).resolve().parents[3]


def cli(*args, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.quality", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_check_reports_bad_lines_with_numbers_and_exits_2(tmp_path):
    good = json.dumps(builtin_set("format")[0].to_dict(), ensure_ascii=False)
    path = tmp_path / "set.jsonl"
    path.write_text(good + "\n{oops\n" + good + "\n", "utf-8")
    out = cli("check", str(path))
    assert out.returncode == 2
    assert f"{path}:2: bad JSON" in out.stdout
    assert "duplicate id" in out.stdout and f"{path}:3:" in out.stdout
    path.write_text(good + "\n", "utf-8")
    assert cli("check", str(path)).returncode == 0


@pytest.mark.parametrize(
    "args",
    [
        ("check", "/nonexistent.jsonl"),
        ("run", "--base-url", "http://127.0.0.1:9", "--model", "m", "--set", "nope"),
        ("compare", "/nonexistent-a.json", "/nonexistent-b.json"),
        ("frobnicate",),
    ],
)
def test_bad_input_exits_2_with_one_line(args):
    out = cli(*args)
    assert out.returncode == 2
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1


@pytest.fixture
def engine():
    """A real HTTP server that answers each built-in item with its reference (or its wrong)."""
    quick = builtin_set("panel-quick")
    table = {prompt_text(i): i.reference for i in quick}
    state = {"wrong": set()}
    wrong_of = {prompt_text(i): i.wrong for i in quick}

    async def chat(request: Request):
        body = await request.json()
        text = body["messages"][-1]["content"]
        answer = wrong_of[text] if text in state["wrong"] else table.get(text, "?")
        return JSONResponse({"choices": [{"message": {"content": answer}}], "usage": {}})

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}", state, quick
    server.should_exit = True
    thread.join(10)
    sock.close()


def test_run_then_compare(engine, tmp_path):
    url, state, quick = engine
    base = tmp_path / "base.json"
    out = cli("run", "--base-url", url, "--model", "m", "--set", "panel-quick", "--json", str(base))
    assert out.returncode == 0, out.stderr
    assert "math           ko" in out.stdout and "100.0%" in out.stdout
    # The candidate gives the wrong answer to every Korean maths problem.
    state["wrong"] = {prompt_text(i) for i in quick if i.category == "math" and i.language == "ko"}
    cand = tmp_path / "cand.json"
    out = cli(
        "run",
        "--base-url",
        url,
        "--model",
        "m",
        "--set",
        "panel-quick",
        "--structured-output",
        "--json",
        str(cand),
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(cand.read_text())["structured_output"] is True

    out = cli("compare", str(base), str(cand))
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines() if line.strip()}
    assert lines["math/ko"].endswith("loss") and not lines["math/ko"].endswith("no loss")
    assert lines["category:format"].endswith("cannot tell")
    assert "verdict: loss" in out.stdout
    assert "lost: math-ko-001 (math/ko)" in out.stdout

    same = cli("compare", str(base), str(base), "--json")
    data = json.loads(same.stdout)
    assert data["verdict"] == "no loss" and data["changed"] == []
