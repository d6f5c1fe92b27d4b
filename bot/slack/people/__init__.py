"""The people the Slack surface serves: who they are and what they may do.

``directory`` caches what Slack says of people and channels; ``roles`` who is an
admin or a publisher; ``audience`` this workspace's members vs. people of other
organisations (Slack Connect); ``signin`` Sign in with Slack for the viewer.
"""

from __future__ import annotations

from bot.slack.people.audience import Audience, Place, channel_readers
from bot.slack.people.directory import Directory
from bot.slack.people.roles import Roles

__all__ = ["Audience", "Directory", "Place", "Roles", "channel_readers"]
