"""Every use of a third-party library's internals, one module per library.

Nothing else in ``agent_gateway`` reaches a private member, a private module or a private
schema of a dependency: it goes through here. ``tests/test_compat.py`` asserts that each
member still exists with the shape used, so an upgrade that moves one fails that test,
naming it, instead of failing silently at run time. The versions verified are pinned as
compatible releases in ``pyproject.toml``:

- ``mcp`` 2.3.0 (``mcp.py``, and ``deferred.py``: the SDK's Streamable HTTP transport and
  FastMCP's session manager, answering a call that sends nothing before its result as JSON;
  ``replay.py``: a GET's ``Last-Event-ID`` with no event store; ``idle.py``: a client's
  session idle the longest, ended to make room for its next);
- ``fastmcp`` 4.2.3 (``fastmcp.py``);
- ``httpx2`` 2.17 (``httpx2.py``);
- ``websockets`` 17.4 (``websockets.py``);
- ``langchain-anthropic`` 1.7 and ``langchain-openai`` 1.8 (``langchain.py``);
- ``langgraph`` 1.2 with ``langgraph-checkpoint`` 4.3 and ``langgraph-checkpoint-sqlite``
  3.1 (``langgraph.py``).
"""
