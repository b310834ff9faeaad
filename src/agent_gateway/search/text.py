"""Text analysis for the tool index: identifiers split into words, stop words dropped, stems.

The same analysis runs on tool definitions and on queries, so ``getMergeRequest``,
``get_merge_request`` and "get the merge requests" all become ``get merg request``.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

import Stemmer

_WORD = re.compile(r"[^\W_]+")
# Boundaries inside one identifier: fooBar, FOOBar, foo2bar.
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")

_STOP = """a an the and or but nor of to in on at by for from with without into onto about as is are was
    were be been being am do does did done doing have has had having i me my mine we us our ours you
    your yours he him his she her it its they them their theirs this that these those there here
    what which who whom whose when where why how please pls can could would should will shall may
    might must let lets just also some any each every very so too then than if else via per using
    use want wants wanted need needs like thing things something stuff currently
    one"""
STOP_WORDS = frozenset(_STOP.split())

_stemmer = Stemmer.Stemmer("english")


def split_identifier(token: str) -> list[str]:
    """``getMergeRequest`` -> get, merge, request; ``GitHub`` -> github, git, hub (the joined
    form is kept too, since products are written as one word as often as two)."""
    parts = _CAMEL.findall(token)
    if len(parts) <= 1:
        return [token.lower()]
    lowered = [p.lower() for p in parts]
    # k8s, s3, ec2 and GitHub are names as written; getMergeRequest is only its words.
    whole = token[:1].isupper() or any(c.isdigit() for c in token)
    return [token.lower(), *lowered] if whole else lowered


def words(text: str) -> list[str]:
    """Lower-cased words of ``text``, identifiers split, stop words kept (callers decide)."""
    normalized = unicodedata.normalize("NFKC", text)
    out: list[str] = []
    for token in _WORD.findall(normalized):
        out.extend(split_identifier(token))
    return out


def terms(text: str) -> list[str]:
    """The stems of ``text``'s content words, in order, repeats kept (for term frequency)."""
    normalized = unicodedata.normalize("NFKC", text)
    return [t for token in _WORD.findall(normalized) for t in _token_terms(token)]


def _token_terms(token: str) -> tuple[str, ...]:
    """One token's stems. Cached, but for long tokens (hashes, ids, base64): tool texts
    repeat the same few thousand words, and indexing 10,000 tools analyses ~300,000 tokens."""
    return _cached_token_terms(token) if len(token) <= _CACHED_TOKEN else _analysed_token(token)


_CACHED_TOKEN = 40


def _analysed_token(token: str) -> tuple[str, ...]:
    return tuple(
        _stemmer.stemWord(w)
        for w in split_identifier(token)
        if (len(w) > 1 or w.isdigit()) and w not in STOP_WORDS
    )


_cached_token_terms = lru_cache(maxsize=65_536)(_analysed_token)
