"""The client side of the gateway: its sessions (``sessions.py``), one request being served
and the relays back to its client (``caller.py``), telling clients the catalog changed
(``notifier.py``), and resource subscriptions (``subscriptions.py``)."""
