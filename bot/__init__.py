"""The entry points: the server process, the Slack surface, the web server and the ``kb`` command.

Imports ``core`` and ``index``; nothing imports ``bot``. Its top-level modules
are public as they are: ``settings``, ``app``, ``conversation``, ``logs``, ``docs``.
"""
