"""``{% shared "name" [vary ...] %} ... {% endshared %}``: a part of a page every viewer with
the same permissions sees alike, rendered once and reused for PAGE_CACHE_SECONDS (see
controlpanel.pagecache for what such a part may hold and how it stays fresh). The view hands
the part's data over lazily (querysets, callables), so a part read from the cache runs none
of its queries."""

from django import template
from django.utils.safestring import mark_safe

from controlpanel import pagecache

register = template.Library()


class SharedNode(template.Node):
    def __init__(self, nodelist, name, vary):
        self.nodelist, self.name, self.vary = nodelist, name, vary

    def render(self, context):
        name = self.name.resolve(context)
        vary = tuple(v.resolve(context) for v in self.vary)
        html = pagecache.shared(
            context.get("request"), name, lambda: self.nodelist.render(context), vary
        )
        # What is stored is this node's own output, already escaped where it had to be.
        return mark_safe(html)  # noqa: S308 - the template's own escaped output


@register.tag("shared")
def do_shared(parser, token):
    bits = token.split_contents()
    if len(bits) < 2:
        raise template.TemplateSyntaxError("'shared' takes the part's name")
    nodelist = parser.parse(("endshared",))
    parser.delete_first_token()
    return SharedNode(
        nodelist, parser.compile_filter(bits[1]), [parser.compile_filter(b) for b in bits[2:]]
    )
