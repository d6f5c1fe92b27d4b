"""Who may read what, attacked through what the bot says back to the attacker.

A guest of the workspace reads no document for everyone (``bot.access``). The
knowledge base keeps one document for the same bytes in the same scope, so an
upload of bytes already there is told so, naming the document: sent by a guest,
that would name a document for everyone, and say it exists, to someone the rule
never lets read it. The upload goes through Slack as the guest would send it: a
file shared in their DM with the bot, a signed event, the mock Slack Web API.
"""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("tests.conftest_bot")

from bot.slack import messages  # noqa: E402
from tests.conftest_bot import HANDBOOK, Bot  # noqa: E402
from tests.servers import USER_ID, file_share_event  # noqa: E402

GUEST = "U0GUEST001"


@pytest.mark.parametrize("sender", ["a member", "a guest"])
async def test_a_guest_learns_nothing_of_a_document_for_everyone_by_sending_its_bytes(
    bot: Bot, sender: str
) -> None:
    bot.slack.set_user(GUEST, name="gina").update(is_restricted=True)
    user = GUEST if sender == "a guest" else USER_ID
    documents = len(bot.kb.store.documents())
    f = bot.slack.add_file("F0HANDBOOK", "mine.md", HANDBOOK, "text/markdown")
    await bot.event(file_share_event([f], user=user, channel="D0DMSENDER"))
    await bot.settle(1)
    told = bot.statuses()[-1]
    if sender == "a member":  # who reads the handbook is told it is there already
        assert told == messages.upload_duplicate("handbook.md", 2)
        return
    assert told == messages.upload_not_a_reader("mine.md")
    assert "handbook" not in " ".join(bot.statuses()).lower()
    assert len(bot.kb.store.documents()) == documents, "nothing was added or read"
    assert not bot.slack.calls("files.info") and not bot.slack.downloads
