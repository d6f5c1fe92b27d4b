"""Passage links as Work Objects: signed ``link_shared`` / ``entity_details_requested`` events
into the real bolt app, ``chat.unfurl`` / ``entity.presentDetails`` recorded by the mock Slack.

Every refusal is checked the same way: the passage's words (and the document's
title) appear in no call the bot made to Slack, accepted or rejected.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any
from urllib.parse import urlsplit

import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.access import shown_at, visible
from bot.logs import NOISY_LOGGERS, build_formatter
from bot.slack.blocks import OPEN_VIEWER_ACTION_ID
from bot.slack.unfurls import MAX_LINKS, Where, parse_link
from bot.slack.words import words_for
from core.links import LinkSigner, passage_url
from index.models import EVERYONE
from index.records import DocumentRow

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.conftest_bot import (  # noqa: E402
    IN_DOMAIN,
    LINK_SECRET,
    PUBLIC_URL,
    Bot,
    BotFactory,
    links,
)
from tests.docs_factory import text_pdf  # noqa: E402
from tests.servers import (  # noqa: E402
    CHANNEL_ID,
    DM_CHANNEL_ID,
    USER_ID,
    MockSlackAPI,
    app_mention_event,
    block_actions_body,
    button_action,
    event_body,
    slack_ts,
)

OTHER_CHANNEL = "C0OTHER001"
OTHER_TEAM = "T0OTHERORG"
EXTERNAL_USER = "U0EXTERNAL"
MEMBER = "U0MEMBER01"
OUTSIDER = "U0OUTSIDE1"
# Slack's limit on a Work Object text value (Work Objects reference: the plain-text input
# a field becomes holds at most 3000 characters) and on an action's url.
TEXT_LIMIT = 3000
ENTITY_TYPE = "slack#/entities/content_item"
EN = words_for("en")


# ---------------------------------------------------------------- payloads (Slack's shapes)


def link_shared_event(
    urls: list[str],
    *,
    channel: str = CHANNEL_ID,
    user: str = USER_ID,
    source: str = "conversations_history",
) -> dict[str, Any]:
    """A ``link_shared`` event as docs.slack.dev shows it (``source: composer`` too)."""
    ts = slack_ts()
    event: dict[str, Any] = {
        "type": "link_shared",
        "user": user,
        "unfurl_id": f"{channel}.{ts}.{abs(hash(ts)):x}",
        "source": source,
        "links": [{"domain": urlsplit(u).hostname or "", "url": u} for u in urls],
        "event_ts": ts,
        "user_locale": "en-US",
    }
    if source == "composer":
        # "the channel_id will always be set to the value COMPOSER"; message_ts is the unfurl_id.
        event.update(channel_id="COMPOSER", message_ts=event["unfurl_id"])
    else:
        event.update(channel=channel, is_bot_user_member=True, message_ts=ts, thread_ts=ts)
    return event


def details_event(
    entity: dict[str, Any],
    trigger: str,
    *,
    user: str = USER_ID,
    channel: str | None = CHANNEL_ID,
    locale: str = "en-US",
) -> dict[str, Any]:
    """``entity_details_requested`` for an unfurled ``entity``, as Slack echoes it back."""
    event: dict[str, Any] = {
        "type": "entity_details_requested",
        "user": user,
        "external_ref": entity["external_ref"],
        "entity_url": entity["url"],
        "link": {"url": entity["url"], "domain": urlsplit(entity["url"]).hostname},
        "app_unfurl_url": entity["app_unfurl_url"],
        "event_ts": slack_ts(),
        "trigger_id": trigger,
        "user_locale": locale,
    }
    if channel is not None:
        event.update(channel=channel, message_ts=slack_ts())
    return event


# ---------------------------------------------------------------- reading the calls


def _doc(bot: Bot, name: str) -> DocumentRow:
    return next(d for d in bot.kb.documents() if d.name == name)


def _chunks(bot: Bot, doc: DocumentRow) -> list[dict[str, Any]]:
    return bot.kb.chunks(doc.id)


def _link(bot: Bot, doc: DocumentRow, chunk: dict[str, Any], *, token: str | None = None) -> str:
    """The passage link the engine builds for ``chunk`` (its signer, its base URL)."""
    signed = token if token is not None else bot.services.engine.signer.token(doc.id, doc.scope)
    return passage_url(
        bot.settings.link_base_url,
        doc.id,
        signed,
        start=chunk["start"],
        end=chunk["end"],
        page=None,
        is_pdf=False,
    )


async def _deliver(bot: Bot, event: dict[str, Any], **envelope: Any) -> None:
    """Post ``event`` signed, in its envelope (``team_id``, ``is_ext_shared_channel``...)."""
    resp = await bot.post(event_body(event, **envelope))
    assert resp.status == 200, await resp.text()


async def _share(bot: Bot, event: dict[str, Any], **envelope: Any) -> None:
    """Slack sends ``event`` (and so knows its links); wait until the bot is done with it."""
    bot.slack.share_links(event)
    await _deliver(bot, event, **envelope)
    await bot.idle()


async def _unfurled(bot: Bot, event: dict[str, Any], **envelope: Any) -> list[dict[str, Any]]:
    """The entities ``chat.unfurl`` attached for ``event`` (fails when there was no call)."""
    await _share(bot, event, **envelope)
    (call,) = bot.slack.calls("chat.unfurl")
    return list(call["metadata"]["entities"])


async def _first_citation(bot: Bot, timeout: float = 15.0) -> str:
    """The first passage link of the bot's answer, once the answer shows one."""
    async with asyncio.timeout(timeout):
        while True:
            for method, params in bot.slack.log:
                if method in {"chat.postMessage", "chat.update"} and links(params):
                    return links(params)[0][0]
            await asyncio.sleep(0.02)  # polling a condition, bounded by the timeout


def _everything(slack: MockSlackAPI) -> str:
    """Every call the bot made to Slack, accepted or rejected, and every response_url post."""
    calls = [p for _, p in slack.log] + [p for _, p, _ in slack.rejected]
    return json.dumps(calls, ensure_ascii=False) + json.dumps(slack.responses(), ensure_ascii=False)


def _assert_nothing_of(bot: Bot, *texts: str) -> None:
    everything = _everything(bot.slack)
    for text in texts:
        assert text not in everything, f"{text!r} reached Slack"


def _custom(entity: dict[str, Any]) -> dict[str, Any]:
    return {f["key"]: f for f in entity["entity_payload"].get("custom_fields", [])}


def _description(entity: dict[str, Any]) -> str | None:
    field = entity["entity_payload"].get("fields", {}).get("description")
    return None if field is None else str(field["value"])


@pytest.fixture
def handbook(bot: Bot) -> tuple[DocumentRow, dict[str, Any]]:
    """The handbook (for everyone) and its passage on expense claims."""
    doc = _doc(bot, "handbook.md")
    chunk = next(c for c in _chunks(bot, doc) if "expense claims" in c["content"])
    return doc, chunk


@pytest.fixture
def falcon(bot: Bot) -> tuple[DocumentRow, dict[str, Any]]:
    """Project Falcon, a document of CHANNEL_ID only, and its passage."""
    doc = _doc(bot, "falcon.md")
    assert doc.scope == CHANNEL_ID
    (chunk,) = [c for c in _chunks(bot, doc) if "14 March" in c["content"]]
    return doc, chunk


# ---------------------------------------------------------------- the unfurl


async def test_the_bots_citation_unfurls_as_the_exact_passage_with_its_section(bot: Bot) -> None:
    bot.slack.agent_app = True  # so that no Slack call in this answer is refused
    await bot.event(app_mention_event(IN_DOMAIN))
    url = await _first_citation(bot)
    fragment = urlsplit(url).fragment
    start, end = (int(n) for n in fragment.removeprefix("char=").split(","))
    doc = _doc(bot, "handbook.md")
    passage = bot.kb.canonical_text(doc.id)[start:end]
    assert "Submit expense claims within 30 days" in passage

    (entity,) = await _unfurled(bot, link_shared_event([url]))
    assert entity["entity_type"] == ENTITY_TYPE
    assert entity["app_unfurl_url"] == url  # the exact URL posted
    attributes = entity["entity_payload"]["attributes"]
    assert attributes["title"]["text"] == "Employee handbook"
    assert attributes["display_type"] == EN.ENTITY_PASSAGE
    chunk = next(c for c in _chunks(bot, doc) if c["start"] <= start < c["end"])
    assert "Expenses" in chunk["section"]
    assert attributes["display_id"] == chunk["section"]
    assert _custom(entity)["section"]["value"] == chunk["section"]
    assert _description(entity) == passage
    (action,) = entity["entity_payload"]["actions"]["primary_actions"]
    assert action["text"] == EN.ENTITY_OPEN_VIEWER and action["url"] == url
    assert entity["url"] == url
    call = bot.slack.calls("chat.unfurl")[0]
    assert call["channel"] == CHANNEL_ID and call["ts"]
    assert bot.slack.rejected == []


async def test_the_viewer_button_is_acknowledged(bot: Bot) -> None:
    body = block_actions_body([button_action(OPEN_VIEWER_ACTION_ID)])
    resp = await bot.post(body)
    assert resp.status == 200  # bolt answers 404 to an action nobody listens to


async def test_a_pasted_link_to_a_document_for_everyone_unfurls_in_a_dm_too(
    bot: Bot, handbook: tuple[DocumentRow, dict[str, Any]]
) -> None:
    doc, chunk = handbook
    url = _link(bot, doc, chunk)
    (entity,) = await _unfurled(bot, link_shared_event([url], channel=DM_CHANNEL_ID))
    assert _description(entity) == chunk["content"]


async def test_several_links_unfurl_once_each_and_foreign_ones_are_left_alone(
    bot: Bot, handbook: tuple[DocumentRow, dict[str, Any]]
) -> None:
    doc, chunk = handbook
    other = next(c for c in _chunks(bot, doc) if "DNS server" in c["content"])
    first, second = _link(bot, doc, chunk), _link(bot, doc, other)
    urls = [first, "https://example.com/d/1?t=x", second, first]
    entities = await _unfurled(bot, link_shared_event(urls))
    assert [e["app_unfurl_url"] for e in entities] == [first, second]
    assert [_description(e) for e in entities] == [chunk["content"], other["content"]]


async def test_a_link_typed_in_the_composer_unfurls_by_its_unfurl_id(
    bot: Bot, handbook: tuple[DocumentRow, dict[str, Any]]
) -> None:
    doc, chunk = handbook
    event = link_shared_event([_link(bot, doc, chunk)], source="composer")
    (entity,) = await _unfurled(bot, event)
    (call,) = bot.slack.calls("chat.unfurl")
    assert call["unfurl_id"] == event["unfurl_id"] and call["source"] == "composer"
    assert "channel" not in call
    assert _description(entity) == chunk["content"]


GUEST = "U0GUEST001"


async def test_a_guest_reads_no_passage_for_everyone_in_an_unfurl_or_its_flexpane(
    bot: Bot, handbook: tuple[DocumentRow, dict[str, Any]]
) -> None:
    # A guest of the workspace reads along in CHANNEL_ID: a member posts a handbook link.
    doc, chunk = handbook
    bot.slack.set_user(GUEST, name="gina").update(is_restricted=True)
    bot.slack.set_members(CHANNEL_ID, [USER_ID, GUEST])
    (entity,) = await _unfurled(bot, link_shared_event([_link(bot, doc, chunk)]))
    assert _description(entity) is None and chunk["content"] not in json.dumps(entity)
    # Where nobody but members reads, it unfurls; the guest opening its flexpane reads nothing.
    bot.slack.set_members(OTHER_CHANNEL, [USER_ID])
    bot.slack.reset()
    link = _link(bot, doc, chunk)
    (shown,) = await _unfurled(bot, link_shared_event([link], channel=OTHER_CHANNEL))
    assert _description(shown) == chunk["content"]
    for user, status in ((GUEST, "restricted"), (USER_ID, None)):
        trigger = bot.slack.entity_trigger(shown["external_ref"]["id"])
        await _deliver(bot, details_event(shown, trigger, user=user, channel=OTHER_CHANNEL))
        await bot.idle()
        call = bot.slack.calls("entity.presentDetails", include_rejected=True)[-1]
        assert (call.get("error") or {}).get("status") == status


async def test_a_member_opening_the_flexpane_where_a_guest_reads_shows_nothing_for_everyone(
    bot: Bot, handbook: tuple[DocumentRow, dict[str, Any]]
) -> None:
    # The card is restricted where a guest reads along; Slack refreshes the card with what
    # the flexpane presents, so a member opening it there must be shown nothing either.
    doc, chunk = handbook
    bot.slack.set_user(GUEST, name="gina").update(is_restricted=True)
    bot.slack.set_members(CHANNEL_ID, [USER_ID, GUEST])
    (entity,) = await _unfurled(bot, link_shared_event([_link(bot, doc, chunk)]))
    assert _description(entity) is None
    trigger = bot.slack.entity_trigger(entity["external_ref"]["id"])
    await _deliver(bot, details_event(entity, trigger, user=USER_ID, channel=CHANNEL_ID))
    await bot.idle()
    call = bot.slack.calls("entity.presentDetails", include_rejected=True)[-1]
    assert call.get("error") == {"status": "restricted"}
    _assert_nothing_of(bot, chunk["content"])


async def test_a_long_range_is_cut_to_slacks_limit(bot: Bot) -> None:
    body = "# Long\n\n" + "\n\n".join(f"Paragraph {i} " + "word " * 80 for i in range(30))
    added = await asyncio.to_thread(
        bot.kb.ingest_bytes, body.encode(), "long.md", uploader="fixture"
    )
    doc = added.document
    text = bot.kb.canonical_text(doc.id)
    assert len(text) > 2 * TEXT_LIMIT
    token = bot.services.engine.signer.token(doc.id, doc.scope)
    url = f"{PUBLIC_URL}/d/{doc.id}?t={token}#char=0,{len(text)}"
    (entity,) = await _unfurled(bot, link_shared_event([url]))
    shown = _description(entity)
    assert shown is not None and len(shown) <= TEXT_LIMIT
    assert shown.endswith("…") and text.startswith(shown[:-1].rstrip())


async def test_a_pdf_page_link_unfurls_that_pages_text(bot: Bot) -> None:
    pages = ["The cafeteria opens at eight.", "Badges are renewed every spring at reception."]
    added = await asyncio.to_thread(
        bot.kb.ingest_bytes, text_pdf(pages), "facilities.pdf", uploader="fixture"
    )
    doc = added.document
    assert doc.state == "indexed", doc.failure_reason
    token = bot.services.engine.signer.token(doc.id, doc.scope)
    url = passage_url(
        bot.settings.link_base_url, doc.id, token, start=0, end=0, page=2, is_pdf=True
    )
    (entity,) = await _unfurled(bot, link_shared_event([url]))
    assert "Badges are renewed every spring" in (_description(entity) or "")
    assert "cafeteria" not in (_description(entity) or "")
    assert _custom(entity)["page"]["value"] == 2


async def test_a_link_without_a_range_shows_the_title_only(
    bot: Bot, handbook: tuple[DocumentRow, dict[str, Any]]
) -> None:
    doc, chunk = handbook
    url = f"{PUBLIC_URL}/d/{doc.id}?t={bot.services.engine.signer.token(doc.id, doc.scope)}"
    (entity,) = await _unfurled(bot, link_shared_event([url]))
    assert entity["entity_payload"]["attributes"]["title"]["text"] == "Employee handbook"
    assert _description(entity) is None
    assert "display_order" not in entity["entity_payload"]
    _assert_nothing_of(bot, chunk["content"])


# ---------------------------------------------------------------- the flexpane


async def test_the_flexpane_presents_the_passage_its_neighbours_and_the_viewer(
    bot: Bot,
) -> None:
    steps = b"""# Onboarding

## First day

Collect your badge at reception before nine.

## First week

Pair with your buddy on two support tickets.

## First month

Present what you learned at the Friday demo.
"""
    added = await asyncio.to_thread(bot.kb.ingest_bytes, steps, "onboarding.md", uploader="fixture")
    doc = added.document
    chunks = _chunks(bot, doc)
    assert len(chunks) == 3
    middle = chunks[1]
    url = _link(bot, doc, middle)
    (entity,) = await _unfurled(bot, link_shared_event([url]))
    trigger = bot.slack.entity_trigger(entity["external_ref"]["id"])
    await _deliver(bot, details_event(entity, trigger))
    await bot.idle()

    (call,) = bot.slack.calls("entity.presentDetails")
    assert call["trigger_id"] == trigger and "error" not in call
    details = call["metadata"]
    assert "app_unfurl_url" not in details
    assert details["external_ref"] == entity["external_ref"]
    assert _description(details) == middle["content"]
    custom = _custom(details)
    assert custom["before"]["value"] == chunks[0]["content"]
    assert custom["after"]["value"] == chunks[2]["content"]
    assert custom["before"]["label"] == EN.ENTITY_BEFORE
    (action,) = details["entity_payload"]["actions"]["primary_actions"]
    assert action["url"] == url and details["url"] == url
    assert bot.slack.rejected == []


async def test_the_flexpane_speaks_the_openers_language(
    bot: Bot, handbook: tuple[DocumentRow, dict[str, Any]]
) -> None:
    doc, chunk = handbook
    (entity,) = await _unfurled(bot, link_shared_event([_link(bot, doc, chunk)]))
    trigger = bot.slack.entity_trigger(entity["external_ref"]["id"])
    await _deliver(bot, details_event(entity, trigger, locale="fr-FR"))
    await bot.idle()
    (call,) = bot.slack.calls("entity.presentDetails")
    (action,) = call["metadata"]["entity_payload"]["actions"]["primary_actions"]
    assert action["text"] == words_for("fr").ENTITY_OPEN_VIEWER == "Ouvrir dans la visionneuse"


async def test_a_channels_document_unfurls_in_that_channel_and_opens_for_its_members(
    bot: Bot, falcon: tuple[DocumentRow, dict[str, Any]]
) -> None:
    doc, chunk = falcon
    bot.slack.set_members(CHANNEL_ID, [MEMBER, USER_ID])
    (entity,) = await _unfurled(bot, link_shared_event([_link(bot, doc, chunk)]))
    assert _description(entity) == chunk["content"]
    trigger = bot.slack.entity_trigger(entity["external_ref"]["id"])
    await _deliver(bot, details_event(entity, trigger, user=MEMBER))
    await bot.idle()
    (call,) = bot.slack.calls("entity.presentDetails")
    assert _description(call["metadata"]) == chunk["content"]


@pytest.mark.parametrize(("name", "shown"), [("handbook.md", True), ("falcon.md", False)])
async def test_a_flexpane_opened_outside_a_message_shows_only_documents_for_everyone(
    bot: Bot, name: str, shown: bool
) -> None:
    doc = _doc(bot, name)
    chunk = _chunks(bot, doc)[0]
    bot.slack.set_members(CHANNEL_ID, [USER_ID])
    url = _link(bot, doc, chunk)
    ref = parse_link(url, PUBLIC_URL)
    assert ref is not None
    entity = {"external_ref": {"id": ref.ref}, "url": url, "app_unfurl_url": url}
    trigger = bot.slack.entity_trigger(ref.ref)
    await _deliver(bot, details_event(entity, trigger, channel=None))
    await bot.idle()
    (call,) = bot.slack.calls("entity.presentDetails")
    assert (doc.scope == EVERYONE) is shown
    if shown:
        assert _description(call["metadata"]) == chunk["content"]
    else:
        assert call["error"] == {"status": "restricted"}
        _assert_nothing_of(bot, chunk["content"])


# ---------------------------------------------------------------- who may read it


async def test_a_channels_document_pasted_in_another_channel_shows_nothing_of_it(
    bot: Bot, falcon: tuple[DocumentRow, dict[str, Any]]
) -> None:
    doc, chunk = falcon
    bot.slack.set_members(CHANNEL_ID, [MEMBER])
    bot.slack.set_members(OTHER_CHANNEL, [MEMBER, OUTSIDER])
    (entity,) = await _unfurled(
        bot, link_shared_event([_link(bot, doc, chunk)], channel=OTHER_CHANNEL)
    )
    assert entity["entity_payload"]["attributes"]["title"]["text"] == EN.ENTITY_RESTRICTED
    assert _description(entity) is None
    # Even a member of its channel gets no details there: they would refresh the card
    # everyone in OTHER_CHANNEL sees.
    for user in (MEMBER, OUTSIDER):
        trigger = bot.slack.entity_trigger(entity["external_ref"]["id"])
        await _deliver(bot, details_event(entity, trigger, user=user, channel=OTHER_CHANNEL))
    await bot.idle()
    calls = bot.slack.calls("entity.presentDetails")
    assert [c.get("error") for c in calls] == [{"status": "restricted"}] * 2
    _assert_nothing_of(bot, chunk["content"], "14 March", "Project Falcon")


@pytest.mark.parametrize("channel", [DM_CHANNEL_ID, "composer"])
async def test_a_channels_document_shows_nothing_in_a_dm_or_the_composer(
    bot: Bot, falcon: tuple[DocumentRow, dict[str, Any]], channel: str
) -> None:
    doc, chunk = falcon
    url = _link(bot, doc, chunk)
    if channel == "composer":
        event = link_shared_event([url], source="composer")
    else:
        event = link_shared_event([url], channel=channel)
    (entity,) = await _unfurled(bot, event)
    assert _description(entity) is None
    _assert_nothing_of(bot, chunk["content"], "14 March", "Project Falcon")


async def test_the_flexpane_refuses_a_person_no_longer_in_the_channel(
    bot: Bot, falcon: tuple[DocumentRow, dict[str, Any]]
) -> None:
    doc, chunk = falcon
    bot.slack.set_members(CHANNEL_ID, [MEMBER])
    (entity,) = await _unfurled(bot, link_shared_event([_link(bot, doc, chunk)]))
    bot.slack.reset()
    trigger = bot.slack.entity_trigger(entity["external_ref"]["id"])
    await _deliver(bot, details_event(entity, trigger, user=OUTSIDER))
    await bot.idle()
    (call,) = bot.slack.calls("entity.presentDetails")
    assert call["error"] == {"status": "restricted"} and "metadata" not in call
    _assert_nothing_of(bot, chunk["content"])


async def test_a_person_of_another_organisation_gets_no_unfurl_and_no_flexpane(
    bot: Bot, handbook: tuple[DocumentRow, dict[str, Any]]
) -> None:
    doc, chunk = handbook
    bot.slack.set_user(EXTERNAL_USER)["team_id"] = OTHER_TEAM
    url = _link(bot, doc, chunk)
    await _share(bot, link_shared_event([url], user=EXTERNAL_USER))
    assert bot.slack.calls("chat.unfurl", include_rejected=True) == []

    entity = {"external_ref": {"id": parse_link(url, PUBLIC_URL).ref}, "url": url}  # type: ignore[union-attr]
    trigger = bot.slack.entity_trigger(entity["external_ref"]["id"])
    await _deliver(
        bot, details_event({**entity, "app_unfurl_url": url}, trigger, user=EXTERNAL_USER)
    )
    await bot.idle()
    (call,) = bot.slack.calls("entity.presentDetails")
    assert call["error"] == {"status": "restricted"}
    _assert_nothing_of(bot, chunk["content"], "Employee handbook")


async def test_people_of_other_organisations_get_unfurls_when_allowed(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(allow_external=True)
    bot.slack.set_user(EXTERNAL_USER)["team_id"] = OTHER_TEAM
    doc = _doc(bot, "handbook.md")
    chunk = _chunks(bot, doc)[0]
    (entity,) = await _unfurled(
        bot, link_shared_event([_link(bot, doc, chunk)], user=EXTERNAL_USER)
    )
    assert _description(entity) == chunk["content"]


async def test_a_channel_shared_with_another_organisation_reads_only_its_own_documents(
    bot: Bot,
    handbook: tuple[DocumentRow, dict[str, Any]],
    falcon: tuple[DocumentRow, dict[str, Any]],
) -> None:
    (everyone_doc, everyone_chunk), (channel_doc, channel_chunk) = handbook, falcon
    urls = [_link(bot, everyone_doc, everyone_chunk), _link(bot, channel_doc, channel_chunk)]
    entities = await _unfurled(bot, link_shared_event(urls), is_ext_shared_channel=True)
    assert [_description(e) for e in entities] == [None, channel_chunk["content"]]
    _assert_nothing_of(bot, everyone_chunk["content"], "Employee handbook")


def readable_here(scope: str, where: Where, *, allow_external: bool) -> bool:
    """Whether everyone at ``where`` reads ``scope``, no guest reading along (the access rule)."""
    return visible(shown_at(where, allow_external=allow_external), scope)


def test_who_reads_an_unfurl_where() -> None:
    here, dm = Where(CHANNEL_ID, shared=False), Where(DM_CHANNEL_ID, shared=False)
    composer, shared = Where(None, shared=False), Where(CHANNEL_ID, shared=True)
    assert readable_here(EVERYONE, here, allow_external=False)
    assert readable_here(EVERYONE, dm, allow_external=False)
    assert readable_here(EVERYONE, composer, allow_external=False)
    assert not readable_here(EVERYONE, shared, allow_external=False)
    assert readable_here(EVERYONE, shared, allow_external=True)
    assert readable_here(CHANNEL_ID, here, allow_external=False)
    assert readable_here(CHANNEL_ID, shared, allow_external=False)
    assert not readable_here(CHANNEL_ID, Where(OTHER_CHANNEL, False), allow_external=False)
    assert not readable_here(CHANNEL_ID, dm, allow_external=False)
    assert not readable_here(CHANNEL_ID, composer, allow_external=False)


# ---------------------------------------------------------------- links that are refused


def _tampered(token: str) -> str:
    return token[:-1] + ("A" if token[-1] != "A" else "B")


@pytest.mark.parametrize("kind", ["tampered", "expired", "other document", "no token", "moved"])
async def test_a_link_whose_token_does_not_verify_is_not_unfurled(
    bot: Bot,
    handbook: tuple[DocumentRow, dict[str, Any]],
    falcon: tuple[DocumentRow, dict[str, Any]],
    kind: str,
) -> None:
    doc, chunk = handbook
    signer = bot.services.engine.signer
    token = {
        "tampered": _tampered(signer.token(doc.id, doc.scope)),
        # Signed with the server's secret, long ago: past the link lifetime.
        "expired": LinkSigner(LINK_SECRET, ttl_seconds=60, clock=lambda: 1_000_000.0).token(
            doc.id, doc.scope
        ),
        "other document": signer.token(falcon[0].id, falcon[0].scope),
        "no token": "",
        # A valid token for the document, but for another scope than it has.
        "moved": signer.token(doc.id, CHANNEL_ID),
    }[kind]
    url = _link(bot, doc, chunk, token=token)
    await _share(bot, link_shared_event([url]))
    assert bot.slack.calls("chat.unfurl", include_rejected=True) == []

    entity = {"external_ref": {"id": f"{doc.id}:{chunk['start']}-{chunk['end']}"}, "url": url}
    trigger = bot.slack.entity_trigger(entity["external_ref"]["id"])
    await _deliver(bot, details_event({**entity, "app_unfurl_url": url}, trigger))
    await bot.idle()
    (call,) = bot.slack.calls("entity.presentDetails")
    assert call["error"] == {"status": "restricted"}
    _assert_nothing_of(bot, chunk["content"], "Employee handbook")


@pytest.mark.parametrize(
    "url",
    [
        "https://evil.example/d/{id}?t={t}#char={a},{b}",
        "http://kb.test.evil.example/d/{id}?t={t}#char={a},{b}",
        "http://kb.test@evil.example/d/{id}?t={t}#char={a},{b}",
        "http://user@kb.test/d/{id}?t={t}#char={a},{b}",
        "https://kb.test/d/{id}?t={t}#char={a},{b}",
        "http://kb.test:8080/d/{id}?t={t}#char={a},{b}",
        "http://kb.test/x/d/{id}?t={t}#char={a},{b}",
        "http://kb.test/d/{id}/raw?t={t}#char={a},{b}",
        "http://kb.test/d/{id}?t={t}&t={t}#char={a},{b}",
        "http://kb.test/d/{id}?t={t}&next=/evil#char={a},{b}",
        "http://kb.test/d/{id}?t={t}#char={b},{a}",
        "http://kb.test/d/{id}?t={t}#evil",
        "http://kb.test/d/{id}/file?t={t}#page=0",
        "http://kb.test/d/+{id}?t={t}#char={a},{b}",
        "http://kb.test/d/{id}?t={t}#char={a},{b} ",
    ],
)
async def test_a_link_that_is_not_one_of_this_servers_is_left_alone(
    bot: Bot, handbook: tuple[DocumentRow, dict[str, Any]], url: str
) -> None:
    doc, chunk = handbook
    token = bot.services.engine.signer.token(doc.id, doc.scope)
    shaped = url.format(id=doc.id, t=token, a=chunk["start"] + 1, b=chunk["end"])
    assert parse_link(shaped, PUBLIC_URL) is None
    await _share(bot, link_shared_event([shaped]))
    assert bot.slack.calls("chat.unfurl", include_rejected=True) == []
    _assert_nothing_of(bot, chunk["content"])


async def test_a_removed_document_unfurls_as_no_longer_available(
    bot: Bot, handbook: tuple[DocumentRow, dict[str, Any]]
) -> None:
    doc, chunk = handbook
    url = _link(bot, doc, chunk)
    await asyncio.to_thread(bot.kb.remove, doc.id, actor="test")
    (entity,) = await _unfurled(bot, link_shared_event([url]))
    assert entity["entity_payload"]["attributes"]["title"]["text"] == EN.ENTITY_UNAVAILABLE
    assert "fields" not in entity["entity_payload"]
    trigger = bot.slack.entity_trigger(entity["external_ref"]["id"])
    await _deliver(bot, details_event(entity, trigger))
    await bot.idle()
    (call,) = bot.slack.calls("entity.presentDetails")
    assert call["error"] == {"status": "not_found"}
    _assert_nothing_of(bot, chunk["content"], "Employee handbook")


async def test_a_replaced_version_unfurls_as_no_longer_available(bot: Bot) -> None:
    old = await asyncio.to_thread(
        bot.kb.ingest_bytes,
        b"# Rota\n\nThe rota changes on Mondays.\n",
        "rota.md",
        uploader="fixture",
    )
    doc = old.document
    chunk = _chunks(bot, doc)[0]
    url = _link(bot, doc, chunk)
    await asyncio.to_thread(
        bot.kb.ingest_bytes,
        b"# Rota\n\nThe rota changes on Fridays.\n",
        "rota.md",
        uploader="fixture",
    )
    assert bot.kb.document(doc.id).state == "replaced"
    (entity,) = await _unfurled(bot, link_shared_event([url]))
    assert entity["entity_payload"]["attributes"]["title"]["text"] == EN.ENTITY_UNAVAILABLE
    _assert_nothing_of(bot, "The rota changes on Mondays.")


# ---------------------------------------------------------------- forged payloads


def _forged(event: dict[str, Any], damage: str) -> dict[str, Any]:
    forged = json.loads(json.dumps(event))
    if damage == "no links":
        del forged["links"]
    elif damage == "links not a list":
        forged["links"] = {"url": event["links"][0]["url"]}
    elif damage == "link not an object":
        forged["links"] = [event["links"][0]["url"]]
    elif damage == "url not a string":
        forged["links"] = [{"url": ["x"]}]
    elif damage == "no message_ts":
        del forged["message_ts"]
    elif damage == "no user":
        del forged["user"]
    elif damage == "unknown source":
        forged["source"] = "search"
    elif damage == "channel not an id":
        forged["channel"] = "<!channel>"
    return forged


@pytest.mark.parametrize(
    "damage",
    [
        "no links",
        "links not a list",
        "link not an object",
        "url not a string",
        "no message_ts",
        "no user",
        "unknown source",
        "channel not an id",
        "another workspace",
    ],
)
async def test_a_forged_link_shared_event_is_ignored_with_a_log_line(
    bot: Bot,
    handbook: tuple[DocumentRow, dict[str, Any]],
    damage: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    doc, chunk = handbook
    event = link_shared_event([_link(bot, doc, chunk)])
    bot.slack.share_links(event)
    caplog.set_level(logging.INFO, logger="bot.slack.unfurls")
    if damage == "another workspace":
        await _deliver(bot, event, team_id=OTHER_TEAM)
    else:
        await _deliver(bot, _forged(event, damage))
    await bot.idle()
    assert bot.slack.calls("chat.unfurl", include_rejected=True) == []
    assert any(r.name == "bot.slack.unfurls" for r in caplog.records), damage
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    _assert_nothing_of(bot, chunk["content"])


@pytest.mark.parametrize(
    "damage", ["no trigger", "no user", "another workspace", "foreign url", "mismatched ref"]
)
async def test_a_forged_details_request_presents_nothing(
    bot: Bot,
    handbook: tuple[DocumentRow, dict[str, Any]],
    damage: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    doc, chunk = handbook
    (entity,) = await _unfurled(bot, link_shared_event([_link(bot, doc, chunk)]))
    bot.slack.reset()
    trigger = bot.slack.entity_trigger(entity["external_ref"]["id"])
    event = details_event(entity, trigger)
    envelope: dict[str, Any] = {}
    if damage == "no trigger":
        del event["trigger_id"]
    elif damage == "no user":
        del event["user"]
    elif damage == "another workspace":
        envelope["team_id"] = OTHER_TEAM
    elif damage == "foreign url":
        event["app_unfurl_url"] = event["entity_url"] = "https://evil.example/d/1?t=x"
    elif damage == "mismatched ref":
        event["external_ref"] = {"id": "999:0-10"}
    caplog.set_level(logging.INFO, logger="bot.slack.unfurls")
    await _deliver(bot, event, **envelope)
    await bot.idle()
    calls = bot.slack.calls("entity.presentDetails", include_rejected=True)
    assert all("metadata" not in c for c in calls)
    assert any(r.name == "bot.slack.unfurls" for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    _assert_nothing_of(bot, chunk["content"])


async def test_a_flood_of_links_is_looked_at_only_up_to_the_bound(
    bot: Bot, handbook: tuple[DocumentRow, dict[str, Any]]
) -> None:
    doc, _ = handbook
    chunks = _chunks(bot, doc)
    urls = [
        f"{PUBLIC_URL}/d/{doc.id}?t={bot.services.engine.signer.token(doc.id, doc.scope)}"
        f"#char={i},{i + 1}"
        for i in range(MAX_LINKS + 5)
    ]
    assert chunks
    entities = await _unfurled(bot, link_shared_event(urls))
    assert len(entities) == MAX_LINKS


# ---------------------------------------------------------------- the mock follows Slack


async def test_the_mock_refuses_what_slack_refuses(slack: MockSlackAPI) -> None:
    client = AsyncWebClient(token=slack.bot_token, base_url=slack.api_url)
    url = f"{PUBLIC_URL}/d/1?t=abc"
    good = {
        "app_unfurl_url": url,
        "url": url,
        "external_ref": {"id": "1"},
        "entity_type": ENTITY_TYPE,
        "entity_payload": {"attributes": {"title": {"text": "A"}}},
    }
    event = link_shared_event([url])
    slack.share_links(event)
    target = {"channel": event["channel"], "ts": event["message_ts"]}

    async def unfurl_error(**kwargs: Any) -> str:
        with pytest.raises(SlackApiError) as raised:
            await client.chat_unfurl(**kwargs)
        return str(raised.value.response["error"])

    assert await unfurl_error(channel=CHANNEL_ID, metadata={"entities": [good]}) == "missing_ts"
    assert await unfurl_error(**target) == "missing_unfurls"
    bad_type = {**good, "entity_type": "slack#/entities/page"}
    assert await unfurl_error(**target, metadata={"entities": [bad_type]}) == (
        "error_processing_metadata"
    )
    no_title = {**good, "entity_payload": {"attributes": {}}}
    assert await unfurl_error(**target, metadata={"entities": [no_title]}) == (
        "error_processing_metadata"
    )
    elsewhere = {**good, "app_unfurl_url": f"{PUBLIC_URL}/d/2?t=abc"}
    assert await unfurl_error(**target, metadata={"entities": [elsewhere]}) == "cannot_unfurl_url"
    assert await unfurl_error(channel=CHANNEL_ID, ts="1.2", metadata={"entities": [good]}) == (
        "cannot_find_message"
    )
    await client.chat_unfurl(**target, metadata={"entities": [good]})
    assert slack.unfurls[(CHANNEL_ID, event["message_ts"])] == [good]

    trigger = slack.entity_trigger("1")
    details = {k: v for k, v in good.items() if k != "app_unfurl_url"}
    for kwargs, error in [
        ({"trigger_id": "nope", "metadata": details}, "invalid_trigger_id"),
        ({"trigger_id": trigger, "metadata": {**details, "external_ref": {"id": "2"}}}, None),
        ({"trigger_id": trigger, "error": {"status": "gone"}}, "invalid_arguments"),
        ({"trigger_id": trigger, "user_auth_required": True}, "user_auth_url_missing"),
    ]:
        with pytest.raises(SlackApiError) as raised:
            await client.entity_presentDetails(**kwargs)
        expected = error or "entity_metadata_does_not_match_trigger"
        assert raised.value.response["error"] == expected
    await client.entity_presentDetails(trigger_id=trigger, metadata=details)
    await client.entity_presentDetails(trigger_id=trigger, error={"status": "restricted"})
    assert len(slack.calls("entity.presentDetails")) == 2


# ---------------------------------------------------------------- attacks from outside

# A document written to attack whoever quotes it: broadcasts, mentions, forged links and
# mrkdwn in its title, its section and its text; terminal escapes, a bell, a backspace and a bidi
# override that would show "fdp.exe" as "exe.pdf".
HOSTILE = (
    "# <!channel> Pay <@U0MEMBER01> &amp; *now*\n\n"
    "## <https://evil.example|Click here> <!here>\n\n"
    "Send <!channel> and <@U0MEMBER01> to <https://evil.example|the runbook> & wait "
    "<!subteam^S123> <#C0OTHER001> *bold* `code` \x1b[31mred\x1b[0m\x07 bell\x0b\x08 "
    "\u202epay fdp.exe\u202c done.\n\n"
    "## Next\n\n"
    "Then \x1b]8;;https://evil.example\x07open\x1b]8;;\x07 <!here> \r\x7f\x85 and go home.\n"
)
_CONTROL = {chr(c) for c in range(0x20)} - {"\n", "\t"} | {"\x7f"}
_BIDI = {chr(c) for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]}


def _strings(value: Any, key: str = "") -> list[tuple[str, str]]:
    """Every string of a JSON value, with the key it is under."""
    if isinstance(value, str):
        return [(key, value)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _strings(v, k)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v, key)]
    return []


def _assert_inert(entity: dict[str, Any]) -> None:
    """No string of ``entity`` but the server's own URLs can mention, link or hide text."""
    for key, text in _strings(entity):
        if key in {"url", "app_unfurl_url"}:
            continue
        assert "<" not in text and ">" not in text, (key, text)
        assert not set(text) & (_CONTROL | _BIDI), (key, text)


async def _hostile(bot: Bot) -> tuple[DocumentRow, dict[str, Any]]:
    added = await asyncio.to_thread(
        bot.kb.ingest_bytes, HOSTILE.encode(), "hostile.md", uploader="fixture"
    )
    doc = added.document
    assert doc.state == "indexed", doc.failure_reason
    (chunk,) = [c for c in _chunks(bot, doc) if "runbook" in c["content"]]
    return doc, chunk


async def test_a_hostile_documents_words_are_inert_in_the_card_and_the_flexpane(
    bot: Bot,
) -> None:
    doc, chunk = await _hostile(bot)
    assert "<!channel>" in doc.title and "\x1b" in chunk["content"]  # the attack is intact
    (entity,) = await _unfurled(bot, link_shared_event([_link(bot, doc, chunk)]))
    trigger = bot.slack.entity_trigger(entity["external_ref"]["id"])
    await _deliver(bot, details_event(entity, trigger))
    await bot.idle()
    (call,) = bot.slack.calls("entity.presentDetails")
    for shown in (entity, call["metadata"]):
        _assert_inert(shown)
        attributes = shown["entity_payload"]["attributes"]
        assert attributes["title"]["text"].startswith("&lt;!channel&gt; Pay &lt;@U0MEMBER01&gt;")
        assert "&lt;https://evil.example|Click here&gt;" in attributes["display_id"]
        description = _description(shown) or ""
        assert "Send &lt;!channel&gt; and &lt;@U0MEMBER01&gt; to &lt;https://evil" in description
        assert "red" in description and "done." in description
    after = _custom(call["metadata"])["after"]["value"]
    assert "open" in after and "&lt;!here&gt;" in after and after.endswith("and go home.")
    assert bot.slack.rejected == []


async def test_a_huge_hostile_title_and_passage_stay_within_slacks_limits_once_escaped(
    bot: Bot,
) -> None:
    # Each "<" and "&" grows fivefold when escaped: a cut before escaping would overflow.
    # The heading alone is past every limit before escaping; the passage under it, twice
    # past a text value's once escaped (more would only be more passages to embed).
    body = "# " + "<!channel>&" * 100 + "\n\n## " + "<&>" * 1500 + "\n\n" + "<&>" * 600 + "\n"
    added = await asyncio.to_thread(bot.kb.ingest_bytes, body.encode(), "huge.md", uploader="t")
    doc = added.document
    assert doc.state == "indexed", doc.failure_reason
    text = bot.kb.canonical_text(doc.id)
    token = bot.services.engine.signer.token(doc.id, doc.scope)
    start = text.index("<&><&>")
    url = f"{PUBLIC_URL}/d/{doc.id}?t={token}#char={start},{len(text)}"
    (entity,) = await _unfurled(bot, link_shared_event([url]))
    trigger = bot.slack.entity_trigger(entity["external_ref"]["id"])
    await _deliver(bot, details_event(entity, trigger))
    await bot.idle()
    (call,) = bot.slack.calls("entity.presentDetails")
    for shown in (entity, call["metadata"]):
        _assert_inert(shown)
        attributes = shown["entity_payload"]["attributes"]
        # A header's 150 characters for the title and the display id; 3000 for a text value.
        assert 0 < len(attributes["title"]["text"]) <= 150
        assert 0 < len(attributes.get("display_id", "x")) <= 150
        description = _description(shown) or ""
        assert description.startswith("&lt;&amp;&gt;") and description.endswith("…")
        assert len(description) <= TEXT_LIMIT
        for field in _custom(shown).values():
            assert len(str(field["value"])) <= TEXT_LIMIT, field["key"]
    assert bot.slack.rejected == []


@pytest.mark.parametrize(
    "url",
    [
        "http://kb.test/d/{id}/../{id}?t={t}#char={a},{b}",
        "http://kb.test/d/{id}/%2E%2E/{id}?t={t}#char={a},{b}",
        "http://kb.test//d/{id}?t={t}#char={a},{b}",
        "http://kb.test/d//{id}?t={t}#char={a},{b}",
        "http://kb.test/d/{id}/?t={t}#char={a},{b}",
        "http://kb.test/d/{id}/file/?t={t}#page=1",
        "http://kb.test/d/%3{first}{rest}?t={t}#char={a},{b}",
        "http://kb.test/D/{id}?t={t}#char={a},{b}",
        "http://kb.test/d/{id};x?t={t}#char={a},{b}",
        "http://kb.test/d/{id}?T={t}#char={a},{b}",
        "http://kb.test/d/{id}?t={t};x=1#char={a},{b}",
        "http://kb.test/d/{id}?t={t}&#char={a},{b}",
        "http://kb.test/d/{id}?t#char={a},{b}",
        "http://kb.test/d/{id}?t={t}#page=1",
        "http://kb.test/d/{id}?t={t}#char={a},{b}#char=0,99999",
        "http://kb.test./d/{id}?t={t}#char={a},{b}",
        "http://kb.test.:80/d/{id}?t={t}#char={a},{b}",
        "http://@kb.test/d/{id}?t={t}#char={a},{b}",
        "http://:@kb.test/d/{id}?t={t}#char={a},{b}",
        "http://kb.test:80@evil.example/d/{id}?t={t}#char={a},{b}",
        "http://kb.test%40evil.example/d/{id}?t={t}#char={a},{b}",
        "http://kb.test\\@evil.example/d/{id}?t={t}#char={a},{b}",
        "http://kb.tést/d/{id}?t={t}#char={a},{b}",
        "http://xn--kb-test-9ua/d/{id}?t={t}#char={a},{b}",
        "http://kb.test:65536/d/{id}?t={t}#char={a},{b}",
        "http://kb.test:http/d/{id}?t={t}#char={a},{b}",
        "http://127.0.0.1/d/{id}?t={t}#char={a},{b}",
        "//kb.test/d/{id}?t={t}#char={a},{b}",
        "kb.test/d/{id}?t={t}#char={a},{b}",
        "javascript://kb.test/d/{id}?t={t}#char={a},{b}",
        "http://kb.test/d/{id}?t={t}%00#char={a},{b}",
        "http://kb.test/d/{id}?t={t}\u200b#char={a},{b}",
    ],
)
async def test_a_link_that_only_looks_like_one_of_this_servers_is_left_alone(
    bot: Bot, handbook: tuple[DocumentRow, dict[str, Any]], url: str
) -> None:
    doc, chunk = handbook
    token = bot.services.engine.signer.token(doc.id, doc.scope)
    first, rest = str(doc.id)[0], str(doc.id)[1:]
    shaped = url.format(
        id=doc.id, first=first, rest=rest, t=token, a=chunk["start"], b=chunk["end"]
    )
    assert parse_link(shaped, PUBLIC_URL) is None
    await _share(bot, link_shared_event([shaped]))
    assert bot.slack.calls("chat.unfurl", include_rejected=True) == []
    _assert_nothing_of(bot, chunk["content"])


@pytest.mark.parametrize(
    "url",
    [
        "HTTP://KB.TEST/d/{id}?t={t}#char={a},{b}",
        "http://kb.test:80/d/{id}?t={t}#char={a},{b}",
        "http://kb.test:/d/{id}?t={t}#char={a},{b}",
        "http://kb.test/d/{id}?%74={t}#char={a},{b}",
    ],
)
async def test_the_same_link_spelled_otherwise_unfurls_as_posted(
    bot: Bot, handbook: tuple[DocumentRow, dict[str, Any]], url: str
) -> None:
    doc, chunk = handbook
    token = bot.services.engine.signer.token(doc.id, doc.scope)
    shaped = url.format(id=doc.id, t=token, a=chunk["start"], b=chunk["end"])
    (entity,) = await _unfurled(bot, link_shared_event([shaped]))
    assert entity["app_unfurl_url"] == shaped  # what Slack matches against the message
    assert entity["url"] == _link(bot, doc, chunk, token=token)  # rebuilt, canonical
    assert _description(entity) == chunk["content"]


async def test_a_redelivered_event_is_answered_once(
    bot: Bot, handbook: tuple[DocumentRow, dict[str, Any]]
) -> None:
    doc, chunk = handbook
    event = link_shared_event([_link(bot, doc, chunk)])
    bot.slack.share_links(event)
    body = event_body(event)
    for retry in (None, 1, 2):  # Slack's retries carry the same event_id
        resp = await bot.post(body, retry_num=retry)
        assert resp.status == 200
    await bot.idle()
    (call,) = bot.slack.calls("chat.unfurl", include_rejected=True)
    ref = call["metadata"]["entities"][0]["external_ref"]["id"]
    trigger = bot.slack.entity_trigger(ref)
    details = event_body(details_event(call["metadata"]["entities"][0], trigger))
    for retry in (None, 1):
        resp = await bot.post(details, retry_num=retry)
        assert resp.status == 200
    await bot.idle()
    assert len(bot.slack.calls("entity.presentDetails", include_rejected=True)) == 1


async def test_no_log_line_carries_a_link_token(
    bot: Bot,
    handbook: tuple[DocumentRow, dict[str, Any]],
    falcon: tuple[DocumentRow, dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    (doc, chunk), (secret_doc, secret_chunk) = handbook, falcon
    signer = bot.services.engine.signer
    good, other = signer.token(doc.id, doc.scope), signer.token(secret_doc.id, secret_doc.scope)
    bad = _tampered(good)
    urls = [_link(bot, doc, chunk, token=t) for t in (good, bad)] + [
        _link(bot, secret_doc, secret_chunk, token=other)
    ]
    entities = await _unfurled(bot, link_shared_event(urls, channel=OTHER_CHANNEL))
    assert len(entities) == 2  # the passage, and the channel's document as restricted
    for entity in entities:
        trigger = bot.slack.entity_trigger(entity["external_ref"]["id"])
        await _deliver(bot, details_event(entity, trigger, channel=OTHER_CHANNEL))
    forged = {"external_ref": {"id": "1"}, "url": urls[1], "app_unfurl_url": urls[1]}
    await _deliver(bot, details_event(forged, bot.slack.entity_trigger("1")))
    await bot.idle()
    assert len(bot.slack.calls("entity.presentDetails")) == 3
    # The product's own lines and its libraries' outside the noisy ones (those the product
    # keeps at WARNING: the Web API client logs whole request bodies at DEBUG).
    ours = [r for r in caplog.records if not r.name.startswith(NOISY_LOGGERS)]
    assert any(r.name == "bot.slack.unfurls" for r in ours)
    formatter = build_formatter("json")
    for token in (good, bad, other, bot.slack.bot_token):
        for record in caplog.records:
            assert token not in formatter.format(record), record.name
        for record in ours:
            assert token not in record.getMessage(), record.name


async def test_a_flexpane_in_a_channel_shared_with_another_organisation_follows_its_card(
    bot: Bot, handbook: tuple[DocumentRow, dict[str, Any]]
) -> None:
    doc, chunk = handbook
    (entity,) = await _unfurled(
        bot, link_shared_event([_link(bot, doc, chunk)]), is_ext_shared_channel=True
    )
    assert entity["entity_payload"]["attributes"]["title"]["text"] == EN.ENTITY_RESTRICTED
    # A member of this workspace opens it: the card everyone there sees would be refreshed.
    trigger = bot.slack.entity_trigger(entity["external_ref"]["id"])
    await _deliver(bot, details_event(entity, trigger), is_ext_shared_channel=True)
    await bot.idle()
    (call,) = bot.slack.calls("entity.presentDetails")
    assert call["error"] == {"status": "restricted"}
    _assert_nothing_of(bot, chunk["content"], "Employee handbook")


async def test_a_token_for_one_document_opens_no_other_in_a_crowd_of_links(
    bot: Bot,
    handbook: tuple[DocumentRow, dict[str, Any]],
    falcon: tuple[DocumentRow, dict[str, Any]],
) -> None:
    (doc, chunk), (secret_doc, secret_chunk) = handbook, falcon
    token = bot.services.engine.signer.token(doc.id, doc.scope)
    # The handbook's token on every other document id there is, and on ids there are not.
    ids = sorted({d.id for d in bot.kb.documents()} - {doc.id}) + [0, 10**17]
    urls = [f"{PUBLIC_URL}/d/{i}?t={token}#char=0,40" for i in ids][: MAX_LINKS - 1]
    assert any(f"/d/{secret_doc.id}?" in u for u in urls)
    urls.append(_link(bot, doc, chunk, token=token))
    (entity,) = await _unfurled(bot, link_shared_event(urls))
    assert _description(entity) == chunk["content"]
    _assert_nothing_of(bot, secret_chunk["content"], "Project Falcon", "Security policy")


async def test_a_flexpane_opened_in_another_workspace_presents_nothing(
    bot: Bot, falcon: tuple[DocumentRow, dict[str, Any]]
) -> None:
    doc, chunk = falcon
    bot.slack.set_members(CHANNEL_ID, [USER_ID])
    (entity,) = await _unfurled(bot, link_shared_event([_link(bot, doc, chunk)]))
    bot.slack.reset()
    trigger = bot.slack.entity_trigger(entity["external_ref"]["id"])
    await _deliver(bot, details_event(entity, trigger), team_id=OTHER_TEAM)
    await bot.idle()
    assert bot.slack.calls("entity.presentDetails", include_rejected=True) == []
    _assert_nothing_of(bot, chunk["content"])


@pytest.mark.parametrize("claim", ["its own ref", "the card's ref", "no ref"])
async def test_a_flexpane_for_a_document_the_opener_may_not_read_presents_nothing(
    bot: Bot,
    handbook: tuple[DocumentRow, dict[str, Any]],
    falcon: tuple[DocumentRow, dict[str, Any]],
    claim: str,
) -> None:
    (doc, chunk), (secret_doc, secret_chunk) = handbook, falcon
    bot.slack.set_members(CHANNEL_ID, [MEMBER])
    (card,) = await _unfurled(bot, link_shared_event([_link(bot, doc, chunk)]))
    # The opener, not in the channel, swaps in a valid link to the channel's document
    # (one forwarded to them), as the URL the flexpane is for.
    secret_url = _link(bot, secret_doc, secret_chunk)
    secret_ref = parse_link(secret_url, PUBLIC_URL)
    assert secret_ref is not None
    ref = {
        "its own ref": {"id": secret_ref.ref},
        "the card's ref": card["external_ref"],
        "no ref": {},
    }[claim]
    entity = {"external_ref": ref, "url": secret_url, "app_unfurl_url": secret_url}
    trigger = bot.slack.entity_trigger(str(ref.get("id") or card["external_ref"]["id"]))
    event = details_event(entity, trigger, user=OUTSIDER)
    if not ref:
        del event["external_ref"]
    await _deliver(bot, event)
    await bot.idle()
    (call,) = bot.slack.calls("entity.presentDetails", include_rejected=True)
    assert call["error"] == {"status": "restricted"}
    _assert_nothing_of(bot, secret_chunk["content"], "Project Falcon")


async def test_an_event_replayed_after_slacks_five_minutes_is_refused(
    bot: Bot, handbook: tuple[DocumentRow, dict[str, Any]]
) -> None:
    doc, chunk = handbook
    event = link_shared_event([_link(bot, doc, chunk)])
    bot.slack.share_links(event)
    # Signed correctly, but ten minutes ago: Slack's signing rules refuse it (older than 300 s).
    resp = await bot.post(event_body(event), timestamp=int(time.time()) - 600)
    assert resp.status == 401
    await bot.idle()
    assert bot.slack.calls("chat.unfurl", include_rejected=True) == []
    _assert_nothing_of(bot, chunk["content"])
