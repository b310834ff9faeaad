"""Which conversation an ``ask_agent`` run is on, in whose space.

Every client's threads live in a space of its own, named by a digest of its identity: no
other client can name (and so read) them, whatever its subject or the ids it sends
(subjects with ``/`` or ``:`` in them, or called ``anonymous``, cannot reach into another's).
"""

from __future__ import annotations

import hashlib

from agent_gateway import access
from agent_gateway.downstream.caller import Caller


def thread_of(
    conversation_id: str | None, client: access.Principal, caller: Caller | None, run_id: str
) -> str:
    """The run's thread: ``conversation_id`` (or the session's own) in ``client``'s space; an
    id that already carries the space (a ``thread_id`` the client was given) is kept."""
    wanted = conversation_id or _default_thread(caller, run_id)
    if client is access.OPERATOR:  # the operator's own command line: any thread
        return wanted
    space = space_of(client)
    return wanted if wanted.startswith(space) else space + wanted


def holds(client: access.Principal, thread: str) -> bool:
    """Whether ``thread`` is in ``client``'s space (the operator's: every thread)."""
    return client is access.OPERATOR or thread.startswith(space_of(client))


def space_of(client: access.Principal) -> str:
    """The prefix of every thread of ``client``."""
    if not client.authenticated:
        return anonymous_space(client.label)
    return "c" + _digest(client.subject) + ":"


def anonymous_space(label: str) -> str:
    """The space of the anonymous client ``label`` (``anonymous@`` its address): one per
    address, as every other bound of anonymous clients is. One space for all of them let a
    client at one address read another's conversation, and write into it, by its name."""
    return "a" + _digest(label) + ":"


def owner_of(client: access.Principal) -> str:
    """Whose a thread is, for the bound on threads per client: a digest of the client's label
    (its subject, or an anonymous client's address), neither kept in the clear."""
    return _digest(client.label)


def _digest(name: str) -> str:
    # A lone surrogate is refused in a token's subject (``authentication.py``); one that got by
    # is still a name: its bytes as written (UTF-8 holds no such bytes, so none is another's).
    return hashlib.sha256(name.encode(errors="surrogatepass")).hexdigest()[:32]


def _default_thread(caller: Caller | None, run_id: str) -> str:
    # A session's own thread has a random id, never the session id (which upstreams see).
    # A modern-era request is a session of its own: a fresh thread, returned for continuing.
    if caller is not None and not caller.modern:
        return caller.session.conversation
    return f"run-{run_id}"
