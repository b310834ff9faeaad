"""What a request asks done, and what a tool does: read, create, change, delete or send.

A request's object finds the tools; its action chooses among them. "what's on my calendar
tomorrow" shares "calendar" with every calendar tool of a server alike, and BM25 alone ranks
``decline-calendar-event`` and ``create-calendar`` next to ``list-calendar-events``. A question
asks to read; "add another node pool" asks to create. A tool's action is the first verb of its
name (``get_merge_request``, ``doks-create-nodepool``, ``CreateMessage``). When both are
known and they disagree, the rerank lowers the tool (``index.ToolIndex``).

Only a request's first words are read: requests to an agent lead with their verb or their
question ("please", "can you" and the like skipped), and a verb further on is as often the
object's ("find the email about the failed deploy").
"""

from __future__ import annotations

from typing import Literal

from agent_gateway.search.text import words

Action = Literal["read", "create", "change", "delete", "send"]


def _split(words: str) -> list[str]:
    return words.split()


def _each(action: Action, words: str) -> dict[str, Action]:
    return dict.fromkeys(_split(words), action)


_TOOL_VERBS: dict[str, Action] = {
    **_each(
        "read",
        "get list search find fetch read retrieve describe show query view lookup count check "
        "inspect browse explore discover download export analyze analyse summarize preview",
    ),
    **_each("create", "create add new insert make register generate provision"),
    **_each(
        "change",
        "update edit modify set patch change rename move transition assign mark replace resize "
        "configure enable disable reschedule upsert accept decline approve reject respond "
        "acknowledge snooze cancel stop kill terminate",
    ),
    **_each("delete", "delete remove drop destroy purge trash erase unregister"),
    **_each("send", "send post reply forward broadcast notify push publish"),
}
"""A tool name's first verb -> its action (words of ``text.words``, lower case)."""

_QUESTION = frozenset(
    _split(
        "what whats which who whos whose how where when why is are was were do does did any has have "
        "show list find get fetch look see check view read search catch count give"
    )
)
"""A request's first word that asks to read (a question, or a request to be shown)."""

_REQUEST_VERBS: dict[str, Action] = {
    **_each("create", "create add new make file spin register schedule book draft start"),
    **_each(
        "change",
        "update edit change modify move rename set mark assign push bump close resolve reopen "
        "transition raise lower scale resize enable disable turn",
    ),
    **_each("delete", "delete remove drop destroy purge trash wipe erase"),
    **_each("send", "send tell dm text email mail post message ping notify reply announce"),
}
"""A request's first verb -> the action it asks."""

_PREAMBLE = frozenset(
    _split("please pls can could would will you we i us let lets me quickly just go ahead and")
)
"""Words a request may lead with before its verb."""

_WRITES: tuple[Action, ...] = ("create", "change", "delete", "send")
_CONFLICTS: frozenset[tuple[Action, Action]] = frozenset(
    [
        *(("read", done) for done in _WRITES),
        *((asked, "read") for asked in _WRITES),
        ("create", "delete"),
        ("delete", "create"),
        ("change", "delete"),
        ("send", "delete"),
        ("delete", "send"),
    ]
)
"""(asked, done) pairs that cannot serve each other. Writes of other kinds can: adding a label
is an update, posting a comment creates one, a message is sent or created."""


def requested(query: str) -> Action | None:
    """The action ``query`` asks for, from its first words; None when they do not say."""
    lead = [w for w in words(query[:_LEAD_CHARS]) if w not in _PREAMBLE][:1]
    if not lead:
        return None
    first = lead[0]
    if first in _QUESTION:
        return "read"
    asked = _REQUEST_VERBS.get(first)
    return "read" if asked is None and query.rstrip().endswith("?") else asked


_LEAD_CHARS = 80


def performed(name: str) -> Action | None:
    """The action of a tool called ``name``: its name's first verb, if any."""
    for word in words(name):
        action = _TOOL_VERBS.get(word)
        if action is not None:
            return action
    return None


def conflicts(asked: Action | None, done: Action | None) -> bool:
    """Whether a tool doing ``done`` cannot serve a request asking ``asked``."""
    return asked is not None and done is not None and (asked, done) in _CONFLICTS
