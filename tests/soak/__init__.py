"""The soak: minutes of mixed traffic and faults against the real server (``-m soak``, opt-in)."""
