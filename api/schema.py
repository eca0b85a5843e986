"""How the OpenAPI schema describes the panel's own authentication."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "api.auth.BearerTokenAuthentication"
    name = "bearerToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token from the API tokens page or `manage.py create_api_token`.",
        }


def nullable_refs(result, generator, request, public):
    """drf-spectacular writes a nullable nested object as ``{"allOf": [ref], "nullable":
    true}``, which OpenAPI 3.0 validators (openapi-core among them) read as "never null":
    ``nullable`` does not reach into ``allOf``. Rewrite it as ``anyOf`` of the object and an
    explicit null, which validators and code generators agree on."""

    def walk(node):
        if isinstance(node, dict):
            if node.get("nullable") is True and isinstance(node.get("allOf"), list):
                refs = node.pop("allOf")
                node.pop("nullable")
                node["anyOf"] = [*refs, {"type": "object", "nullable": True, "enum": [None]}]
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(result)
    return result
