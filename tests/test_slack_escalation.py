"""Ask a person: the button under answers, the hand-off in KB_ESCALATION_CHANNEL, once per question."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from bot.slack import escalation, messages
from bot.slack.blocks import ASK_A_PERSON_ACTION_ID, render_answer, render_notice
from bot.slack.words import words_for
from core.answer import Answer, Outcome
from index.storage.store import Store

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.clocks import FakeTime  # noqa: E402
from tests.conftest_bot import (  # noqa: E402
    FALCON_Q,
    IN_DOMAIN,
    OUT_OF_DOMAIN,
    Bot,
    BotFactory,
    make_settings,
)
from tests.servers import (  # noqa: E402
    CHANNEL_ID,
    DM_CHANNEL_ID,
    TEAM_ID,
    USER_ID,
    app_mention_event,
    block_actions_body,
    button_action,
    message_im_event,
)

ESCALATION = "C0HANDOFF01"
COLLEAGUE = "U0COLLEAG01"


@pytest.fixture
async def bot(make_bot: BotFactory) -> Bot:
    """The bot with an escalation channel."""
    return await make_bot(escalation_channel=ESCALATION)


def _ask_button(message: dict[str, Any]) -> dict[str, Any] | None:
    for block in message.get("blocks", []):
        for element in block.get("elements", []):
            if isinstance(element, dict) and element.get("action_id") == ASK_A_PERSON_ACTION_ID:
                return element
    return None


async def _asked(bot: Bot, event: dict[str, Any], count: int = 1) -> tuple[dict[str, Any], str]:
    """Ask ``event``'s question (the ``count``-th); the answer shown and its button's value."""
    await bot.event(event)
    answer = await bot.answer(count)
    button = _ask_button(answer)
    assert button is not None, answer["blocks"]
    return answer, str(button["value"])


def _click(
    answer: dict[str, Any],
    value: str,
    *,
    user: str = USER_ID,
    response: str = "h1",
    bot: Bot,
    team_id: str = TEAM_ID,
) -> bytes:
    return block_actions_body(
        [button_action(ASK_A_PERSON_ACTION_ID, value, text=messages.ASK_A_PERSON)],
        user_id=user,
        channel_id=str(answer["channel"]),
        message_ts=str(answer["ts"]),
        message=bot.slack.messages.get((str(answer["channel"]), str(answer["ts"]))),
        thread_ts=answer.get("thread_ts"),
        response_url=bot.slack.response_url(response),
        team_id=team_id,
    )


def _handed_off(bot: Bot) -> list[dict[str, Any]]:
    return [p for p in bot.slack.calls("chat.postMessage") if p.get("channel") == ESCALATION]


def _shown(message: dict[str, Any]) -> str:
    return json.dumps(message.get("blocks", []), ensure_ascii=False) + str(message.get("text"))


# ---------------------------------------------------------------- the button


async def test_answers_and_refusals_carry_the_button_only_with_the_setting(
    bot: Bot, make_bot: BotFactory
) -> None:
    answer, value = await _asked(bot, app_mention_event(IN_DOMAIN))
    assert bot.kb.queries.get(int(value)).question == IN_DOMAIN
    _, refused = await _asked(bot, app_mention_event(OUT_OF_DOMAIN), count=2)
    assert bot.kb.queries.get(int(refused)).outcome == Outcome.REFUSED

    plain = await make_bot()
    await plain.event(app_mention_event(IN_DOMAIN))
    assert _ask_button(await plain.answer(count=3)) is None


def test_the_button_is_rendered_for_every_logged_outcome_and_never_for_notices() -> None:
    for outcome in Outcome:
        answer = Answer("q", outcome, "text [1]", grounded=False, model_called=False, query_id=7)
        rendered = render_answer(answer, ask_a_person=True, words=words_for("en"))
        button = _ask_button({"blocks": rendered.blocks})
        assert button is not None and button["value"] == "7", outcome
        assert _ask_button({"blocks": render_answer(answer, words=words_for("en")).blocks}) is None
    unlogged = Answer("q", Outcome.REFUSED, "", grounded=False, model_called=False)
    assert (
        _ask_button(
            {"blocks": render_answer(unlogged, ask_a_person=True, words=words_for("en")).blocks}
        )
        is None
    )
    assert _ask_button({"blocks": render_notice(messages.ERROR_GENERIC).blocks}) is None


def test_the_setting_must_be_a_channel_id() -> None:
    assert make_settings(escalation_channel=" C0HELP01 ").slack_config().escalation_channel == (
        "C0HELP01"
    )
    assert make_settings(escalation_channel="G0OLDPRIV").escalation_channel == "G0OLDPRIV"
    for bad in ("#help", "D0DM000001", "U0USER0001", "c0lower"):
        with pytest.raises(ValidationError, match="KB_ESCALATION_CHANNEL"):
            make_settings(escalation_channel=bad)


# ---------------------------------------------------------------- handing off


async def test_a_hand_off_is_posted_once_under_double_clicks_and_a_redelivery(bot: Bot) -> None:
    event = app_mention_event(IN_DOMAIN)
    answer, value = await _asked(bot, event)
    body = _click(answer, value, bot=bot)
    started = time.perf_counter()
    acks = await asyncio.gather(bot.post(body), bot.post(body))
    assert time.perf_counter() - started < 3, "Slack needs its ack within 3 seconds"
    assert [a.status for a in acks] == [200, 200]
    await bot.post(body, retry_num=1)
    replies = await bot.slack.wait_for_responses(3, "h1")
    await bot.idle()

    (post,) = _handed_off(bot)
    shown = _shown(post)
    assert f"<@{USER_ID}>" in shown and f"<#{CHANNEL_ID}>" in shown
    assert IN_DOMAIN in shown, "the asker handed it off: the question is shown"
    assert "Here is what the documents say [1]." in shown, "sources for everyone: answer shown"
    permalink = f"https://example.slack.com/archives/{CHANNEL_ID}/p{event['ts'].replace('.', '')}"
    assert f"<{permalink}|{messages.HAND_OFF_OPEN_THREAD}>" in shown
    (link_call,) = bot.slack.calls("chat.getPermalink")
    assert link_call["message_ts"] == event["ts"]

    texts = sorted(r["text"] for r in replies)
    posted = messages.hand_off_posted(f"<#{ESCALATION}>", direct=False)
    already = messages.hand_off_already(f"<#{ESCALATION}>", f"<@{USER_ID}>")
    assert texts == sorted([posted, already, already])
    assert all(r["response_type"] == "ephemeral" for r in replies)
    sent = bot.kb.escalations.get(int(value))
    assert sent is not None and sent.sent and sent.channel == ESCALATION

    # Everyone in the thread sees that a person was asked; the button is gone.
    marked = bot.slack.messages[(CHANNEL_ID, answer["ts"])]
    assert _ask_button(marked) is None
    note = messages.hand_off_marked(f"<#{ESCALATION}>", f"<@{USER_ID}>", direct=False)
    assert note in _shown(marked)
    assert "Here is what the documents say" in _shown(marked) and "kb_feedback" in _shown(marked)


async def test_a_dm_question_is_handed_off_by_its_asker_without_a_thread_link(bot: Bot) -> None:
    answer, value = await _asked(bot, message_im_event("How often are API keys rotated?"))
    assert answer["channel"] == DM_CHANNEL_ID
    await bot.post(_click(answer, value, bot=bot))
    (reply,) = await bot.slack.wait_for_responses(1, "h1")
    assert reply["text"] == messages.hand_off_posted(f"<#{ESCALATION}>", direct=True)
    (post,) = _handed_off(bot)
    shown = _shown(post)
    assert "in a direct message with me" in shown and "API keys rotated" in shown
    assert messages.hand_off_reply_directly(f"<@{USER_ID}>") in shown
    assert not bot.slack.calls("chat.getPermalink"), "nobody else can open a DM's thread"


async def test_someone_elses_dm_question_is_refused(bot: Bot, caplog: Any) -> None:
    answer, value = await _asked(bot, message_im_event("How often are API keys rotated?"))
    await bot.post(_click(answer, value, user=COLLEAGUE, bot=bot))
    # The same id clicked from a channel: a forged value never reaches another conversation.
    forged = {**answer, "channel": CHANNEL_ID}
    with caplog.at_level(logging.WARNING, logger="bot.slack.escalation"):
        await bot.post(_click(forged, value, bot=bot, response="h2"))
        replies = await bot.slack.wait_for_responses(1, "h1")
        replies += await bot.slack.wait_for_responses(1, "h2")
        await bot.idle()
    assert [r["text"] for r in replies] == [messages.HAND_OFF_NOT_YOURS] * 2
    assert not _handed_off(bot)
    assert bot.kb.escalations.get(int(value)) is None
    assert "may not hand off question" in caplog.text


async def test_a_person_of_another_organisation_hands_nothing_off(bot: Bot, caplog: Any) -> None:
    # Slack Connect: a person of another organisation clicks the button under a
    # member's answer in a shared channel.
    answer, value = await _asked(bot, app_mention_event(IN_DOMAIN))
    with caplog.at_level(logging.WARNING, logger="bot.slack.escalation"):
        await bot.post(_click(answer, value, user=COLLEAGUE, bot=bot, team_id="T0OTHERORG1"))
        [reply] = await bot.slack.wait_for_responses(1, "h1")
        await bot.idle()
    assert reply["text"] == messages.EXTERNAL_ASKER
    assert not _handed_off(bot) and bot.kb.escalations.get(int(value)) is None
    assert "another organisation" in caplog.text
    # The member who asked still can.
    await bot.post(_click(answer, value, bot=bot, response="h2"))
    await bot.slack.wait_for_responses(1, "h2")
    await bot.idle()
    assert len(_handed_off(bot)) == 1


async def test_a_malformed_value_is_ignored_with_a_log_line(bot: Bot, caplog: Any) -> None:
    answer, _ = await _asked(bot, app_mention_event(IN_DOMAIN))
    with caplog.at_level(logging.WARNING, logger="bot.slack.escalation"):
        for value in ("12abc", "<!channel>", "-1", "0", "9" * 40, "１２"):
            await bot.post(_click(answer, value, bot=bot))
        await bot.idle()
    assert caplog.text.count("malformed value") == 6
    assert not _handed_off(bot) and not bot.slack.responses("h1")


async def test_an_unknown_question_id_is_answered_plainly(bot: Bot) -> None:
    answer, _ = await _asked(bot, app_mention_event(IN_DOMAIN))
    await bot.post(_click(answer, "987654", bot=bot))
    (reply,) = await bot.slack.wait_for_responses(1, "h1")
    assert reply["text"] == messages.HAND_OFF_UNKNOWN
    assert not _handed_off(bot)


async def test_without_the_bot_in_the_channel_the_clicker_is_told_and_a_later_click_posts(
    bot: Bot,
) -> None:
    answer, value = await _asked(bot, app_mention_event(OUT_OF_DOMAIN))
    bot.slack.fail("chat.postMessage", "not_in_channel", times=1)
    await bot.post(_click(answer, value, bot=bot))
    (refused,) = await bot.slack.wait_for_responses(1, "h1")
    assert refused["text"] == messages.hand_off_not_in_channel(f"<#{ESCALATION}>")
    await bot.idle()
    assert bot.kb.escalations.get(int(value)) is None, "not marked: a later click may succeed"

    await bot.post(_click(answer, value, bot=bot, response="h2"))
    (posted,) = await bot.slack.wait_for_responses(1, "h2")
    assert posted["text"] == messages.hand_off_posted(f"<#{ESCALATION}>", direct=False)
    (post,) = _handed_off(bot)
    assert messages.HAND_OFF_REFUSED in _shown(post)
    await bot.idle()
    (marking,) = bot.slack.calls("chat.update")
    assert marking["ts"] == answer["ts"], "only the click that posted marks the answer"


async def test_other_slack_failures_release_the_claim_too(bot: Bot) -> None:
    answer, value = await _asked(bot, app_mention_event(IN_DOMAIN))
    bot.slack.fail("chat.postMessage", "fatal_error", times=1)
    await bot.post(_click(answer, value, bot=bot))
    (reply,) = await bot.slack.wait_for_responses(1, "h1")
    assert reply["text"] == messages.HAND_OFF_FAILED
    await bot.idle()
    assert bot.kb.escalations.get(int(value)) is None


async def test_without_a_link_from_slack_the_hand_off_says_where_to_look(bot: Bot) -> None:
    answer, value = await _asked(bot, app_mention_event(IN_DOMAIN))
    bot.slack.fail("chat.getPermalink", "message_not_found")
    await bot.post(_click(answer, value, bot=bot))
    await bot.slack.wait_for_responses(1, "h1")
    (post,) = _handed_off(bot)
    assert messages.HAND_OFF_NO_LINK in _shown(post)
    assert "example.slack.com" not in _shown(post)


async def test_the_button_of_an_old_answer_says_when_hand_offs_are_off(
    bot: Bot, make_bot: BotFactory
) -> None:
    answer, value = await _asked(bot, app_mention_event(IN_DOMAIN))
    plain = await make_bot()
    await plain.post(_click(answer, value, bot=plain))
    (reply,) = await plain.slack.wait_for_responses(1, "h1")
    assert reply["text"] == messages.HAND_OFF_OFF


# ---------------------------------------------------------------- what the channel may read


async def test_hostile_question_and_answer_are_escaped(bot: Bot) -> None:
    bot.llm.set_reply("<!channel> <@U0VICTIM1> read <https://evil.example|this> now [1].")
    question = f"{IN_DOMAIN} <!here> <@U0VICTIM1> <https://evil.example|x> www.evil.example"
    answer, value = await _asked(bot, app_mention_event(question))
    await bot.post(_click(answer, value, bot=bot))
    await bot.slack.wait_for_responses(1, "h1")
    (post,) = _handed_off(bot)
    shown = _shown(post)
    for forbidden in ("<!channel>", "<!here>", "<@U0VICTIM1>", "<https://evil", "|this>"):
        assert forbidden not in shown, forbidden
    assert "&lt;!channel&gt;" in shown and "&lt;!here&gt;" in shown
    assert "`www.evil.example`" in shown, "a bare domain is set in code, not linked"


async def test_an_answer_from_a_channels_documents_is_withheld(bot: Bot) -> None:
    bot.llm.set_reply("Project Falcon launches on 14 March [1].")
    answer, value = await _asked(bot, app_mention_event(FALCON_Q))
    assert "14 March" in _shown(answer)
    await bot.post(_click(answer, value, bot=bot))
    await bot.slack.wait_for_responses(1, "h1")
    (post,) = _handed_off(bot)
    shown = _shown(post)
    assert messages.HAND_OFF_ANSWER_WITHHELD in shown
    assert "14 March" not in shown
    assert FALCON_Q in shown, "the asker's own click shows the question"


GUEST = "U0GUEST001"


@pytest.mark.parametrize("who_reads_there", ["members", "a guest", "another organisation"])
async def test_an_answer_for_everyone_is_withheld_where_a_guest_or_a_partner_reads(
    bot: Bot, who_reads_there: str
) -> None:
    # A guest of the workspace, or a partner's people (Slack Connect), read no document for
    # everyone: an escalation channel they are in is told to open the thread instead.
    bot.slack.set_user(GUEST, name="gina").update(is_restricted=True)
    bot.slack.set_members(ESCALATION, [USER_ID, *([GUEST] if who_reads_there == "a guest" else [])])
    if who_reads_there == "another organisation":
        bot.slack.ext_shared.add(ESCALATION)
    bot.llm.set_reply("Submit expense claims within 30 days [1].")
    answer, value = await _asked(bot, app_mention_event(IN_DOMAIN))
    await bot.post(_click(answer, value, bot=bot))
    await bot.slack.wait_for_responses(1, "h1")
    (post,) = _handed_off(bot)
    shown = _shown(post)
    withheld = who_reads_there != "members"
    assert (messages.HAND_OFF_ANSWER_WITHHELD in shown) is withheld
    assert ("within 30 days" in shown) is not withheld


async def test_a_colleagues_hand_off_withholds_the_question(bot: Bot) -> None:
    answer, value = await _asked(bot, app_mention_event(IN_DOMAIN))
    await bot.post(_click(answer, value, user=COLLEAGUE, bot=bot))
    (reply,) = await bot.slack.wait_for_responses(1, "h1")
    assert reply["text"] == messages.hand_off_posted(f"<#{ESCALATION}>", direct=False)
    (post,) = _handed_off(bot)
    shown = _shown(post)
    assert IN_DOMAIN not in shown and messages.HAND_OFF_QUESTION_WITHHELD in shown
    assert messages.hand_off_by(f"<@{COLLEAGUE}>") in shown
    assert f"<@{USER_ID}>" in shown


# ---------------------------------------------------------------- the claim


def test_a_claim_is_taken_once_released_on_failure_and_taken_over_when_stale(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "data")
    assert store.escalations.claim(5, "U1")
    assert not store.escalations.claim(5, "U2"), "being sent"
    assert store.escalations.claim(5, "U3", stale_after=-1.0), "its process died while posting"
    store.escalations.release(5)
    assert store.escalations.get(5) is None
    assert store.escalations.claim(5, "U2")
    store.escalations.mark_sent(5, "C9", "1.2")
    store.escalations.release(5)
    sent = store.escalations.get(5)
    assert sent is not None and (sent.user, sent.channel, sent.ts, sent.sent) == (
        "U2",
        "C9",
        "1.2",
        True,
    )
    assert not store.escalations.claim(5, "U4", stale_after=-1.0), "a sent hand-off stays sent"


class _HeldPost:
    """The mock Slack's stall of ``chat.postMessage``, held until the test lets it go."""

    def __init__(self, bot: Bot, monkeypatch: pytest.MonkeyPatch) -> None:
        self.arrived, self.gate = asyncio.Event(), asyncio.Event()
        monkeypatch.setattr(bot.slack, "_sleep", self._hold)
        bot.slack.stall("chat.postMessage", 90.0, times=1)

    async def _hold(self, seconds: float) -> None:
        if seconds > 0:
            self.arrived.set()
            await self.gate.wait()


def _on_fake_time(bot: Bot, monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    """The hand-off claims' clock and their renewal's sleep, moved by the test alone."""
    fake = FakeTime(time.time())
    monkeypatch.setattr(bot.kb.store.escalations, "clock", fake.clock)
    monkeypatch.setattr(escalation, "_sleep", fake.sleep)
    return fake


def _live_hand_offs(bot: Bot) -> list[dict[str, Any]]:
    return [m for (channel, _), m in bot.slack.messages.items() if channel == ESCALATION]


async def test_a_post_slack_is_slow_to_answer_is_renewed_never_posted_twice(
    bot: Bot, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer, value = await _asked(bot, app_mention_event(IN_DOMAIN))
    fake = _on_fake_time(bot, monkeypatch)
    held = _HeldPost(bot, monkeypatch)
    await bot.post(_click(answer, value, bot=bot))
    await asyncio.wait_for(held.arrived.wait(), 15)
    await fake.sleeping(1)  # the claim's renewal
    # Slack has not answered for longer than the lease: the claim was renewed meanwhile.
    await fake.advance(escalation.CLAIM_LEASE + 30)
    await bot.post(_click(answer, value, user=COLLEAGUE, bot=bot, response="h2"))
    await bot.post(_click(answer, value, user=COLLEAGUE, bot=bot, response="h2"), retry_num=1)
    later = await bot.slack.wait_for_responses(2, "h2")
    already = messages.hand_off_already(f"<#{ESCALATION}>", f"<@{USER_ID}>")
    assert [r["text"] for r in later] == [already, already]
    assert not _handed_off(bot), "nothing posted while the first post is under way"

    held.gate.set()
    (first,) = await bot.slack.wait_for_responses(1, "h1")
    await bot.idle()
    assert first["text"] == messages.hand_off_posted(f"<#{ESCALATION}>", direct=False)
    assert len(_handed_off(bot)) == 1 and len(_live_hand_offs(bot)) == 1
    sent = bot.kb.escalations.get(int(value))
    assert sent is not None and sent.sent and sent.user == USER_ID
    await fake.advance(escalation.CLAIM_LEASE * 3)
    await bot.post(_click(answer, value, user=COLLEAGUE, bot=bot, response="h3"))
    (last,) = await bot.slack.wait_for_responses(1, "h3")
    assert last["text"] == already, "a sent hand-off is never taken over"
    assert len(_handed_off(bot)) == 1


async def test_a_claim_whose_renewals_fail_is_taken_over_and_the_later_post_withdrawn(
    bot: Bot, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    answer, value = await _asked(bot, app_mention_event(IN_DOMAIN))
    fake = _on_fake_time(bot, monkeypatch)
    held = _HeldPost(bot, monkeypatch)
    renew = bot.kb.store.escalations.renew
    frozen = {"renewing": True}

    def renewing(claim: Any) -> Any:
        if not frozen["renewing"] and claim.user == USER_ID:
            raise OSError("the database is unreachable")
        return renew(claim)

    monkeypatch.setattr(bot.kb.store.escalations, "renew", renewing)
    await bot.post(_click(answer, value, bot=bot))
    await asyncio.wait_for(held.arrived.wait(), 15)
    await fake.sleeping(1)
    frozen["renewing"] = False  # as if its process froze: the lease lapses
    with caplog.at_level(logging.WARNING, logger="bot.slack.escalation"):
        await fake.advance(escalation.CLAIM_LEASE + 1)
        await bot.post(_click(answer, value, user=COLLEAGUE, bot=bot, response="h2"))
        (taken,) = await bot.slack.wait_for_responses(1, "h2")
        assert taken["text"] == messages.hand_off_posted(f"<#{ESCALATION}>", direct=False)
        held.gate.set()
        (first,) = await bot.slack.wait_for_responses(1, "h1")
        await bot.idle()
    assert first["text"] == messages.hand_off_already(f"<#{ESCALATION}>", f"<@{COLLEAGUE}>")
    assert len(_handed_off(bot)) == 2, "both posted: Slack answered the first one late"
    (live,) = _live_hand_offs(bot)
    (deleted,) = bot.slack.calls("chat.delete")
    assert deleted["channel"] == ESCALATION and live["ts"] != deleted["ts"]
    sent = bot.kb.escalations.get(int(value))
    assert sent is not None and sent.ts == live["ts"] and sent.user == COLLEAGUE
    assert "handed off twice" in caplog.text


async def test_a_claim_taken_over_before_its_post_posts_nothing(
    bot: Bot, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first click's permalink lookup hangs past the lease while its renewals fail.
    answer, value = await _asked(bot, app_mention_event(IN_DOMAIN))
    fake = _on_fake_time(bot, monkeypatch)
    arrived, gate = asyncio.Event(), asyncio.Event()

    async def hold(seconds: float) -> None:
        if seconds > 0:
            arrived.set()
            await gate.wait()

    monkeypatch.setattr(bot.slack, "_sleep", hold)
    bot.slack.stall("chat.getPermalink", 90.0, times=1)
    renew = bot.kb.store.escalations.renew
    failing = {"on": False}

    def renewing(claim: Any) -> Any:
        if failing["on"] and claim.user == USER_ID:
            raise OSError("the database is unreachable")
        return renew(claim)

    monkeypatch.setattr(bot.kb.store.escalations, "renew", renewing)
    await bot.post(_click(answer, value, bot=bot))
    await asyncio.wait_for(arrived.wait(), 15)
    await fake.sleeping(1)
    failing["on"] = True
    await fake.advance(escalation.CLAIM_LEASE + 1)
    await bot.post(_click(answer, value, user=COLLEAGUE, bot=bot, response="h2"))
    await bot.slack.wait_for_responses(1, "h2")
    failing["on"] = False
    gate.set()
    (first,) = await bot.slack.wait_for_responses(1, "h1")
    await bot.idle()
    assert first["text"] == messages.hand_off_already(f"<#{ESCALATION}>", f"<@{COLLEAGUE}>")
    assert len(_handed_off(bot)) == 1 and not bot.slack.calls("chat.delete")


def test_a_renewed_claim_outlasts_the_lease_and_a_taken_over_one_releases_nothing(
    tmp_path: Path,
) -> None:
    fake = FakeTime()
    store = Store(tmp_path / "data", clock=fake.clock)
    first = store.escalations.claim(5, "U1", stale_after=60)
    assert first is not None
    fake.now += 50
    renewed = store.escalations.renew(first)
    assert renewed is not None and renewed.at == fake.now
    fake.now += 50
    assert store.escalations.claim(5, "U2", stale_after=60) is None, "renewed 50 s ago"
    fake.now += 11
    second = store.escalations.claim(5, "U2", stale_after=60)
    assert second is not None, "not renewed for 61 s: taken over"
    assert store.escalations.renew(renewed) is None, "the first holder knows it lost"
    store.escalations.release(5, renewed)
    assert store.escalations.get(5) is not None, "the takeover's claim stays"
    assert store.escalations.claim(5, "U3", stale_after=60) is None
    assert store.escalations.mark_sent(5, "C9", "1.2", user="U1"), "the first post marked wins"
    assert not store.escalations.mark_sent(5, "C9", "1.3", user="U2"), "a duplicate"
    store.escalations.release(5, second)
    sent = store.escalations.get(5)
    assert sent is not None and (sent.user, sent.ts) == ("U1", "1.2")
    assert store.escalations.renew(second) is None
    store.escalations.release(6, store.escalations.claim(6, "U1"))
    assert store.escalations.get(6) is None
    assert store.escalations.mark_sent(7, "C9", "2.1", user="U4"), "released meanwhile: recorded"
    seven = store.escalations.get(7)
    assert seven is not None and (seven.user, seven.ts) == ("U4", "2.1")
