"""Driving the Home tab in tests: an admin's bot, opening the tab, clicking its buttons."""

from __future__ import annotations

import json
from typing import Any

from tests.conftest_bot import ADMIN_ID, Bot, BotFactory
from tests.servers import DM_CHANNEL_ID, TEAM_ID, block_actions_body, button_action, slack_ts


async def admin_bot(make_bot: BotFactory, **overrides: Any) -> Bot:
    """The bot with ``ADMIN_ID`` as its admin, whose views wait for the knowledge gaps
    however loaded the machine (each test counts the views it gets)."""
    bot = await make_bot(admin_users=ADMIN_ID, **overrides)
    bot.services.home.gaps.wait_seconds = 15.0
    return bot


async def open_home(bot: Bot, user: str) -> dict[str, Any]:
    """Open the Home tab as ``user``; the view published for them."""
    published = len(bot.slack.calls("views.publish"))
    event = {
        "type": "app_home_opened",
        "user": user,
        "channel": DM_CHANNEL_ID,
        "tab": "home",
        "event_ts": slack_ts(),
    }
    await bot.event(event)
    return await published_view(bot, user, published + 1)


async def published_view(bot: Bot, user: str, count: int) -> dict[str, Any]:
    """The view of the ``count``-th ``views.publish``, once it happened (it is for ``user``)."""
    calls = await bot.slack.wait_for("views.publish", count)
    call = calls[count - 1]
    assert call["user_id"] == user
    view = call["view"]
    return dict(json.loads(view) if isinstance(view, str) else view)


async def click_home(bot: Bot, user: str, action_id: str, value: str, team: str = TEAM_ID) -> None:
    """Click a button of ``user``'s Home tab as Slack reports it (from ``team``)."""
    view = bot.slack.home_views.get(user) or {"id": "V0NONE", "type": "home"}
    body = block_actions_body(
        [button_action(action_id, value)], user_id=user, view=view, team_id=team
    )
    assert (await bot.post(body)).status == 200
