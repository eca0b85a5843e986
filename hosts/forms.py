"""Forms of the hosts app."""

from __future__ import annotations

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


class HostForm(forms.ModelForm):
    labels = LabelsField(required=False, help_text="key=value, separated by commas.")
    port = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=65535,
        help_text="Empty: the transport's default (agent 8421, SSH 22).",
    )

    class Meta:
        model = Host
        fields = ["name", "address", "transport", "port", "labels", "hourly_price", "description"]
        widgets = {"description": forms.Textarea(attrs={"rows": 3})}

    def clean(self):
        data = super().clean()
        if not data.get("port") and data.get("transport"):
            data["port"] = TransportKind(data["transport"]).default_port
            self.instance.port = data["port"]
        return data
