"""Tool search: the lexical index over the catalog, ``search_tools`` / ``call_tool``, and what
the agent's model is offered."""
