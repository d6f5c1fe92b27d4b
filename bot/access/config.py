"""What the access rule needs to know: the directory's credentials, whom the knowledge base serves.

Built at the entry point from the product's one settings object
(``bot.settings.Settings.access_config``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["AccessConfig"]

DEFAULT_SLACK_API_URL = "https://slack.com/api/"


@dataclass(frozen=True)
class AccessConfig:
    """The directory (Slack) and the organisation served.

    Attributes:
        bot_token: ``xoxb-...``, to ask Slack who is who and in which channel;
            empty: nobody can say, and only the documents for everyone are read.
        api_url: Slack Web API base URL (a test server in tests).
        allow_external: serve people of other organisations too (``KB_ALLOW_EXTERNAL``).
    """

    # Secrets never in a repr: a repr ends up in tracebacks and logs.
    bot_token: str = field(default="", repr=False)
    api_url: str = DEFAULT_SLACK_API_URL
    allow_external: bool = False
