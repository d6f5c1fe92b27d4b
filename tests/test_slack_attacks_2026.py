"""Attacks on the Slack surfaces of App Home, "Ask a person" and the saved calibration.

Each test is an attack an outsider (or a member reaching past their rights)
could make; each one failed before the fix it names.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from bot.slack import messages

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.conftest_bot import ADMIN_ID, Bot, BotFactory  # noqa: E402
from tests.query_factory import log_question  # noqa: E402
from tests.servers import CHANNEL_ID, DM_CHANNEL_ID, USER_ID, slack_ts  # noqa: E402

SECRET_ANSWER = "Project Falcon launches on 14 March at the Berlin office [1]."


async def _admin_bot(make_bot: BotFactory, **overrides: Any) -> Bot:
    bot = await make_bot(admin_users=ADMIN_ID, **overrides)
    bot.services.home.gaps.wait_seconds = 15.0
    return bot


async def _open_home(bot: Bot, user: str) -> dict[str, Any]:
    published = len(bot.slack.calls("views.publish"))
    event = {
        "type": "app_home_opened",
        "user": user,
        "channel": DM_CHANNEL_ID,
        "tab": "home",
        "event_ts": slack_ts(),
    }
    await bot.event(event)
    calls = await bot.slack.wait_for("views.publish", published + 1)
    call = calls[published]
    assert call["user_id"] == user
    view = call["view"]
    return dict(json.loads(view) if isinstance(view, str) else view)


def _text(view: dict[str, Any]) -> str:
    return json.dumps(view["blocks"], ensure_ascii=False)


def _chunk_of(bot: Bot, name: str) -> int:
    doc = bot.kb.store.find_document(name)
    return int(bot.kb.chunks(doc.id)[0]["id"])


# ---------------------------------------------------------------- channel scopes


async def test_answers_to_review_never_show_what_a_channels_documents_said(
    make_bot: BotFactory,
) -> None:
    """An admin need not be in the channel: a thumbs-down answer written from that
    channel's documents (or a related-passages reply naming them) is withheld, as the
    hand-off withholds it; an answer from documents for everyone is still shown."""
    bot = await _admin_bot(make_bot)
    falcon = _chunk_of(bot, "falcon.md")
    where = {"channel": CHANNEL_ID, "thread_id": "1700000000.000100"}
    secret = log_question(
        bot.kb.store,
        "When does Project Falcon launch?",
        answer=SECRET_ANSWER,
        kept=[(falcon, 0.2)],
        cited=[falcon],
        **where,
    )
    related = log_question(
        bot.kb.store,
        "Falcon budget?",
        outcome="related",
        answer="Possibly related: falcon.md, Project Falcon > Launch",
        kept=[(falcon, 0.5)],
        **where,
    )
    public = log_question(bot.kb.store, "Why is the sky blue?", answer="Rayleigh scattering.")
    for qid in (secret, related, public):
        bot.kb.store.add_feedback(qid, -1, USER_ID)

    text = _text(await _open_home(bot, ADMIN_ID))
    assert "When does Project Falcon launch?" in text, "the question itself is listed"
    assert "14 March" not in text and "Berlin" not in text
    assert "falcon.md" not in text
    assert "Rayleigh scattering." in text
    assert messages.HOME_ANSWER_WITHHELD in text
