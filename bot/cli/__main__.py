"""``python -m bot.cli``: the ``kb`` command without its console script."""

from bot.cli import main

main()
