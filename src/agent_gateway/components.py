"""FastMCP components (prompts, resources, templates) that forward through the proxy.

This is the boundary where the gateway's errors become FastMCP's: a ``GatewayError`` from a
prompt or a resource becomes an MCP error carrying its message.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from fastmcp.exceptions import PromptError, ResourceError
from fastmcp.prompts.base import Message, Prompt, PromptArgument, PromptResult
from fastmcp.resources.base import Resource, ResourceContent, ResourceResult
from fastmcp.resources.template import ResourceTemplate
from fastmcp.server.dependencies import get_context
from fastmcp.server.providers import Provider
from fastmcp.utilities.versions import VersionSpec
from pydantic import AnyUrl, PrivateAttr

from agent_gateway import access, sessions
from agent_gateway.catalog import Catalog, CatalogSnapshot
from agent_gateway.errors import GatewayError, UnknownName
from agent_gateway.proxy import Caller, Proxy


def current_caller() -> Caller | None:
    """The client request being served, captured in its own task (None outside a request)."""
    session = sessions.CURRENT.get()
    context = get_context()
    request = context.request_context
    if session is None or request is None:
        return None
    rounds = types.InputResponseRequestParams(
        input_responses=context.input_responses, request_state=context.request_state
    )
    return Caller.of_request(session, context.session, request.request_id, request.meta, rounds)


class GatewayPrompt(Prompt):
    """An upstream prompt under its public name."""

    _proxy: Proxy = PrivateAttr()

    @classmethod
    def build(cls, public: str, prompt: types.Prompt, proxy: Proxy) -> GatewayPrompt:
        arguments = [
            PromptArgument(name=a.name, description=a.description, required=bool(a.required))
            for a in prompt.arguments or []
        ]
        component = cls(
            name=public,
            title=prompt.title,
            description=prompt.description,
            arguments=arguments,
            icons=prompt.icons,
            meta=prompt.meta,
        )
        component._proxy = proxy
        return component

    async def render(self, arguments: dict[str, Any] | None = None) -> PromptResult:
        try:
            result = await self._proxy.get_prompt(self.name, _as_strings(arguments), current_caller())
        except GatewayError as exc:
            raise PromptError(str(exc)) from exc
        messages = [Message(m.content, role=m.role) for m in result.messages]
        return PromptResult(messages=messages, description=result.description, meta=result.meta)


def _as_strings(arguments: dict[str, Any] | None) -> dict[str, str] | None:
    if arguments is None:
        return None
    return {k: v if isinstance(v, str) else str(v) for k, v in arguments.items()}


class GatewayResource(Resource):
    """An upstream resource (listed, or read through a template) under its public URI."""

    _proxy: Proxy = PrivateAttr()
    _public_uri: str = PrivateAttr()

    @classmethod
    def build(
        cls, public: str, resource: types.Resource | types.ResourceTemplate, proxy: Proxy
    ) -> GatewayResource:
        component = cls(
            uri=AnyUrl(public),
            name=resource.name,
            title=resource.title,
            description=resource.description,
            mime_type=resource.mime_type or "text/plain",
            icons=resource.icons,
            annotations=resource.annotations,
            meta=resource.meta,
        )
        component._proxy = proxy
        # AnyUrl may normalise the URI; the catalog knows it as the upstream wrote it.
        component._public_uri = public
        return component

    async def read(self) -> ResourceResult:
        try:
            result = await self._proxy.read_resource(self._public_uri, current_caller())
        except GatewayError as exc:
            raise ResourceError(str(exc)) from exc
        return ResourceResult(contents=[_content(item) for item in result.contents], meta=result.meta)


def _content(item: types.TextResourceContents | types.BlobResourceContents) -> ResourceContent:
    if isinstance(item, types.BlobResourceContents):
        return ResourceContent(base64.b64decode(item.blob), mime_type=item.mime_type, meta=item.meta)
    return ResourceContent(item.text, mime_type=item.mime_type, meta=item.meta)


class GatewayTemplate(ResourceTemplate):
    """An upstream resource template under its public URI template."""

    _proxy: Proxy = PrivateAttr()
    _template: types.ResourceTemplate = PrivateAttr()

    @classmethod
    def build(cls, public: str, template: types.ResourceTemplate, proxy: Proxy) -> GatewayTemplate:
        component = cls(
            uri_template=public,
            name=template.name,
            title=template.title,
            description=template.description,
            mime_type=template.mime_type or "text/plain",
            icons=template.icons,
            annotations=template.annotations,
            parameters={},
            meta=template.meta,
        )
        component._proxy = proxy
        component._template = template
        return component

    async def create_resource(self, uri: str, params: dict[str, Any]) -> Resource:
        return GatewayResource.build(uri, self._template, self._proxy)


@dataclass(frozen=True)
class _Components:
    version: int
    prompts: dict[str, GatewayPrompt] = field(default_factory=dict)
    resources: dict[str, GatewayResource] = field(default_factory=dict)
    templates: list[GatewayTemplate] = field(default_factory=list)


def _build_components(snapshot: CatalogSnapshot, proxy: Proxy) -> _Components:
    return _Components(
        version=snapshot.version,
        prompts={n: GatewayPrompt.build(n, o.item, proxy) for n, o in snapshot.prompts.items()},
        resources=_resources(snapshot, proxy),
        templates=[GatewayTemplate.build(e.public, e.origin.item, proxy) for e in snapshot.templates],
    )


def _resources(snapshot: CatalogSnapshot, proxy: Proxy) -> dict[str, GatewayResource]:
    built = [GatewayResource.build(uri, origin.item, proxy) for uri, origin in snapshot.resources.items()]
    # Indexed by both spellings, so a client echoing the normalised URI still finds it.
    return {uri: r for r in built for uri in {r._public_uri, str(r.uri)}}  # pyright: ignore[reportPrivateUsage]


class CatalogProvider(Provider):
    """Supplies FastMCP with the catalog's components, rebuilt once per catalog version."""

    def __init__(self, catalog: Catalog, proxy: Proxy) -> None:
        super().__init__()
        self._catalog = catalog
        self._proxy = proxy
        self._components = _Components(version=-1)

    def _current(self) -> _Components:
        snapshot = self._catalog.snapshot
        if self._components.version != snapshot.version:
            self._components = _build_components(snapshot, self._proxy)
        return self._components

    # Each client is shown only what its policy allows (access.current(): its principal).
    # Tools are not here: ``tools/list`` is answered by listing.ToolListing and ``tools/call``
    # of a catalog tool by tool_calls.ToolCalls, straight from the catalog.

    async def _list_prompts(self) -> Sequence[Prompt]:
        return [p for name, p in self._current().prompts.items() if access.visible("prompt", name)]

    async def _get_prompt(self, name: str, version: VersionSpec | None = None) -> Prompt | None:
        return self._current().prompts.get(name) if access.visible("prompt", name) else None

    async def _list_resources(self) -> Sequence[Resource]:
        visible = [r for uri, r in self._current().resources.items() if access.visible("resource", uri)]
        return list({id(r): r for r in visible}.values())

    async def _get_resource(self, uri: str, version: VersionSpec | None = None) -> Resource | None:
        if not access.visible("resource", uri):
            return None  # answered as a URI that does not exist: probing learns nothing
        components = self._current()
        if (listed := components.resources.get(uri)) is not None:
            return listed
        try:
            self._catalog.snapshot.resource(uri)
        except UnknownName:
            return None
        return GatewayResource.build(uri, _template_for(self._catalog.snapshot, uri), self._proxy)

    async def _list_resource_templates(self) -> Sequence[ResourceTemplate]:
        return [t for t in self._current().templates if access.visible("resource", t.uri_template)]


def _template_for(snapshot: CatalogSnapshot, uri: str) -> types.ResourceTemplate:
    for entry in snapshot.templates:
        if uri.startswith(entry.prefix) and entry.matcher.match(uri) is not None:
            return entry.origin.item
    raise UnknownName("resource", uri)
