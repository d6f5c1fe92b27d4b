"""Block Kit: every message, modal and Home tab the Slack surface shows, escaped and within Slack's limits.

``mrkdwn`` is the one escaping core (what a model, a document or a person wrote,
made safe to show: escaped, links inert, fitted to a limit); ``elements`` the
small builders (``slack_sdk.models``) and :class:`Rendered`, the message they
make up; ``actions`` the ids Slack sends back that the handlers match on. Then
one module per thing shown: ``answers`` (every outcome of a question, the answer
being written, the passages a search found, notices, feedback and "Ask a person"), ``hand_off`` (a question
handed to people), ``steps`` (the steps of an answer as streaming chunks, an
answer stopped midway), ``uploads`` (a file's status, the ``/kb-upload`` modal),
``approvals`` (approval requests, audit lines), ``home`` (the Home tab),
``entities`` (a passage link as a Work Object: its unfurl and flexpane) and
``from_slack`` (Slack's messages found as the asker, shown to the asker alone).
"""

from __future__ import annotations

from bot.slack.blocks.actions import (
    APPROVE_ACTION_ID,
    ASK_A_PERSON_ACTION_ID,
    FEEDBACK_ACTION_ID,
    HOME_PAGE_ACTION_RE,
    HOME_REFRESH_ACTION_ID,
    HOME_REINDEX_ACTION_ID,
    HOME_RETRY_ACTION_ID,
    REJECT_ACTION_ID,
    RETRY_ACTION_ID,
    UPLOAD_CALLBACK_ID,
    UPLOAD_FILES_BLOCK,
    UPLOAD_TITLE_BLOCK,
    UPLOAD_VISIBILITY_BLOCK,
    VISIBILITY_CHANNEL,
)
from bot.slack.blocks.answers import (
    parse_feedback_value,
    parse_query_id,
    render_answer,
    render_notice,
    render_partial,
    render_search,
)
from bot.slack.blocks.approvals import audit_lines, audited_scopes, render_approval_request
from bot.slack.blocks.elements import Rendered
from bot.slack.blocks.entities import (
    OPEN_VIEWER_ACTION_ID,
    Passage,
    details_error,
    passage_entity,
    restricted_entity,
    unavailable_entity,
    unfurl_metadata,
)
from bot.slack.blocks.from_slack import render_from_slack
from bot.slack.blocks.hand_off import HandOff, mark_handed_off, render_hand_off
from bot.slack.blocks.home import (
    ADMIN_SECTIONS,
    FIRST_PAGES,
    PAGE_SIZES,
    AdminHome,
    Calibration,
    Disliked,
    MemberHome,
    Pages,
    Section,
    document_label,
    external_view,
    home_view,
    page_number,
    page_of,
    parse_page_value,
    readable_by,
)
from bot.slack.blocks.mrkdwn import (
    escape,
    is_user_id,
    linked,
    mention,
    scope_label,
    stream_markdown,
    unnamed_document,
)
from bot.slack.blocks.steps import STEP_DISPLAY_MODE, render_stopped, step_chunks
from bot.slack.blocks.uploads import render_upload_status, upload_modal

__all__ = [
    "ADMIN_SECTIONS",
    "APPROVE_ACTION_ID",
    "ASK_A_PERSON_ACTION_ID",
    "AdminHome",
    "Calibration",
    "Disliked",
    "FEEDBACK_ACTION_ID",
    "FIRST_PAGES",
    "HOME_PAGE_ACTION_RE",
    "HOME_REFRESH_ACTION_ID",
    "HOME_REINDEX_ACTION_ID",
    "HOME_RETRY_ACTION_ID",
    "HandOff",
    "MemberHome",
    "OPEN_VIEWER_ACTION_ID",
    "PAGE_SIZES",
    "Pages",
    "Passage",
    "REJECT_ACTION_ID",
    "RETRY_ACTION_ID",
    "Rendered",
    "STEP_DISPLAY_MODE",
    "Section",
    "UPLOAD_CALLBACK_ID",
    "UPLOAD_FILES_BLOCK",
    "UPLOAD_TITLE_BLOCK",
    "UPLOAD_VISIBILITY_BLOCK",
    "VISIBILITY_CHANNEL",
    "audit_lines",
    "audited_scopes",
    "details_error",
    "document_label",
    "escape",
    "external_view",
    "home_view",
    "is_user_id",
    "linked",
    "mark_handed_off",
    "mention",
    "page_number",
    "page_of",
    "parse_feedback_value",
    "parse_page_value",
    "parse_query_id",
    "passage_entity",
    "readable_by",
    "render_answer",
    "render_approval_request",
    "render_from_slack",
    "render_hand_off",
    "render_notice",
    "render_partial",
    "render_search",
    "render_stopped",
    "render_upload_status",
    "restricted_entity",
    "scope_label",
    "step_chunks",
    "stream_markdown",
    "unavailable_entity",
    "unfurl_metadata",
    "unnamed_document",
    "upload_modal",
]
