"""A CI gate on the panel's API: run a benchmark, compare it with a baseline by the panel's own
verdict (the rule a change's verification uses), and exit 0 / 1 / 2.

    python -m benchmarks.gate --panel https://panel.example --token-file ~/.panel-token \\
        --deployment gpu-01/llama-8b --profile chat \\
        [--baseline latest|RUN_ID] [--max-regression ttft_p95=10%,itl_p95=10%,error_rate=0.5pp] \\
        [--label L] [--result-filename F] [--timeout S] [--poll S] [--allow-inconclusive]

Exit 0: verified (every check judged and within its limit; or inconclusive with
``--allow-inconclusive``). Exit 1: regressed, or inconclusive (the runs cannot tell, which is
never "within limits"). Exit 2: could not run (bad token, unknown deployment or profile, a
busy engine, a failed run, the time-out, the network).

Pure (no Django): it speaks HTTP to ``/api/v1/`` with httpx. The token is read from a file
only (a command line shows in ``ps`` and CI logs) and is never printed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from hosts.transport.tls import system_trust

EXIT_OK, EXIT_REGRESSED, EXIT_COULD_NOT_RUN = 0, 1, 2
# --max-regression names → the verdict endpoint's query parameters.
THRESHOLDS = ("ttft_p95", "itl_p95", "error_rate")
DEFAULT_TIMEOUT_S = 1800.0
DEFAULT_POLL_S = 2.0
# Polls that may fail in a row (a panel restarting, a network blip) before the gate gives up.
POLL_RETRIES = 5


class GateError(Exception):
    """The gate could not get an answer; the message says why (exit 2)."""


@dataclass
class Outcome:
    """What the gate decided and what it prints and saves."""

    code: int
    lines: list[str] = field(default_factory=list)


def parse_thresholds(text: str) -> dict[str, float]:
    """``ttft_p95=10%,itl_p95=0.1,error_rate=0.5pp`` → ``{"ttft_p95": 0.1, "itl_p95": 0.1,
    "error_rate": 0.005}``. Latencies are relative (``%`` or a fraction), the error rate in
    percentage points (``pp``, ``%`` or a fraction). The panel checks the range."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        name, value = name.strip(), value.strip().lower()
        if not sep or name not in THRESHOLDS:
            raise ValueError(f"{part!r}: expected one of {', '.join(THRESHOLDS)} as NAME=VALUE")
        scale = 1.0
        for suffix in ("pp", "%"):
            if value.endswith(suffix):
                value, scale = value.removesuffix(suffix).strip(), 0.01
                break
        try:
            number = float(value) * scale
        except ValueError:
            raise ValueError(f"{part!r}: {value!r} is not a number") from None
        if not math.isfinite(number) or number <= 0:
            raise ValueError(f"{part!r}: a limit must be above zero")
        out[name] = number
    return out


class Panel:
    """The panel's ``/api/v1/``, answering JSON or raising ``GateError`` with the panel's
    own words (its problem details)."""

    def __init__(self, url: str, token: str, *, transport: httpx.BaseTransport | None = None):
        self.url = url.rstrip("/")
        self.client = httpx.Client(
            base_url=self.url + "/api/v1/",
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=30.0,
            transport=transport,
            follow_redirects=False,
            verify=system_trust(),
        )

    def close(self) -> None:
        self.client.close()

    def call(self, method: str, path: str, **kw) -> tuple[int, dict]:
        try:
            answer = self.client.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise GateError(f"cannot reach the panel at {self.url}: {exc}") from None
        try:
            body = answer.json()
        except ValueError:
            body = {}
        if answer.status_code == 401:
            raise GateError(
                "the panel refused the API token (unknown, revoked or expired): make a new one "
                "on the panel's API tokens page or with `manage.py create_api_token`"
            )
        if answer.status_code == 403:
            raise GateError(
                f"the token's user may not {method} {path}: "
                f"{_detail(body, 'not allowed')} (starting runs needs the Operator role)"
            )
        if answer.status_code == 429:
            raise GateError(f"the panel throttled this address: {_detail(body, 'too many')}")
        if answer.status_code >= 500:
            raise GateError(f"the panel failed on {method} {path} (HTTP {answer.status_code})")
        if not isinstance(body, dict):
            raise GateError(f"the panel answered {method} {path} with something not JSON")
        return answer.status_code, body

    def get(self, path: str, **params) -> dict:
        status, body = self.call("GET", path, params=params or None)
        if status != 200:
            raise GateError(f"GET {path}: {_detail(body, f'HTTP {status}')}")
        return body


def _detail(body: dict, default: str) -> str:
    return str(body.get("detail") or default) if isinstance(body, dict) else default


def resolve_deployment(panel: Panel, name: str) -> dict:
    """The deployment named ``NAME`` or ``HOST/NAME``; a name on several hosts must say
    which."""
    host, _, bare = name.rpartition("/")
    params = {"name": bare, **({"host": host} if host else {})}
    found = panel.get("deployments/", **params).get("results") or []
    found = [d for d in found if d.get("name") == bare and (not host or d.get("host_name") == host)]
    if not found:
        raise GateError(f"no deployment named {name!r} on the panel")
    if len(found) > 1:
        where = ", ".join(f"{d.get('host_name')}/{d.get('name')}" for d in found)
        raise GateError(f"{len(found)} deployments are named {bare!r} ({where}): say HOST/NAME")
    return found[0]


def resolve_profile(panel: Panel, name: str) -> dict:
    """The newest version of the load profile ``name``."""
    found = panel.get("profiles/", name=name).get("results") or []
    found = [p for p in found if p.get("name") == name]
    if not found:
        raise GateError(f"no load profile named {name!r} on the panel")
    return max(found, key=lambda p: p.get("version") or 0)


# How many of the newest succeeded runs ``latest`` looks through for one that is not
# client-limited.
BASELINE_CANDIDATES = 20


def client_limited(run: dict) -> str | None:
    """The panel's refusal of ``run`` as evidence (its ``client_limited`` field, the rule of
    ``benchmarks.evidence``) in words, or None when it may be used (or was not checked)."""
    verdict = run.get("client_limited") or {}
    if not verdict.get("limited"):
        return None
    return "client-limited: " + "; ".join(verdict.get("reasons") or ["no reason given"])


def find_baseline(panel: Panel, choice: str, deployment: dict, profile: dict) -> dict:
    """``latest``: the newest succeeded run of this deployment and this profile version
    (looked up before the new run starts, so never that run) that is not client-limited; else
    the run with that id, refused when it is client-limited."""
    if choice == "latest":
        runs = panel.get(
            "runs/",
            deployment=deployment["id"],
            profile=profile["id"],
            status="succeeded",
            ordering="-date",
            page_size=BASELINE_CANDIDATES,
        ).get("results")
        if not runs:
            raise GateError(
                f"no succeeded run of {profile['name']} v{profile['version']} on "
                f"{deployment.get('host_name')}/{deployment['name']} to compare with: run the "
                "gate's profile once on a known-good config (or pass --baseline RUN_ID)"
            )
        usable = [run for run in runs if client_limited(run) is None]
        if not usable:
            raise GateError(
                f"no usable baseline: the newest succeeded run {runs[0]['id']} is "
                f"{client_limited(runs[0])} (and so are the {len(runs) - 1} before it); "
                "measure a baseline where the load generator keeps up"
            )
        return usable[0]
    if not choice.isdigit():
        raise GateError(f"--baseline must be 'latest' or a run id, not {choice!r}")
    status, body = panel.call("GET", f"runs/{int(choice)}/")
    if status == 404:
        raise GateError(f"there is no run {choice} to use as the baseline")
    if status != 200:
        raise GateError(f"baseline run {choice}: {_detail(body, f'HTTP {status}')}")
    if body.get("status") != "succeeded":
        raise GateError(f"baseline run {choice} is {body.get('status')}: it cannot be a baseline")
    if refusal := client_limited(body):
        raise GateError(f"baseline run {choice} is {refusal}: it cannot be a baseline")
    return body


def start_run(panel: Panel, deployment: dict, profile: dict, label: str) -> dict:
    body = {"deployment": deployment["id"], "profile": profile["id"], "label": label}
    status, answer = panel.call("POST", "runs/", json=body)
    if status == 409:
        raise GateError(f"the engine is busy: {_detail(answer, 'conflict')}")
    if status != 201:
        raise GateError(f"the run could not start: {_detail(answer, f'HTTP {status}')}")
    return answer


class Waiter:
    """Polls the run until it finishes, showing its progress; past ``timeout`` it cancels
    the run."""

    def __init__(self, panel, err, *, timeout: float, poll: float, sleep, clock):
        self.panel, self.err = panel, err
        self.timeout, self.poll, self.sleep, self.clock = timeout, poll, sleep, clock

    def wait(self, run: dict) -> dict:
        deadline = self.clock() + self.timeout
        failures, shown = 0, None
        while not run.get("finished"):
            if self.clock() >= deadline:
                self._cancel(run)
                raise GateError(
                    f"run {run['id']} did not finish within {self.timeout:.0f} s: cancelled it"
                )
            self.sleep(self.poll)
            try:
                run = self.panel.get(f"runs/{run['id']}/")
                failures = 0
            except GateError as exc:
                failures += 1
                if failures > POLL_RETRIES:
                    raise
                print(f"gate: {exc} (retrying)", file=self.err)
                continue
            now = (run.get("status"), round(100 * (run.get("progress") or 0)))
            if now != shown:
                shown = now
                print(f"gate: run {run['id']} {now[0]} {now[1]}%", file=self.err, flush=True)
        return run

    def _cancel(self, run: dict) -> None:
        try:
            self.panel.call("POST", f"runs/{run['id']}/cancel/")
        except GateError as exc:
            print(f"gate: could not cancel run {run['id']}: {exc}", file=self.err)


def _cell(value, percent: bool = False) -> str:
    if value is None:
        return "—"
    if percent:
        return f"{value:.2%}"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _change(check: dict) -> str:
    change = check.get("change")
    if change is None:
        return "—"
    if check.get("metric") == "error_rate":
        return f"{change * 100:+.2f} pp"
    return f"{change:+.1%}"


def report(verdict: dict, baseline: dict, run: dict) -> list[str]:
    """The comparison table (check, baseline, new, change, limit, ok) and the conditions."""
    rows = [("check", "baseline", "new", "change", "limit", "ok")]
    for check in verdict.get("checks") or []:
        percent = check.get("metric") == "error_rate"
        ok = {True: "ok", False: "FAIL", None: "?"}[check.get("ok")]
        if check.get("note"):
            ok += f" ({check['note']})"
        rows.append(
            (
                check.get("label", check.get("metric", "")),
                _cell(check.get("baseline"), percent),
                _cell(check.get("after"), percent),
                _change(check),
                str(check.get("limit", "")),
                ok,
            )
        )
    lines = [f"baseline: run {baseline['id']}   new: run {run['id']}", *_table(rows)]
    conditions = [("condition", "baseline", "new")] + [
        (
            c.get("label", c.get("key", "")),
            _cell(c.get("baseline"), bool(c.get("percent"))),
            _cell(c.get("after"), bool(c.get("percent"))),
        )
        for c in verdict.get("conditions") or []
    ]
    lines += ["", *_table(conditions)]
    lines += [f"note: {note}" for note in verdict.get("notes") or []]
    return lines


def _table(rows: list[tuple]) -> list[str]:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def decide(verdict: dict, allow_inconclusive: bool) -> Outcome:
    """The exit code and its line: never "within limits" on evidence that cannot tell."""
    outcome, reason = verdict.get("outcome"), verdict.get("reason") or ""
    if outcome == "verified":
        return Outcome(EXIT_OK, [f"verified: {verdict.get('text') or 'within limits'}"])
    if outcome == "regressed":
        return Outcome(EXIT_REGRESSED, [f"regressed: {reason}"])
    if outcome == "inconclusive":
        line = f"inconclusive: the runs cannot tell whether this is within limits: {reason}"
        if allow_inconclusive:
            return Outcome(EXIT_OK, [line, "passing anyway (--allow-inconclusive)"])
        return Outcome(EXIT_REGRESSED, [line, "failing (pass --allow-inconclusive to accept)"])
    raise GateError(f"the panel gave no verdict (outcome {outcome!r})")


def gate(args, *, transport=None, out=sys.stdout, err=sys.stderr, sleep=time.sleep, clock=None):
    """Run the gate; returns the exit code (``GateError`` → 2, said on stderr)."""
    try:
        token = read_token(args.token_file)
        thresholds = parse_thresholds(args.max_regression or "")
    except (GateError, ValueError) as exc:
        print(f"gate: {exc}", file=err)
        return EXIT_COULD_NOT_RUN
    panel = Panel(args.panel, token, transport=transport)
    try:
        return _run(panel, args, thresholds, out, err, sleep, clock or time.monotonic)
    except GateError as exc:
        print(f"gate: could not run: {exc}", file=err)
        return EXIT_COULD_NOT_RUN
    finally:
        panel.close()


def _run(panel, args, thresholds, out, err, sleep, clock) -> int:
    deployment = resolve_deployment(panel, args.deployment)
    profile = resolve_profile(panel, args.profile)
    baseline = find_baseline(panel, args.baseline, deployment, profile)
    where = f"{deployment.get('host_name')}/{deployment['name']}"
    print(
        f"gate: {profile['name']} v{profile['version']} on {where}, baseline run {baseline['id']}",
        file=err,
    )
    run = start_run(panel, deployment, profile, args.label)
    print(f"gate: started run {run['id']}: {panel.url}{run['links']['page']}", file=err)
    waiter = Waiter(panel, err, timeout=args.timeout, poll=args.poll, sleep=sleep, clock=clock)
    run = waiter.wait(run)
    if run.get("status") != "succeeded":
        why = run.get("error") or run.get("stopped_early") or "no reason given"
        _save(args.result_filename, run, None)
        raise GateError(f"run {run['id']} {run.get('status')}: {why}")
    if refusal := client_limited(run):
        # Its numbers are the load generator's: neither a pass nor a regression, whatever
        # --allow-inconclusive says.
        _save(args.result_filename, run, None)
        raise GateError(
            f"run {run['id']} is {refusal}: it cannot be judged; run the gate where the load "
            "generator keeps up (a quieter runner, or a sharded run)"
        )
    verdict = panel.get(f"runs/{run['id']}/verdict/", baseline=baseline["id"], **thresholds)
    _save(args.result_filename, run, verdict)
    decided = decide(verdict, args.allow_inconclusive)
    for line in report(verdict, baseline, run) + [""] + decided.lines:
        print(line, file=out)
    return decided.code


def _save(filename: str | None, run: dict, verdict: dict | None) -> None:
    if filename:
        document = {"run": run, "verdict": verdict}
        Path(filename).write_text(json.dumps(document, indent=1) + "\n")


def read_token(path: str) -> str:
    try:
        token = Path(path).expanduser().read_text().strip()
    except OSError as exc:
        # Not its name: a token pasted where its file belongs must not reach a CI log.
        raise GateError(f"cannot read the token file (--token-file): {exc.strerror}") from None
    if not token or len(token.split()) != 1:
        raise GateError("the token file must hold one token on one line")
    return token


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.gate",
        # "--token SECRET" must not pass as an abbreviation of --token-file.
        allow_abbrev=False,
        description="Run a benchmark through the panel's API and gate on its verdict "
        "against a baseline: exit 0 verified, 1 regressed or inconclusive, 2 could not run.",
    )
    p.add_argument("--panel", required=True, help="the panel's URL, e.g. https://panel:8000")
    p.add_argument("--token-file", required=True, help="a file holding an API token")
    p.add_argument("--deployment", required=True, help="NAME or HOST/NAME")
    p.add_argument("--profile", required=True, help="load profile name (its newest version)")
    p.add_argument("--baseline", default="latest", help="'latest' (default) or a run id")
    p.add_argument(
        "--max-regression",
        default="",
        metavar="LIMITS",
        help="e.g. ttft_p95=10%%,itl_p95=10%%,error_rate=0.5pp (unset: the panel's defaults "
        "for a change, 20 %%, 20 %%, 1 pp)",
    )
    p.add_argument("--label", default="ci gate", help="the new run's label")
    p.add_argument("--result-filename", help="write the run's detail and the verdict here")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds")
    p.add_argument("--poll", type=float, default=DEFAULT_POLL_S, help="seconds between polls")
    p.add_argument(
        "--allow-inconclusive",
        action="store_true",
        help="exit 0 when the runs cannot tell (still printed as inconclusive)",
    )
    return p.parse_args(argv)


def main(argv=None) -> int:
    return gate(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
