"""Review AK: a listing refused for a collision, kept and tried again at a reload."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import pytest

from agent_gateway.catalog import Catalog, CatalogChange
from agent_gateway.catalog_parts import Listing
from agent_gateway.config import GatewayConfig
from agent_gateway.config_files import parse_config
from agent_gateway.errors import ConfigError
from agent_gateway.pins import Pins

URL = "http://127.0.0.1:9/mcp"


def listing(*names: str) -> Listing:
    return Listing(
        tools=tuple(
            types.Tool(name=n, description=f"{n} tool", input_schema={"type": "object"}) for n in names
        )
    )


def config(**upstreams: dict[str, Any]) -> GatewayConfig:
    return parse_config(
        {"upstreams": {n: {"url": f"{URL}/{n}", "prefix": False, **u} for n, u in upstreams.items()}},
        {},
        source="t",
    )


async def test_a_reload_does_not_serve_the_withheld_listing_of_an_upstream_hidden_while_down() -> None:
    # b (failure_mode: hide) lists a tool of a's name: refused, withheld. b goes down: its part
    # is hidden. A reload renames a's tool: b's withheld listing no longer collides ... but b is
    # still down, and its tools must stay hidden until it lists again.
    catalog = Catalog(config(a={}, b={"failure_mode": "hide"}))
    await catalog.update("a", listing("x"))
    await catalog.update("b", listing("y"))
    catalog.start()
    await catalog.update("b", listing("y", "x"))
    assert "b" in catalog.problems
    await catalog.withdraw("b")
    assert set(catalog.snapshot.tools) == {"x"}
    await catalog.reconfigure(config(a={"rename": {"x": "ax"}}, b={"failure_mode": "hide"}), [])
    assert set(catalog.snapshot.tools) == {"ax"}  # fails at 556ab77: {'ax', 'x', 'y'}: b's, while b is down


async def test_a_reload_refused_for_a_collision_leaves_the_hidden_parts_names_as_they_were() -> None:
    # "ConfigError: the new names collide; nothing was changed". a (hide) is down, its part
    # hidden under the name p; the refused reload would have renamed it q. b's later listing
    # of p must be refused (p is still a's) so that a, back, is not refused for its own name.
    old = config(a={"failure_mode": "hide"}, b={}, c={})
    catalog = Catalog(old)
    await catalog.update("a", listing("p"))
    await catalog.update("b", listing("w"))
    await catalog.update("c", listing("z"))
    catalog.start()
    await catalog.withdraw("a")
    new = config(a={"failure_mode": "hide", "rename": {"p": "q"}}, b={}, c={"rename": {"z": "w"}})
    with pytest.raises(ConfigError):
        await catalog.reconfigure(new, [])
    await catalog.update("b", listing("w", "p"))
    assert (
        "b" in catalog.problems
    )  # fails at 556ab77: the hidden part is a's under the refused reload's names


async def test_a_repaired_listing_is_told_to_clients() -> None:
    catalog = Catalog(config(a={}, b={}))
    changes: list[CatalogChange] = []

    async def told(change: CatalogChange) -> None:
        changes.append(change)

    catalog.subscribe(told)
    await catalog.update("a", listing("x"))
    await catalog.update("b", listing("y"))
    catalog.start()
    await catalog.update("b", listing("y", "x"))
    await catalog.reconfigure(config(a={"rename": {"x": "ax"}}, b={}), [])
    assert set(catalog.snapshot.tools) == {"ax", "x", "y"}
    assert catalog.snapshot.tools["x"].upstream == "b"
    assert "b" in changes[-1].upstreams
    assert "tools" in changes[-1].lists
    assert catalog.problems == {}


async def test_a_withheld_listing_of_an_upstream_removed_or_restarted_is_dropped_with_its_problem() -> None:
    catalog = Catalog(config(a={}, b={}))
    await catalog.update("a", listing("x"))
    await catalog.update("b", listing("y"))
    catalog.start()
    await catalog.update("b", listing("y", "x"))
    await catalog.reconfigure(config(a={}, b={"timeout": 7}), ["b"])  # restarted
    assert catalog.problems == {}
    assert set(catalog.snapshot.tools) == {"x"}
    await catalog.reconfigure(config(a={"rename": {"x": "ax"}}, b={"timeout": 7}), [])
    assert set(catalog.snapshot.tools) == {"ax"}  # the old process's withheld listing is not served
    await catalog.update("b", listing("y", "ax"))
    await catalog.reconfigure(config(a={"rename": {"x": "ax"}}), ["b"])  # removed
    assert catalog.problems == {}
    assert set(catalog.snapshot.tools) == {"ax"}


def tool(name: str, description: str) -> types.Tool:
    return types.Tool(name=name, description=description, input_schema={"type": "object"})


async def _refused_change() -> tuple[Pins, Catalog]:
    pins = Pins(None, "hold")
    catalog = Catalog(config(a={}, b={}), review=pins.review)
    await catalog.update("a", listing("x"))
    await catalog.update("b", Listing(tools=(tool("y", "v1"),)))
    catalog.start()
    # b's next listing changes y (flagged, pending) and takes a's x: refused, withheld.
    await catalog.update("b", Listing(tools=(tool("y", "v2"), tool("x", "b's"))))
    assert "b" in catalog.problems
    assert pins.pending() == 1
    return pins, catalog


async def test_a_tool_held_after_a_reload_that_retried_a_refused_listing_can_be_accepted() -> None:
    # The operator accepts y's change and reloads (README: "A running gateway serves them after
    # a reload"); x still collides. The served part (b's earlier listing) is reviewed first and
    # now holds y (v1 differs from the accepted v2); the retried listing's review then clears
    # the pending flag (v2 is what is pinned): y is held with nothing pending to accept, until b
    # lists again.
    pins, catalog = await _refused_change()
    assert pins.accept(["y"]) == ["y"]
    await catalog.reconfigure(config(a={}, b={}), [])
    assert "y" not in catalog.snapshot.held or pins.pending() == 1  # fails at 556ab77: held, 0 pending


async def test_a_still_refused_listing_retried_at_each_reload_does_not_flag_its_change_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, catalog = await _refused_change()
    caplog.clear()
    for _ in range(3):  # reloads changing nothing of a or b
        await catalog.reconfigure(config(a={}, b={}), [])
    flagged = [r for r in caplog.records if "changed tool y since it was pinned" in r.getMessage()]
    assert len(flagged) <= 1  # fails at 556ab77: 3, one WARNING per reload (the served part's review clears
    # the flag, the withheld listing's sets it again; with a shared database, 2 writes a reload)
