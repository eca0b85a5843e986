"""Forms of the hosts app."""

from __future__ import annotations

import io

import paramiko
from django import forms

from hosts.choices import HostStatus, TransportKind
from hosts.credentials import SECRET_FIELDS, TRANSPORT_SECRETS
from hosts.models import LABEL_KEY, Host, validate_labels
from hosts.services import fleet_list
from hosts.services.hosts import may_change_protection
from hosts.services.transports import KeyFileRefused, key_file_path


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
        try:
            key_file_path(text[5:].strip())
        except KeyFileRefused as exc:
            raise forms.ValidationError(f"{exc}.") from None
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
        help_text="The token in the agent's --token-file. Leave empty to keep the stored one "
        "(a new host: the setup page generates one for the install command).",
    )
    ssh_private_key = forms.CharField(
        required=False,
        strip=False,
        widget=forms.Textarea(attrs={"rows": 4, "autocomplete": "off", "spellcheck": "false"}),
        help_text="Private key text, or file:NAME for a key file in SSH_KEY_DIR on the worker "
        "machines. Leave empty to keep the stored one. The host key is checked: a first "
        "contact shows its fingerprint for an admin to accept.",
    )
    ssh_key_passphrase = forms.CharField(
        required=False, strip=False, widget=SecretInput(attrs={"autocomplete": "off"})
    )

    SECRETS = SECRET_FIELDS

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
        help_texts = {
            "agent_tls": "Required for an agent on another machine: start it with --tls-cert "
            "and --tls-key.",
            "agent_ca_cert": "The agent's certificate (or the CA that signed it), pinned: only "
            "an agent holding its key is trusted. Empty: the system's CA store.",
        }

    def __init__(self, *args, user=None, **kwargs):
        super().__init__(*args, **kwargs)
        # Who edits: protection labels need an Admin (None: the service alone decides).
        self.user = user
        # The stored secrets stay on the instance; the form only ever sees new ones.
        self._stored = {name: getattr(self.instance, name) for name in self.SECRETS}
        for name in self.SECRETS:
            self.initial[name] = ""
        editing = self.instance.pk is not None
        self._stored_destination = self.instance.destination if editing else None
        self._stored_protection = self.instance.protection if editing else None

    def clean(self):
        data = super().clean()
        transport = data.get("transport")
        if not data.get("port") and transport:
            data["port"] = TransportKind(transport).default_port
            self.instance.port = data["port"]
        self._keep_or_require_secrets(data)
        self._check_protection(data)
        # An agent host may be saved without a token: its setup page generates a strong one
        # and puts it in the install command (hosts.services.onboarding).
        if transport == TransportKind.SSH:
            if not data.get("ssh_username"):
                self.add_error("ssh_username", "SSH needs a user name.")
            key = data.get("ssh_private_key")
            if "ssh_private_key" in self.errors:
                pass
            elif not key:
                self.add_error("ssh_private_key", "SSH needs a private key (or file:NAME).")
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

    def _destination(self, data) -> str | None:
        if not data.get("transport") or not data.get("address") or not data.get("port"):
            return None  # invalid anyway: its own field says why
        return Host(
            transport=data["transport"],
            address=data["address"],
            port=data["port"],
            agent_tls=bool(data.get("agent_tls")),
            agent_ca_cert=data.get("agent_ca_cert") or "",
        ).destination

    def _keep_or_require_secrets(self, data) -> None:
        """Empty means "keep the stored secret", but only while the host points where it was
        entered for: after a move each stored credential of the transport must be typed again
        (a kept one would go to whoever now answers), and the other transport's are dropped."""
        destination = self._destination(data)
        moved = None not in (self._stored_destination, destination) and (
            destination != self._stored_destination
        )
        needed = TRANSPORT_SECRETS.get(data.get("transport"), ())
        for name in self.SECRETS:
            if data.get(name):
                self.instance.enter_secret(name, data[name])
            elif not moved:
                data[name] = self._stored[name]
                setattr(self.instance, name, self._stored[name])
            else:
                data[name] = ""
                setattr(self.instance, name, "")
                if self._stored[name] and name in needed:
                    label = Host._meta.get_field(name).verbose_name
                    self.add_error(
                        name,
                        f"The host now points at {destination} (it was "
                        f"{self._stored_destination}): enter the {label.lower()} again. A "
                        "stored credential is only ever sent to the destination it was "
                        "entered for.",
                    )

    def _check_protection(self, data) -> None:
        if self._stored_protection is None or self.user is None or "labels" not in data:
            return
        protection = Host(labels=data["labels"]).protection
        if protection != self._stored_protection and not may_change_protection(self.user):
            was = ", ".join(
                f"{k}={v}" if v is not None else f"no {k}"
                for k, v in self._stored_protection.items()
            )
            self.add_error(
                "labels",
                f"Only an Admin may change {', '.join(protection)}: it sets how many "
                f"approvals this host's changes need (now {was}). Put it back as it was to "
                "save your other changes, or ask an Admin.",
            )


class LabelTermsInput(forms.TextInput):
    """One text box; a query string may also repeat ``?label=`` (links built elsewhere)."""

    def value_from_datadict(self, data, files, name):
        getlist = getattr(data, "getlist", None)
        values = getlist(name) if getlist else [data.get(name) or ""]
        return ", ".join(v for v in values if v and v.strip())


class LabelTermsField(forms.CharField):
    """Label terms as the host form types labels, separated by commas: ``key`` (has the
    label) or ``key=value``; all must hold."""

    def to_python(self, value):
        terms = []
        for item in (super().to_python(value) or "").split(","):
            key, eq, val = (part.strip() for part in item.partition("="))
            if not (key or eq):
                continue
            if not LABEL_KEY.match(key):
                raise forms.ValidationError(
                    f"{item.strip()!r} is not a label (key or key=value); ignored."
                )
            terms.append((key, val if eq else None))
        return tuple(terms)


class HostFilterForm(forms.Form):
    """The hosts list's filters, from the query string. A value that does not validate is
    shown with its error and left out of the filter; the others still apply."""

    q = forms.CharField(required=False, max_length=100, label="Name contains")
    status = forms.ChoiceField(
        required=False,
        label="Status",
        choices=[("", "any"), (fleet_list.TROUBLE, "in trouble (red)"), *HostStatus.choices],
        # An unknown status is named in its error, not as "Select a valid choice".
        error_messages={"invalid_choice": "%(value)s is not a host status; ignored."},
    )
    gpu = forms.CharField(
        required=False,
        max_length=100,
        label="GPU model contains",
        widget=forms.TextInput(attrs={"list": "gpu-models", "placeholder": "H100"}),
    )
    label = LabelTermsField(
        required=False,
        max_length=500,
        label="Labels",
        widget=LabelTermsInput(attrs={"placeholder": "zone=eu, tier"}),
    )

    def chosen(self) -> fleet_list.HostFilter:
        """The filter from the fields that validated (call ``is_valid()`` first)."""
        data = self.cleaned_data
        return fleet_list.HostFilter(
            q=data.get("q", ""),
            status=data.get("status", ""),
            gpu=data.get("gpu", ""),
            labels=data.get("label", ()),
        )
