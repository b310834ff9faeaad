"""What may be printed or logged of a URL: its credentials and query values hidden, whether
it is one URL the gateway was configured with or any URL in a line of text."""

from __future__ import annotations

import re

_USERINFO = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]+@")
_QUERY_VALUE = re.compile(r"([?&][^=\s&#?]+=)[^&\s#\"']+")


def redacted_url(text: str) -> str:
    """``text`` with every URL's credentials (``user:password@``) and query values
    (``?api_key=…``) replaced by ``***``: what may be printed or logged of a URL."""
    return _QUERY_VALUE.sub(r"\1***", _USERINFO.sub(r"\1***@", text))


def without_password(url: str) -> str:
    """``url`` without its password, for log lines and errors: before the ``@``, or in the
    query (``?password=…``, which Redis and Postgres clients read too: every query value)."""
    url, question, query = url.partition("?")
    if question:  # each value hidden, each name kept (it says what was set)
        query = "&".join(
            part.partition("=")[0] + ("=***" if "=" in part else "") for part in query.split("&")
        )
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if at:
        user = userinfo.split(":", 1)[0]
        url = f"{scheme}{sep}{user}:***@{host}" if user else f"{scheme}{sep}***@{host}"
    return f"{url}{question}{query}"
