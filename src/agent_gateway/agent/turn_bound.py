"""How much a run's own turn may hold: checked before each model call and each tool step
(``within_reach``), and held within a tool step, whose results are cut to what is left
(``fitted``).

The model's view keeps the current turn whole, however far past the context window, so
without a bound a run's turn (sent to the model, stored at every step) grows with what its
model asks for and its tools return.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.messages import AnyMessage, ToolMessage
from langchain_core.messages.utils import count_tokens_approximately

from agent_gateway.agent.calls import Outcome
from agent_gateway.agent.results import cut_links
from agent_gateway.errors import AgentError

RUN_WINDOWS = 4
"""A run's own turn may hold this many context windows (``agent.max_context_tokens``) at most."""
_RUN_FLOOR = 128_000
"""...and at least this many tokens, so a whole query (100,000 characters) always fits."""
_CHARS_PER_TOKEN = 4
"""As ``count_tokens_approximately`` counts."""


def turn_limit(max_tokens: int) -> int:
    """The tokens a model view may hold at most, for a context window of ``max_tokens``."""
    return max(RUN_WINDOWS * max_tokens, _RUN_FLOOR)


def within_reach(view: Sequence[AnyMessage], max_tokens: int) -> int:
    """The tokens the model ``view`` may still take before it is far past the context window.

    A model whose calls echo large results (its client's own, through sampling) made each
    step's stored state larger: 288 calls of 15,000 characters kept 13 MB per thread and
    wrote 320 MB to SQLite in one run, none of which a model window could take.

    Raises:
        AgentError: the view holds more than ``RUN_WINDOWS`` windows.
    """
    limit = turn_limit(max_tokens)
    if (held := count_tokens_approximately(view)) > limit:
        raise AgentError(
            f"the run's conversation holds about {held:,} tokens, more than {limit:,} "
            f"({RUN_WINDOWS} times agent.max_context_tokens); ask for less at once"
        )
    return limit - held


def fitted(outcomes: Sequence[Outcome], left: int, limit: int) -> list[Outcome]:
    """``outcomes`` with their results adding at most ``left`` tokens to the turn: whole, in
    the model's order, while they fit; then the one that does not cut to what is left, and
    each after it to a note. The model reads the note in the result, the record in the call's
    ``result_cut``.

    One tool step runs up to 32 calls of up to 100,000 characters each: 800,000 tokens were
    stored in the thread (and written at the step's end) before the next model call's check
    ended the run, and the model never learnt why.
    """
    notes = [_cut(message, 0, limit) for message, _ in outcomes]
    left -= count_tokens_approximately(notes)  # every result keeps at least its note
    out: list[Outcome] = []
    for (message, record), note in zip(outcomes, notes, strict=True):
        more = count_tokens_approximately([message]) - count_tokens_approximately([note])
        if more <= left:  # a short result (shorter than its note) is kept whole too
            left -= max(more, 0)
            out.append((message, record))
            continue
        kept = max(left - 1, 0) * _CHARS_PER_TOKEN  # a token spare for the count's rounding
        left = 0
        noted = record.copy()
        noted["result_cut"] = _why(len(message.text), kept, limit)
        out.append((_cut(message, kept, limit), noted))
    return out


def _cut(message: ToolMessage, kept: int, limit: int) -> ToolMessage:
    text = message.text
    note = f"[{_why(len(text), kept, limit)}; ask for less at once]"
    content = f"{text[:kept]}\n{note}" if kept else note
    return message.model_copy(update={"content": content, "artifact": cut_links(message.artifact, kept)})


def _why(size: int, kept: int, limit: int) -> str:
    return (
        f"{size - kept:,} of this result's {size:,} characters cut by the gateway: the run's turn "
        f"holds at most about {limit:,} tokens ({RUN_WINDOWS} times agent.max_context_tokens)"
    )
