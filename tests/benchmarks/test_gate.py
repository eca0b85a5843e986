"""The CI gate against a fake panel (httpx.MockTransport): each exit code and what it says."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys

import httpx
import pytest

from benchmarks import gate

TOKEN = "llmp_secret-token-value"


class FakePanel:
    """The runs, deployments and profiles API as the panel answers it, in memory. A started
    run finishes after ``polls`` polls with ``final`` status; the verdict is ``outcome``."""

    def __init__(self):
        self.deployments = [
            {"id": 1, "name": "llama-8b", "host": 1, "host_name": "sim-h100-01"},
            {"id": 2, "name": "qwen", "host": 1, "host_name": "sim-h100-01"},
            {"id": 3, "name": "qwen", "host": 2, "host_name": "sim-a100-01"},
        ]
        self.profiles = [
            {"id": 11, "name": "chat", "version": 2},
            {"id": 10, "name": "chat", "version": 1},
        ]
        self.runs = {
            5: self._run(5, "succeeded", deployment=1, profile=11),
            6: self._run(6, "failed", deployment=1, profile=11),
        }
        self.polls, self.final, self.outcome, self.busy = 2, "succeeded", "verified", False
        self.requests: list[httpx.Request] = []
        self.cancelled: list[int] = []
        self.down = False

    @staticmethod
    def _run(pk, status, *, deployment, profile, finished=True):
        return {
            "id": pk,
            "status": status,
            "finished": finished,
            "progress": 1.0 if finished else 0.0,
            "deployment": deployment,
            "profile": profile,
            "error": "the engine went away" if status == "failed" else "",
            "stopped_early": "",
            "results": {"p95_ttft_ms": 40.0} if finished else None,
            "links": {"page": f"/benchmarks/{pk}/"},
            "_polls": 0,
        }

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.down:
            raise httpx.ConnectError("connection refused")
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return problem(401, "Unknown, revoked or expired API token.")
        path, query = request.url.path.removeprefix("/api/v1/"), request.url.params
        if path == "deployments/":
            rows = [d for d in self.deployments if d["name"] == query.get("name")]
            if query.get("host"):
                rows = [d for d in rows if d["host_name"] == query["host"]]
            return page(rows)
        if path == "profiles/":
            return page([p for p in self.profiles if p["name"] == query.get("name")])
        if path == "runs/" and request.method == "GET":
            rows = [
                r
                for r in sorted(self.runs.values(), key=lambda r: -r["id"])
                if r["deployment"] == int(query["deployment"])
                and r["profile"] == int(query["profile"])
                and r["status"] == query["status"]
            ]
            return page(rows[: int(query.get("page_size", 50))])
        if path == "runs/" and request.method == "POST":
            if self.busy:
                return problem(409, "Benchmark #4 by ci is running: one benchmark at a time.")
            body = json.loads(request.content)
            pk = max(self.runs) + 1
            self.runs[pk] = self._run(
                pk, "queued", deployment=body["deployment"], profile=body["profile"], finished=False
            )
            return httpx.Response(201, json=public(self.runs[pk]))
        if m := re.fullmatch(r"runs/(\d+)/", path):
            run = self.runs.get(int(m[1]))
            if run is None:
                return problem(404, "Not found.")
            if not run["finished"]:
                run["_polls"] += 1
                run["status"], run["progress"] = "running", min(0.9, run["_polls"] / 10)
                if run["_polls"] >= self.polls and self.polls >= 0:
                    run.update(status=self.final, finished=True, progress=1.0)
                    run["error"] = "the engine went away" if self.final == "failed" else ""
                    run["results"] = {"p95_ttft_ms": 41.0}
            return httpx.Response(200, json=public(run))
        if m := re.fullmatch(r"runs/(\d+)/cancel/", path):
            self.cancelled.append(int(m[1]))
            return httpx.Response(200, json=public(self.runs[int(m[1])]))
        if m := re.fullmatch(r"runs/(\d+)/verdict/", path):
            return httpx.Response(200, json=self.verdict(dict(query)))
        return problem(404, "Not found.")

    def verdict(self, query) -> dict:
        ok = {"verified": True, "regressed": False, "inconclusive": None}[self.outcome]
        return {
            "outcome": self.outcome,
            "reason": {
                "verified": "",
                "regressed": "TTFT p95 40.0 → 80.0 ms (+100%) (limit +10%)",
                "inconclusive": "not judged: TTFT p95 (too few requests (5) for a p95)",
            }[self.outcome],
            "text": "within limits: TTFT p95 +2%" if ok else self.outcome,
            "checks": [
                {
                    "metric": "error_rate",
                    "label": "Error rate",
                    "baseline": 0.0,
                    "after": 0.0,
                    "change": 0.0,
                    "limit": "+0.5% points",
                    "ok": True,
                },
                {
                    "metric": "ttft_p95_ms",
                    "label": "TTFT p95",
                    "baseline": 40.0,
                    "after": 80.0 if ok is False else 41.0,
                    "change": 1.0 if ok is False else 0.025,
                    "limit": "+10%",
                    "ok": ok,
                },
            ],
            "conditions": [
                {
                    "key": "profile",
                    "label": "Load profile",
                    "baseline": "chat v2",
                    "after": "chat v2",
                },
                {
                    "key": "error_rate",
                    "label": "Error rate",
                    "percent": True,
                    "baseline": 0.0,
                    "after": 0.0,
                },
            ],
            "notes": [],
            "query": query,
        }


def page(rows):
    return httpx.Response(
        200, json={"count": len(rows), "next": None, "previous": None, "results": rows}
    )


def problem(status, detail):
    return httpx.Response(
        status,
        json={"type": "x", "title": "t", "status": status, "detail": detail, "errors": {}},
        headers={"Content-Type": "application/problem+json"},
    )


def public(run):
    return {k: v for k, v in run.items() if not k.startswith("_")}


@pytest.fixture
def fake():
    return FakePanel()


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


def run_gate(fake, token_file, *extra, result=None):
    args = [
        "--panel",
        "http://panel.test",
        "--token-file",
        str(token_file),
        "--deployment",
        "llama-8b",
        "--profile",
        "chat",
        "--poll",
        "0",
        *extra,
    ]
    if result:
        args += ["--result-filename", str(result)]
    out, err = io.StringIO(), io.StringIO()
    clock = iter(range(0, 10**6)).__next__
    code = gate.gate(
        gate.parse_args(args),
        transport=httpx.MockTransport(fake.handler),
        out=out,
        err=err,
        sleep=lambda s: None,
        clock=clock,
    )
    text = out.getvalue() + err.getvalue()
    assert TOKEN not in text, "the token must never be printed"
    return code, out.getvalue(), err.getvalue()


def test_verified_exits_0_with_the_table_and_saves_the_run_and_verdict(fake, token_file, tmp_path):
    result = tmp_path / "gate.json"
    code, out, err = run_gate(
        fake, token_file, "--max-regression", "ttft_p95=10%,error_rate=0.5pp", result=result
    )
    assert code == 0, out + err
    assert "verified: within limits" in out
    header = next(line for line in out.splitlines() if line.startswith("check"))
    assert header.split() == ["check", "baseline", "new", "change", "limit", "ok"]
    assert re.search(r"TTFT p95\s+40\.00\s+41\.00\s+\+2\.5%\s+\+10%\s+ok", out)
    assert "Load profile" in out and "chat v2" in out
    assert "baseline run 5" in err and "started run 7" in err and "run 7 running" in err
    saved = json.loads(result.read_text())
    assert saved["run"]["id"] == 7 and saved["run"]["results"] == {"p95_ttft_ms": 41.0}
    assert saved["verdict"]["outcome"] == "verified"
    # The thresholds reach the panel as its parameters, the baseline is the latest succeeded
    # run of the same deployment and profile version (v2, the newest), not the failed one.
    verdict_query = saved["verdict"]["query"]
    assert verdict_query == {"baseline": "5", "ttft_p95": "0.1", "error_rate": "0.005"}
    start = next(r for r in fake.requests if r.method == "POST")
    assert json.loads(start.content) == {"deployment": 1, "profile": 11, "label": "ci gate"}


def test_regressed_exits_1_and_says_why(fake, token_file):
    fake.outcome = "regressed"
    code, out, _ = run_gate(fake, token_file)
    assert code == 1
    assert "regressed: TTFT p95 40.0 → 80.0 ms (+100%)" in out
    assert "FAIL" in out and "within limits" not in out


def test_inconclusive_exits_1_unless_allowed_and_never_says_within_limits(fake, token_file):
    fake.outcome = "inconclusive"
    code, out, _ = run_gate(fake, token_file)
    assert code == 1
    assert "inconclusive: the runs cannot tell" in out and "too few requests" in out
    assert "verified" not in out
    code, out, _ = run_gate(fake, token_file, "--allow-inconclusive")
    assert code == 0 and "inconclusive" in out and "--allow-inconclusive" in out


@pytest.mark.parametrize(
    "setup, extra, message",
    [
        (lambda f: None, ["--deployment", "nope"], "no deployment named 'nope'"),
        (lambda f: None, ["--deployment", "qwen"], "2 deployments are named 'qwen'"),
        (lambda f: None, ["--profile", "rag"], "no load profile named 'rag'"),
        (lambda f: f.runs.pop(5), [], "no succeeded run of chat v2 on sim-h100-01/llama-8b"),
        (lambda f: None, ["--baseline", "99"], "there is no run 99"),
        (lambda f: None, ["--baseline", "6"], "baseline run 6 is failed"),
        (lambda f: None, ["--baseline", "x"], "'latest' or a run id"),
        (lambda f: setattr(f, "busy", True), [], "the engine is busy: Benchmark #4"),
        (lambda f: setattr(f, "final", "failed"), [], "run 7 failed: the engine went away"),
        (lambda f: setattr(f, "down", True), [], "cannot reach the panel at http://panel.test"),
        (lambda f: None, ["--max-regression", "ttft=10%"], "expected one of ttft_p95"),
        (lambda f: None, ["--max-regression", "ttft_p95=-5%"], "above zero"),
    ],
)
def test_could_not_run_exits_2_and_says_why(fake, token_file, setup, extra, message):
    setup(fake)
    code, out, err = run_gate(fake, token_file, *extra)
    assert code == 2, out + err
    assert message in err
    assert "verified" not in out and "regressed" not in out


def test_a_qualified_deployment_name_picks_the_host(fake, token_file):
    fake.runs[5]["deployment"] = 3
    code, _, err = run_gate(fake, token_file, "--deployment", "sim-a100-01/qwen")
    assert code == 0, err
    query = next(r for r in fake.requests if r.url.path.endswith("/deployments/")).url.params
    assert dict(query) == {"name": "qwen", "host": "sim-a100-01"}


def test_a_bad_token_says_so_and_is_never_shown(fake, token_file):
    token_file.write_text("llmp_wrong\n")
    code, out, err = run_gate(fake, token_file)
    assert code == 2 and "refused the API token" in err and "llmp_wrong" not in out + err


@pytest.mark.parametrize("content", ["", "two words\n"])
def test_an_empty_or_odd_token_file_is_refused(fake, token_file, content):
    token_file.write_text(content)
    code, _, err = run_gate(fake, token_file)
    assert code == 2 and "one token on one line" in err
    assert fake.requests == []


def test_a_missing_token_file_is_refused_without_echoing_its_name(fake, tmp_path):
    code, _, err = run_gate(fake, tmp_path / "llmp_pasted-a-token-here")
    assert code == 2 and "cannot read the token file" in err
    assert "llmp_pasted" not in err  # a token given where its file belongs stays unprinted


def test_a_run_past_the_timeout_is_cancelled_and_exits_2(fake, token_file):
    fake.polls = -1  # never finishes
    code, _, err = run_gate(fake, token_file, "--timeout", "5")
    assert code == 2 and "did not finish within 5 s: cancelled it" in err
    assert fake.cancelled == [7]


def test_parse_thresholds():
    assert gate.parse_thresholds("ttft_p95=10%, itl_p95=0.2,error_rate=0.5pp") == pytest.approx(
        {"ttft_p95": 0.1, "itl_p95": 0.2, "error_rate": 0.005}
    )
    assert gate.parse_thresholds("") == {}
    for bad in ("ttft_p95", "ttft_p95=fast", "ttft_p95=nan", "error_rate=0", "p99=1%"):
        with pytest.raises(ValueError):
            gate.parse_thresholds(bad)


def test_the_token_is_not_an_option_and_the_module_imports_no_django():
    with pytest.raises(SystemExit):
        gate.parse_args(["--panel", "x", "--token", "t", "--deployment", "d", "--profile", "p"])
    code = "import sys, benchmarks.gate; print('django' in sys.modules)"
    answer = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert answer.stdout.strip() == "False", answer.stderr
