"""Host credentials bound to their destination: every stored secret records where it was
entered for (``Host.credential_bindings``), and the panel never sends it anywhere else.

A host that changes its address, port, transport, TLS or pinned certificate keeps its secrets
only bound to the old destination: ``credential_problem`` then says why they are not sent, and
``hosts.services.transports.transport_for`` refuses before a byte goes out, whatever changed
the host (the form, the admin, a script, a bulk update).
"""

from __future__ import annotations

import hashlib

from hosts.choices import TransportKind

# The stored credentials, and which of them each transport sends.
SECRET_FIELDS = ("agent_token", "ssh_private_key", "ssh_key_passphrase")
TRANSPORT_SECRETS = {
    TransportKind.AGENT: ("agent_token",),
    TransportKind.SSH: ("ssh_private_key", "ssh_key_passphrase"),
}


class CredentialBinding:
    """Mixed into ``Host``: binds each secret to the destination it was entered for on save."""

    def save(self, *args, **kwargs):
        update_fields = kwargs.get("update_fields")
        if update_fields is None or set(update_fields) & set(SECRET_FIELDS):
            self._bind_credentials()
            if update_fields is not None:
                kwargs["update_fields"] = {*update_fields, "credential_bindings"}
        super().save(*args, **kwargs)
        self.__dict__.pop("_entered_secrets", None)

    @property
    def destination(self) -> str:
        """Where credentials go: everything that decides which machine receives them and how.
        Over the agent the scheme and the pinned CA count too (a dropped pin or plain HTTP
        hands the token to whoever answers)."""
        address = self.address.strip("[]").lower()
        if ":" in address:
            address = f"[{address}]"
        if self.transport == TransportKind.SSH:
            return f"ssh {address}:{self.port}"
        scheme = "https" if self.agent_tls else "http"
        pin = ""
        if self.agent_tls and self.agent_ca_cert.strip():
            digest = hashlib.sha256(self.agent_ca_cert.strip().encode()).hexdigest()[:16]
            pin = f" ca:{digest}"
        return f"agent {scheme}://{address}:{self.port}{pin}"

    def enter_secret(self, name: str, value: str) -> None:
        """Set a credential as typed by someone for the host's current destination: saving
        binds it there even when its value is the one already stored (an agent moved to a new
        address keeps its token, and the operator vouches for that by typing it again)."""
        if name not in SECRET_FIELDS:
            raise ValueError(f"{name} is not a secret of a host")
        setattr(self, name, value)
        self.__dict__.setdefault("_entered_secrets", set()).add(name)

    @property
    def entered_secrets(self) -> set[str]:
        return set(self.__dict__.get("_entered_secrets", ()))

    def credential_problem(self) -> str:
        """Why the stored credentials of the host's transport must not be sent to its current
        destination ("" when they may): they were entered for another one."""
        for name in TRANSPORT_SECRETS[TransportKind(self.transport)]:
            if not getattr(self, name):
                continue
            bound = (self.credential_bindings or {}).get(name)
            if bound != self.destination:
                label = self._meta.get_field(name).verbose_name
                return (
                    f"the stored {label} was entered for {bound or 'an unknown destination'}, "
                    f"not for {self.destination}: enter it again to send it there"
                )
        return ""

    def _bind_credentials(self) -> None:
        # A secret typed in (enter_secret) or with a new value is bound to where the host
        # points now; one left as stored keeps the binding it had, from the database (never
        # from this instance, which a caller may have edited).
        stored = None
        if self.pk is not None and not self._state.adding:
            stored = (
                type(self)
                ._default_manager.filter(pk=self.pk)
                .values(*SECRET_FIELDS, "credential_bindings")
                .first()
            )
        bindings = dict(stored["credential_bindings"] or {}) if stored else {}
        entered = self.entered_secrets
        for name in SECRET_FIELDS:
            value = getattr(self, name)
            if not value:
                bindings.pop(name, None)
            elif stored is None or name in entered or not same_secret(value, stored[name]):
                bindings[name] = self.destination
        self.credential_bindings = bindings


def same_secret(value, stored) -> bool:
    """``value`` is the secret ``stored`` holds (an unreadable one reads as "": compare what is
    on disk instead)."""
    return getattr(value, "stored", value) == getattr(stored, "stored", stored) and type(
        value
    ) is type(stored)
