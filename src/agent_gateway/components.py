"""The catalog's prompts, resources and templates as FastMCP lists them, each client shown
only what its policy allows.

Listing only: ``prompts/get``, ``resources/read`` and completions are served by
``pipeline.Pipeline`` straight from the catalog, so these components never render or read.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from fastmcp.prompts.base import Prompt
from fastmcp.resources.base import Resource
from fastmcp.resources.template import ResourceTemplate
from fastmcp.server.providers import Provider
from fastmcp.utilities.versions import VersionSpec
from pydantic import AnyUrl, PrivateAttr

from agent_gateway import access
from agent_gateway.catalog import Catalog, CatalogSnapshot
from agent_gateway.errors import shown

logger = logging.getLogger(__name__)


# Each is listed as its upstream listed it, under its public name or URI: FastMCP's own
# conversion added its tags to ``_meta``, ``required: false`` to the arguments that said
# nothing, ``text/plain`` where no MIME type is known, and dropped a resource's ``size``.


class ListedPrompt(Prompt):
    _listed: types.Prompt = PrivateAttr()

    def to_mcp_prompt(self, **overrides: Any) -> types.Prompt:
        return self._listed.model_copy(update={"name": self.name})


class ListedResource(Resource):
    _listed: types.Resource = PrivateAttr()

    def to_mcp_resource(self, **overrides: Any) -> types.Resource:
        return self._listed.model_copy(update={"uri": str(self.uri)})


class ListedTemplate(ResourceTemplate):
    _listed: types.ResourceTemplate = PrivateAttr()

    def to_mcp_template(self, **overrides: Any) -> types.ResourceTemplate:
        return self._listed.model_copy(update={"uri_template": self.uri_template})


def _prompt(public: str, prompt: types.Prompt) -> Prompt:
    # Its arguments are in what is listed: nothing of FastMCP's reads them (the pipeline gets
    # prompts).
    component = ListedPrompt(
        name=public, title=prompt.title, description=prompt.description, icons=prompt.icons, meta=prompt.meta
    )
    component._listed = prompt
    return component


def _resource(public: str, resource: types.Resource) -> Resource:
    component = ListedResource(
        uri=AnyUrl(public),
        name=resource.name,
        title=resource.title,
        description=resource.description,
        mime_type=resource.mime_type or "text/plain",
        icons=resource.icons,
        annotations=resource.annotations,
        meta=resource.meta,
    )
    component._listed = resource
    return component


def _template(public: str, template: types.ResourceTemplate) -> ResourceTemplate:
    component = ListedTemplate(
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
    component._listed = template
    return component


@dataclass(frozen=True)
class _Components:
    version: int
    prompts: dict[str, Prompt] = field(default_factory=dict)
    resources: dict[str, Resource] = field(default_factory=dict)
    """By public URI."""
    spelled: dict[str, str] = field(default_factory=dict)
    """Public URI by the spelling a client was listed (``AnyUrl`` may normalise it)."""
    templates: list[ResourceTemplate] = field(default_factory=list)


def _build_components(snapshot: CatalogSnapshot) -> _Components:
    resources: dict[str, Resource] = {}
    unlisted: list[str] = []
    for uri, origin in snapshot.resources.items():
        try:
            resources[uri] = _resource(uri, origin.item)
        except ValueError:  # not a URL to FastMCP (``data://a b``, a control character)
            unlisted.append(uri)
    if unlisted:  # one line per catalog version: the upstreams choose how many
        logger.warning(
            "%d resources not listed: their URIs are not URLs (%s, of upstream %s)",
            *(len(unlisted), shown(unlisted[0]), snapshot.resources[unlisted[0]].upstream),
        )
    return _Components(
        version=snapshot.version,
        prompts={n: _prompt(n, o.item) for n, o in snapshot.prompts.items()},
        resources=resources,
        # A URI listed as it is spelled is read as that one (never mapped to another's).
        spelled={str(r.uri): uri for uri, r in resources.items() if str(r.uri) not in resources},
        templates=[_template(e.public, e.origin.item) for e in snapshot.templates],
    )


class CatalogProvider(Provider):
    """Supplies FastMCP with the catalog's listings, rebuilt once per catalog version."""

    def __init__(self, catalog: Catalog) -> None:
        super().__init__()
        self._catalog = catalog
        self._components = _Components(version=-1)

    def _current(self) -> _Components:
        snapshot = self._catalog.snapshot
        if self._components.version != snapshot.version:
            self._components = _build_components(snapshot)
        return self._components

    def public_uri(self, uri: str) -> str:
        """``uri`` as the catalog knows it, from either spelling: the upstream's, or the
        normalised one a client was listed and echoes back."""
        return self._current().spelled.get(uri, uri)

    # Each client is shown only what its policy allows (access.current(): its principal).
    # Tools are not here: ``tools/list`` is answered by listing.ToolListing.

    async def _list_prompts(self) -> Sequence[Prompt]:
        return [p for name, p in self._current().prompts.items() if access.visible("prompt", name)]

    async def _get_prompt(self, name: str, version: VersionSpec | None = None) -> Prompt | None:
        return self._current().prompts.get(name) if access.visible("prompt", name) else None

    async def _list_resources(self) -> Sequence[Resource]:
        return [r for uri, r in self._current().resources.items() if access.visible("resource", uri)]

    async def _get_resource(self, uri: str, version: VersionSpec | None = None) -> Resource | None:
        public = self.public_uri(uri)
        return self._current().resources.get(public) if access.visible("resource", public) else None

    async def _list_resource_templates(self) -> Sequence[ResourceTemplate]:
        return [t for t in self._current().templates if access.visible("resource", t.uri_template)]

    async def _get_resource_template(
        self, uri: str, version: VersionSpec | None = None
    ) -> ResourceTemplate | None:
        return None  # reads through a template are served by the pipeline, never by FastMCP
