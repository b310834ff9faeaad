"""What a request asks done, and what a tool does: read, create, change, delete or send.

A request's object finds the tools; its action chooses among them. "what's on my calendar
tomorrow" shares "calendar" with every calendar tool of a server alike, and BM25 alone ranks
``decline-calendar-event`` and ``create-calendar`` next to ``list-calendar-events``. A question
asks to read; "add another node pool" asks to create. A tool's action is the first verb of its
name (``get_merge_request``, ``doks-create-nodepool``, ``CreateMessage``). When both are
known and one cannot serve the other, the rerank lowers the tool (``index.ToolIndex``).

Only a request's first words are read: requests to an agent lead with their verb or their
question ("please", "can you" and the like skipped), and a verb further on is as often the
object's ("find the email about the failed deploy"). When in doubt it says nothing (None),
and nothing is lowered: a word that is as often a noun ("email", "file", "new", "schedule")
counts as a verb only when an object follows it ("email the report", "file a bug"), not in a
phrase such as "email search" or "file upload".
"""

from __future__ import annotations

import unicodedata
from typing import Literal

from agent_gateway.search.text import words

Action = Literal["read", "create", "change", "delete", "send"]


def _each(action: Action, text: str) -> dict[str, Action]:
    return dict.fromkeys(_words(text), action)


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_TOOL_VERBS: dict[str, Action] = {
    **_each(
        "read",
        "get list search find fetch read retrieve describe show query view lookup count check "
        "inspect browse explore discover download export analyze analyse summarize preview",
    ),
    **_each("create", "create add new insert make register generate provision copy fork upload"),
    **_each(
        "change",
        "update edit modify set patch change rename move transition assign mark replace resize "
        "configure enable disable reschedule upsert accept decline approve reject respond "
        "acknowledge snooze cancel stop kill terminate write merge run execute",
    ),
    **_each("delete", "delete remove drop destroy purge trash erase unregister archive"),
    **_each("send", "send post reply forward broadcast notify push publish"),
}
"""A tool name's first verb -> its action (words of ``text.words``, lower case)."""

_MANY = frozenset({"manage"})
"""A tool name's verb that stands for several actions (``manage_task``): no action known."""

_METHODS = frozenset({"post", "put", "patch"})
"""HTTP methods that lead the names of tools made from an OpenAPI document
(``API-post-search``): the verb after them, if any, says what the tool does."""

_READ_LEADS = _words(
    "what whats which who whos whose how where when why is are was were do does did any has "
    "have show list find get fetch look see check view read search catch count"
)
"""A request's first word that asks to read: a question, or a request to be shown."""

_REQUEST_VERBS: dict[str, Action] = {
    **_each("create", "create add make register"),
    **_each("change", "update edit change modify move rename set assign bump close resolve reopen"),
    **_each("delete", "delete remove destroy purge trash wipe erase"),
    **_each("send", "send tell dm notify ping reply announce"),
}
"""A request's first verb -> the action it asks."""

_NOUN_ALIKE: dict[str, Action] = {
    **_each("create", "new file draft schedule book"),
    **_each("change", "mark push raise lower scale resize enable disable turn transition"),
    **_each("delete", "drop"),
    **_each("send", "email mail text message post"),
}
"""Verbs that are as often nouns or adjectives ("email search", "new issues", "file upload",
"push notifications"): a request's first word only when an object follows it."""

_OBJECT_LEADS = _words(
    "a an the this that these those my our your his her their its it them him me us all some every to"
)
"""Words that, after a noun-alike verb, show it is one: its object or its recipient follows."""

_TO_READER = frozenset({"me", "us"})
"""After a send verb, the asker itself: "tell me who is on call", "send me the invoice" ask to read."""

_PHRASES: dict[tuple[str, str], Action] = {
    ("get", "rid"): "delete",
    ("spin", "up"): "create",
    ("set", "up"): "create",
    ("spin", "down"): "delete",
    ("give", "me"): "read",
    ("give", "us"): "read",
}
"""Two-word leads whose first word alone says otherwise (or nothing)."""

_PREAMBLE = _words("please pls can could would will you we i let lets quickly just go ahead and")
"""Words a request may lead with before its verb."""

_LEAD_CHARS = 120
"""What of a request is read for its action: its lead, before it runs on (an agent's query
goes on into the conversation, whose questions are not the request's)."""

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
"""(asked, done): a tool doing ``done`` cannot serve a request asking ``asked``. Writes of other
kinds can: adding a label is an update, posting a comment creates one, a message is sent or
created, and removing a label changes its issue."""


def requested(query: str) -> Action | None:
    """The action ``query`` asks for, from its first words; None when they do not say."""
    lead = _first_sentence(unicodedata.normalize("NFKC", query[:_LEAD_CHARS]))
    said = words(lead)
    start = next((i for i, w in enumerate(said) if w not in _PREAMBLE), len(said))
    if start == len(said):
        return None
    first, after = said[start], said[start + 1] if start + 1 < len(said) else ""
    if (first, after) in _PHRASES:
        return _PHRASES[first, after]
    if first in _READ_LEADS:
        return "read"
    asked = _REQUEST_VERBS.get(first)
    if asked is None and after in _OBJECT_LEADS:
        asked = _NOUN_ALIKE.get(first)
    if asked == "send" and after in _TO_READER:
        return "read"
    if asked is None and lead.rstrip().endswith("?"):
        return "read"
    return asked


def _first_sentence(text: str) -> str:
    """``text`` up to its first question mark or full stop followed by a space, that included."""
    for i, char in enumerate(text):
        if char in "?." and (i + 1 == len(text) or text[i + 1].isspace()):
            return text[: i + 1]
    return text


def performed(name: str) -> Action | None:
    """The action of a tool called ``name``: its name's first verb, if any."""
    said = words(name)
    for i, word in enumerate(said):
        if word in _MANY:
            return None
        action = _TOOL_VERBS.get(word)
        if action is None:
            continue
        if word in _METHODS:
            later: Action | None = next((_TOOL_VERBS[w] for w in said[i + 1 :] if w in _TOOL_VERBS), None)
            return later if later is not None else action
        return action
    return None


def conflicts(asked: Action | None, done: Action | None) -> bool:
    """Whether a tool doing ``done`` cannot serve a request asking ``asked``."""
    return asked is not None and done is not None and (asked, done) in _CONFLICTS
