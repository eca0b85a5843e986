"""``{% shared "name" [vary ...] [as var] %} ... {% endshared %}``: a part of a page every
viewer with the same permissions sees alike, rendered once and reused for PAGE_CACHE_SECONDS
(see controlpanel.pagecache for what such a part may hold and how it stays fresh). The view
hands the part's data over lazily (querysets, callables), so a part read from the cache runs
none of its queries. With ``as var`` the part is not written out but kept in ``var`` (for a
page that decides around it, such as whether anything is listed at all)."""

from django import template
from django.middleware.csrf import get_token
from django.utils.functional import SimpleLazyObject
from django.utils.safestring import mark_safe

from controlpanel import pagecache

register = template.Library()


class SharedNode(template.Node):
    def __init__(self, nodelist, name, vary, target=None):
        self.nodelist, self.name, self.vary, self.target = nodelist, name, vary, target

    def render(self, context):
        name = self.name.resolve(context)
        vary = tuple(v.resolve(context) for v in self.vary)
        request = context.get("request")

        def render():
            if request is None:
                return self.nodelist.render(context)
            # Forms in the part hold a placeholder, not the rendering viewer's token: each
            # viewer's own is written in as the part is served (pagecache.with_csrf_tokens).
            with context.push(csrf_token=pagecache.csrf_placeholder()):
                return self.nodelist.render(context)

        html = pagecache.shared(request, name, render, vary)
        if request is not None:
            # The page's own token (one per page, as {% csrf_token %} would give); a context
            # built without the CSRF processor gets the request's.
            token = context.get("csrf_token")
            html = pagecache.with_csrf_tokens(
                str(html),
                token if token is not None else SimpleLazyObject(lambda: get_token(request)),
            )
        # What is stored is this node's own output, already escaped where it had to be.
        html = mark_safe(html)  # noqa: S308 - the template's own escaped output
        if self.target:
            context[self.target] = html
            return ""
        return html


@register.tag("shared")
def do_shared(parser, token):
    bits = token.split_contents()
    if len(bits) < 2:
        raise template.TemplateSyntaxError("'shared' takes the part's name")
    target = None
    if len(bits) >= 4 and bits[-2] == "as":
        target, bits = bits[-1], bits[:-2]
    nodelist = parser.parse(("endshared",))
    parser.delete_first_token()
    return SharedNode(
        nodelist,
        parser.compile_filter(bits[1]),
        [parser.compile_filter(b) for b in bits[2:]],
        target,
    )
