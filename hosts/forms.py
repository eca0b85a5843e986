"""Forms of the hosts app."""

from __future__ import annotations

import io

import paramiko
from django import forms

from hosts.choices import TransportKind
from hosts.models import Host, validate_labels


class LabelsField(forms.CharField):
    """Labels typed as ``key=value`` pairs separated by commas or new lines."""

    def prepare_value(self, value):
        if isinstance(value, dict):
            return ", ".join(f"{k}={v}" for k, v in sorted(value.items()))
        return value

    def to_python(self, value):
        text = super().to_python(value) or ""
        labels = {}
        for item in text.replace("\n", ",").split(","):
            item = item.strip()
            if not item:
                continue
            key, sep, val = item.partition("=")
            if not sep or not key.strip():
                raise forms.ValidationError(f"{item!r} is not key=value.")
            labels[key.strip()] = val.strip()
        validate_labels(labels)
        return labels


def check_private_key(text: str, passphrase: str | None) -> None:
    """Refuse a key paramiko cannot load (wrong format, wrong passphrase) at once, not at the
    first connection."""
    if text.startswith("file:"):
        if not text[5:].startswith("/"):
            raise forms.ValidationError("A key file reference is file:/absolute/path.")
        return
    errors = []
    for kind in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            kind.from_private_key(io.StringIO(text), password=passphrase or None)
            return
        except paramiko.PasswordRequiredException:
            raise forms.ValidationError("The key is encrypted: give its passphrase.") from None
        except (paramiko.SSHException, ValueError) as exc:
            errors.append(str(exc))
    raise forms.ValidationError(
        "Not a private key paramiko can read (OpenSSH or PEM: Ed25519, ECDSA or RSA)."
    )


class SecretInput(forms.PasswordInput):
    """Write-only: an existing secret is never sent back to the browser."""

    def __init__(self, **kwargs):
        super().__init__(render_value=False, **kwargs)


class HostForm(forms.ModelForm):
    labels = LabelsField(required=False, help_text="key=value, separated by commas.")
    port = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=65535,
        help_text="Empty: the transport's default (agent 9100, SSH 22).",
    )
    agent_token = forms.CharField(
        required=False,
        strip=True,
        widget=SecretInput(attrs={"autocomplete": "off"}),
        help_text="The token in the agent's --token-file. Leave empty to keep the stored one.",
    )
    ssh_private_key = forms.CharField(
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 4, "autocomplete": "off", "spellcheck": "false"}),
        help_text="Private key text, or file:/path on the worker machines. Leave empty to "
        "keep the stored one. The host key is checked: a first contact shows its fingerprint "
        "for an admin to accept.",
    )
    ssh_key_passphrase = forms.CharField(
        required=False, strip=False, widget=SecretInput(attrs={"autocomplete": "off"})
    )

    SECRETS = ("agent_token", "ssh_private_key", "ssh_key_passphrase")

    class Meta:
        model = Host
        fields = [
            "name",
            "address",
            "transport",
            "port",
            "agent_token",
            "agent_tls",
            "agent_ca_cert",
            "ssh_username",
            "ssh_private_key",
            "ssh_key_passphrase",
            "ssh_python",
            "labels",
            "hourly_price",
            "description",
        ]
        widgets = {
            "description": forms.Textarea(attrs={"rows": 3}),
            "agent_ca_cert": forms.Textarea(attrs={"rows": 3}),
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The stored secrets stay on the instance; the form only ever sees new ones.
        self._stored = {name: getattr(self.instance, name) for name in self.SECRETS}
        for name in self.SECRETS:
            self.initial[name] = ""

    def clean(self):
        data = super().clean()
        transport = data.get("transport")
        if not data.get("port") and transport:
            data["port"] = TransportKind(transport).default_port
            self.instance.port = data["port"]
        for name in self.SECRETS:
            if not data.get(name):
                data[name] = self._stored[name]  # empty means "keep"
                setattr(self.instance, name, self._stored[name])
        if transport == TransportKind.AGENT and not data.get("agent_token"):
            self.add_error("agent_token", "The agent needs its token.")
        if transport == TransportKind.SSH:
            if not data.get("ssh_username"):
                self.add_error("ssh_username", "SSH needs a user name.")
            key = data.get("ssh_private_key")
            if not key:
                self.add_error("ssh_private_key", "SSH needs a private key (or file:/path).")
            elif (
                key != self._stored["ssh_private_key"]
                or data.get("ssh_key_passphrase") != self._stored["ssh_key_passphrase"]
            ):
                try:
                    check_private_key(key, data.get("ssh_key_passphrase"))
                except forms.ValidationError as exc:
                    self.add_error("ssh_private_key", exc)
        if data.get("agent_ca_cert") and "BEGIN CERTIFICATE" not in data["agent_ca_cert"]:
            self.add_error("agent_ca_cert", "Paste PEM certificate text (-----BEGIN CERTIFICATE…).")
        return data
