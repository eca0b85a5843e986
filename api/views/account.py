"""Who the caller is: the user a token or session acts as, with roles and permissions."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from api.base import TokenAuditMixin
from api.models import ApiToken
from controlpanel.roles import role_names


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    roles = serializers.ListField(child=serializers.CharField())
    via = serializers.CharField(help_text='"token NAME" or "session"')
    token_expires_at = serializers.DateTimeField(allow_null=True)


class MeView(TokenAuditMixin, APIView):
    """The signed-in user: check a token with ``curl -H "Authorization: Bearer …" …/me/``."""

    permissions = {"GET": ""}

    @extend_schema(responses=MeSerializer)
    def get(self, request):
        token = request.auth if isinstance(request.auth, ApiToken) else None
        return Response(
            MeSerializer(
                {
                    "username": request.user.get_username(),
                    "roles": role_names(request.user),
                    "via": f"token {token.name}" if token else "session",
                    "token_expires_at": token.expires_at if token else None,
                }
            ).data
        )


class NotFoundView(APIView):
    """Any other path under /api/v1/: a 404 in the API's error shape, not the HTML page."""

    authentication_classes: list = []
    permission_classes: list = []

    @extend_schema(exclude=True)
    def get(self, request, *args, **kwargs):
        raise NotFound("No such API resource.")

    post = put = patch = delete = get
