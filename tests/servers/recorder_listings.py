"""What ``recorder.py`` lists (resources, templates, prompts), as FastMCP listed them."""

from __future__ import annotations

import mcp_types as types

if __package__:  # imported as tests.servers.recorder_listings
    from .lowlevel_tools import TAGS, Context
else:  # a sibling of the script that runs
    from lowlevel_tools import TAGS, Context

TEXT = "text/plain"
HINT = (
    'Provide a value matching the following JSON schema: {"type":"string"}. Encode non-string values as JSON.'
)
"""What FastMCP says of each string argument of a prompt."""

TEMPLATES = {  # name: (URI template, description), as FastMCP listed them
    "note": ("note://{name}", None),
    "slow": ("slow://{steps}", "Report ``steps`` progress steps while read; record the request's ``_meta``."),
    "waited": ("wait://{seconds}", "Read after ``seconds``; records its start and cancellation."),
}
PROMPTS = {  # name: description; each has one required string argument
    "drafted": "Report ``steps`` progress steps while rendered.",
    "waiting": "Rendered after ``seconds``; records its start and cancellation.",
}
PROMPT_ARGUMENTS = {"drafted": "steps", "waiting": "seconds"}


async def list_resources(_: Context, __: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
    counter = types.Resource(name="counter", uri="counter://value", mime_type=TEXT, _meta=TAGS)
    return types.ListResourcesResult(resources=[counter])


async def list_templates(
    _: Context, __: types.PaginatedRequestParams | None
) -> types.ListResourceTemplatesResult:
    templates = [
        types.ResourceTemplate(name=name, uri_template=uri, description=about, mime_type=TEXT, _meta=TAGS)
        for name, (uri, about) in TEMPLATES.items()
    ]
    return types.ListResourceTemplatesResult(resource_templates=templates)


async def list_prompts(_: Context, __: types.PaginatedRequestParams | None) -> types.ListPromptsResult:
    prompts = [
        types.Prompt(
            name=name,
            description=about,
            arguments=[types.PromptArgument(name=PROMPT_ARGUMENTS[name], description=HINT, required=True)],
            _meta=TAGS,
        )
        for name, about in PROMPTS.items()
    ]
    return types.ListPromptsResult(prompts=prompts)
