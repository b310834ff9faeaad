"""``ask_agent``: the gateway's own LangGraph agent over the federated catalog.

Nothing is imported here: ``tool`` and ``request`` (what a gateway needs to list and route
``ask_agent``) load without LangChain and LangGraph, which ``runner`` brings (~0.5 s of CPU,
imported while the upstreams connect: ``Gateway.running``).
"""
