"""The onboarding page's steps and what each one's check found, read from the host and its
newest ``HostCheck`` (the check stores an outcome and one line of detail; the inventory it
refreshed is on the host and its GPUs). A check that found nothing is never shown as a pass:
a refused connection or a refused token is a failure with the error and what to do."""

from __future__ import annotations

from dataclasses import dataclass, field

from controlpanel.choices import OperationStatus
from hosts.choices import CheckOutcome, HostStatus, TransportKind
from hosts.models import Host, HostCheck
from hosts.services.agent_install import TLS_CERT, TOKEN_FILE, UNIT_NAME

PASS, FAIL, WARN, PENDING, SKIP = "pass", "fail", "warn", "pending", "skip"
DONE, TODO, WAITING = "done", "todo", "waiting"
TLS_WORDS = ("certificate", "ssl", "tls", "hostname", "handshake")


@dataclass
class Result:
    """One sub-result of a check: ``state`` is pass / fail / warn / pending / skip."""

    name: str
    state: str
    text: str
    hint: str = ""


@dataclass
class Step:
    """One step of the page: done / todo / waiting / failed, what was found, what to do."""

    key: str
    title: str
    state: str
    text: str = ""
    hint: str = ""
    results: list[Result] = field(default_factory=list)


def latest_check(host: Host) -> HostCheck | None:
    return host.checks.order_by("-created_at", "-pk").first()


def check_running(check: HostCheck | None) -> bool:
    return check is not None and not check.is_finished


def agent_steps(host: Host, check: HostCheck | None) -> list[Step]:
    results = agent_results(host, check)
    return [_agent_install_step(host, check), _pin_step(host, check), _check_step(check, results)]


def ssh_steps(host: Host, check: HostCheck | None) -> list[Step]:
    results = ssh_results(host, check)
    return [_ssh_key_step(host), _host_key_step(host), _check_step(check, results)]


def steps_for(host: Host, check: HostCheck | None) -> list[Step]:
    if host.transport == TransportKind.SSH:
        return ssh_steps(host, check)
    return agent_steps(host, check)


# ---------------------------------------------------------------------------- agent


def _agent_install_step(host: Host, check: HostCheck | None) -> Step:
    step = Step("install", "Install and start the agent", TODO)
    if not host.agent_token:
        step.text = "No token yet: generate one to get the install command."
        return step
    problem = host.credential_problem()
    if problem:
        step.state = "failed"
        step.text = f"The stored token is not sent: {problem}."
        step.hint = "Generate a new token and run the install command again."
        return step
    step.state = WAITING
    step.text = "Run the command on the GPU server, then test the connection (step 3)."
    if check is not None and check.is_finished and check.reachable is not None:
        if check.reachable:
            step.state = DONE
            step.text = f"Something answers on port {host.port} ({check.latency_ms} ms)."
        else:
            step.state = "failed"
            step.text = check.detail
            step.hint = (
                f"Start the agent: run the command as root, then `systemctl status {UNIT_NAME}` "
                f"and `journalctl -u {UNIT_NAME}` on the server; open port {host.port} in its "
                "firewall."
            )
    return step


def _pin_step(host: Host, check: HostCheck | None) -> Step:
    step = Step("pin", "Pin the agent's certificate", TODO)
    if not host.agent_tls:
        step.state = "skipped"
        step.text = "Plain HTTP: only for an agent on this machine (loopback), no certificate."
        return step
    if not host.agent_ca_cert.strip():
        step.text = (
            f"Paste {TLS_CERT} (the install command prints it), or fetch the certificate the "
            "agent presents and accept its fingerprint."
        )
        return step
    step.state = DONE
    step.text = "Pinned: the panel trusts only this certificate."
    tls = _tls_result(host, check)
    if tls.state == FAIL:
        step.state = "failed"
        step.text, step.hint = tls.text, tls.hint
    return step


def _tls_result(host: Host, check: HostCheck | None) -> Result:
    name = "TLS certificate"
    if not host.agent_tls:
        return Result(name, SKIP, "plain HTTP (an agent on this machine only)")
    outcome = check.outcome if check is not None else ""
    if outcome in (CheckOutcome.CONNECTED, CheckOutcome.AUTH_FAILED) and not _not_sent(check):
        pinned = (
            "matches the pinned certificate"
            if host.agent_ca_cert.strip()
            else ("verified by the system's CAs (nothing pinned)")
        )
        return Result(name, PASS, pinned)
    if outcome == CheckOutcome.FAILED and any(w in check.detail.lower() for w in TLS_WORDS):
        return Result(
            name,
            FAIL,
            check.detail,
            "The agent presents another certificate than the pinned one, or one that does not "
            "name this address: pin the certificate it presents now (step 2), or restart the "
            "agent with the pinned one.",
        )
    return Result(name, PENDING, "not reached")


def _not_sent(check: HostCheck) -> bool:
    # CredentialsNotBound: the panel refused to send the token, so nothing was proven.
    return "credentials not sent" in check.detail


def agent_results(host: Host, check: HostCheck | None) -> list[Result]:
    if check is None:
        return []
    if not check.is_finished:
        return [Result("Check", PENDING, f"{check.get_status_display()}…")]
    if check.status == OperationStatus.FAILED:
        return [Result("Check", FAIL, check.error or "the check itself failed", "Run it again.")]
    results = [_reachable(host, check)]
    if not check.reachable:
        return results
    results.append(_tls_result(host, check))
    outcome = check.outcome
    token = Result("Token", PENDING, "not tried")
    if outcome == CheckOutcome.CONNECTED:
        token = Result("Token", PASS, "accepted")
    elif outcome == CheckOutcome.AUTH_FAILED:
        token = Result(
            "Token",
            FAIL,
            check.detail,
            f"The token in {TOKEN_FILE} is not the panel's: generate a new token (step 1), "
            "run the command again, then test again.",
        )
    elif outcome == CheckOutcome.PORT_OPEN:
        token = Result("Token", FAIL, "no token stored", "Generate one (step 1).")
    elif outcome == CheckOutcome.FAILED:
        results.append(Result("Connection", FAIL, check.detail, _failed_hint(check)))
    results.append(token)
    if outcome == CheckOutcome.CONNECTED:
        results += _inventory(host)
    return results


def _failed_hint(check: HostCheck) -> str:
    if "without a json" in check.detail.lower():
        return "Something else listens on that port: check the host's port."
    return "Read the agent's log on the server: journalctl -u " + UNIT_NAME


def _reachable(host: Host, check: HostCheck) -> Result:
    if check.reachable:
        return Result("Reachable", PASS, f"port {host.port} answered in {check.latency_ms} ms")
    return Result(
        "Reachable",
        FAIL,
        check.detail,
        f"Is the agent running (systemctl status {UNIT_NAME}) and port {host.port} open to "
        "the panel's workers?",
    )


def _inventory(host: Host) -> list[Result]:
    gpus = list(host.gpus.order_by("index"))
    listed = "; ".join(f"GPU{g.index} {g.name} ({g.memory_gib:.0f} GiB)" for g in gpus)
    source = host.telemetry_source or "none"
    if gpus:
        found = Result("GPUs", PASS, f"{len(gpus)} found: {listed}")
    else:
        found = Result(
            "GPUs", FAIL, "none found", "Check `nvidia-smi` on the server: is the driver loaded?"
        )
    if host.driver_version:
        text = f"driver {host.driver_version}, CUDA {host.cuda_version or '?'}"
        driver = Result("Driver / CUDA", PASS, text)
    elif source == "simulator":
        driver = Result("Driver / CUDA", WARN, "none: simulated GPUs")
    else:
        driver = Result("Driver / CUDA", WARN, "not reported", "NVML did not answer (see below).")
    if source in ("nvml", "nvidia-smi"):
        telemetry = Result("Telemetry", PASS, f"from {source}")
    elif source == "simulator":
        telemetry = Result("Telemetry", WARN, "simulated GPUs (--simulate): not a real GPU")
    else:
        telemetry = Result(
            "Telemetry",
            FAIL,
            host.telemetry_note or "no GPU telemetry",
            "Install the NVIDIA driver (libnvidia-ml) and nvidia-ml-py for the agent's python.",
        )
    engines = {k: v for k, v in (host.libraries or {}).items() if k in ("vllm", "sglang")}
    deployments = host.deployments.count()
    if engines:
        text = ", ".join(f"{k} {v}" for k, v in sorted(engines.items()))
        engine = Result("Engines", PASS, f"{text}; {deployments} deployment(s) in the panel")
    else:
        engine = Result(
            "Engines",
            WARN,
            "neither vLLM nor SGLang found in the agent's python",
            "Run the agent with the python your engines are installed in.",
        )
    return [found, driver, telemetry, engine]


# ---------------------------------------------------------------------------- SSH


def _ssh_key_step(host: Host) -> Step:
    step = Step("key", "SSH key", TODO)
    if not host.ssh_username:
        step.text = "No user name: edit the host."
    elif not host.ssh_private_key:
        step.text = "Upload the key (edit the host) or generate a key pair here."
    else:
        step.state = DONE
        step.text = f"Logging in as {host.ssh_username}."
    return step


def _host_key_step(host: Host) -> Step:
    step = Step("host_key", "Accept the host key", TODO)
    if host.status == HostStatus.HOST_KEY_CHANGED:
        step.state = "failed"
        step.text = f"The server presented another key: {host.ssh_offered_fingerprint}."
        step.hint = "Another machine, or a reinstalled one: compare before accepting."
    elif host.ssh_offered_fingerprint:
        step.state = WAITING
        step.text = "Compare the offered key with the server's and accept it."
    elif host.ssh_host_key_fingerprint:
        step.state = DONE
        step.text = f"Accepted: {host.ssh_host_key_fingerprint}."
    else:
        step.text = "Connect to learn the key the server offers."
    return step


def ssh_results(host: Host, check: HostCheck | None) -> list[Result]:
    if check is None:
        return []
    if not check.is_finished:
        return [Result("Check", PENDING, f"{check.get_status_display()}…")]
    if check.status == OperationStatus.FAILED:
        return [Result("Check", FAIL, check.error or "the check itself failed", "Run it again.")]
    reach = Result(
        "Reachable",
        PASS if check.reachable else FAIL,
        check.detail if not check.reachable else f"port {host.port} in {check.latency_ms} ms",
        "" if check.reachable else f"Is sshd listening on port {host.port}?",
    )
    results = [reach]
    if not check.reachable:
        return results
    outcome = check.outcome
    if outcome == CheckOutcome.HOST_KEY:
        results.append(
            Result("Host key", WARN, check.detail, "Accept the host key (step 2), then test.")
        )
        return results
    if outcome == CheckOutcome.CONNECTED:
        results.append(Result("Login", PASS, f"as {host.ssh_username}"))
    else:
        hint = (
            "Append the public key (step 1) to ~/.ssh/authorized_keys of "
            f"{host.ssh_username or 'the user'}."
            if outcome == CheckOutcome.AUTH_FAILED
            else "Read the error: the server's sshd log says more."
        )
        results.append(Result("Login", FAIL, check.detail, hint))
        return results
    libraries = host.libraries or {}
    if libraries:
        shown = ", ".join(f"{k} {v}" for k, v in sorted(libraries.items())[:6])
        results.append(Result("Python", PASS, f"{host.ssh_python}: {shown}"))
    else:
        results.append(
            Result(
                "Python",
                WARN,
                f"{host.ssh_python} reported no packages",
                "Set the host's python to the one your engines are installed in.",
            )
        )
    gpus = list(host.gpus.order_by("index"))
    if host.telemetry_source == "nvidia-smi" and gpus:
        listed = "; ".join(f"GPU{g.index} {g.name} ({g.memory_gib:.0f} GiB)" for g in gpus)
        results.append(Result("GPUs", PASS, f"{len(gpus)} via nvidia-smi: {listed}"))
    else:
        results.append(
            Result(
                "GPUs",
                FAIL,
                host.telemetry_note or "nvidia-smi found no GPU",
                "Check `nvidia-smi` on the server as the SSH user.",
            )
        )
    return results


def _check_step(check: HostCheck | None, results: list[Result]) -> Step:
    step = Step("check", "Check the connection", TODO, results=results)
    if check is None:
        step.text = "Not tested yet."
    elif not check.is_finished:
        step.state = WAITING
        step.text = "Testing…"
    elif check.outcome == CheckOutcome.CONNECTED and not any(r.state == FAIL for r in results):
        step.state = DONE
        step.text = check.detail
    else:
        step.state = "failed"
        step.text = check.error or check.detail
    return step
