"""Uploads as Block Kit: a file's status line (with Retry) and the ``/kb-upload`` modal."""

from __future__ import annotations

from typing import Any

from slack_sdk.models.blocks import (
    Block,
    InputBlock,
    Option,
    PlainTextInputElement,
    RadioButtonsElement,
)
from slack_sdk.models.blocks.block_elements import FileInputElement  # not re-exported above
from slack_sdk.models.views import View

from bot.slack.blocks.actions import (
    RETRY_ACTION_ID,
    UPLOAD_CALLBACK_ID,
    UPLOAD_FILES_BLOCK,
    UPLOAD_TITLE_BLOCK,
    UPLOAD_VISIBILITY_BLOCK,
    VISIBILITY_CHANNEL,
    VISIBILITY_EVERYONE,
)
from bot.slack.blocks.elements import Rendered, actions, button, plain_text, section
from bot.slack.blocks.mrkdwn import MODAL_TITLE_LIMIT, shorten, split_mrkdwn
from bot.slack.words import Words

# Slack's file_input element takes 1 to 10 files.
UPLOAD_MAX_FILES = 10
UPLOAD_FILETYPES = [
    *("md", "markdown", "txt", "text", "html", "htm", "pdf"),
    *("docx", "docm", "pptx", "pptm", "xlsx", "xlsm", "csv", "tsv"),
]
TITLE_MAX_CHARS = 200


def render_upload_status(
    text: str, *, words: Words, retry_document_id: int | None = None
) -> Rendered:
    """A file's status line, with a Retry button when the document can be indexed again (a status
    past a section's limit, such as a long failure reason, takes as many sections as it needs)."""
    parts = split_mrkdwn(text)
    blocks: list[Block] = [section(part) for part in parts]
    if retry_document_id is not None:
        retry = button(RETRY_ACTION_ID, words.UPLOAD_RETRY, str(retry_document_id))
        blocks.append(actions([retry]))
    # The notification's text is the first section's when the status takes several.
    return Rendered.build(parts[0] if len(parts) > 1 else text, blocks)


def upload_modal(
    private_metadata: str, *, channel_scope_allowed: bool, words: Words
) -> dict[str, Any]:
    """The ``/kb-upload`` modal: files, who may see them, an optional title.

    Args:
        private_metadata: carried back on submission (the channel to report to).
        channel_scope_allowed: offer "only this channel" (not in a DM, which has no audience).
        words: the uploader's language.
    """
    files = FileInputElement(
        action_id=UPLOAD_FILES_BLOCK, filetypes=list(UPLOAD_FILETYPES), max_files=UPLOAD_MAX_FILES
    )
    blocks: list[Block] = [
        section(words.UPLOAD_MODAL_INTRO),
        InputBlock(
            block_id=UPLOAD_FILES_BLOCK,
            label=plain_text(words.UPLOAD_FILES_LABEL),
            element=files,
        ),
    ]
    if channel_scope_allowed:
        everyone = Option(
            text=plain_text(words.UPLOAD_VISIBILITY_EVERYONE), value=VISIBILITY_EVERYONE
        )
        channel = Option(text=plain_text(words.UPLOAD_VISIBILITY_CHANNEL), value=VISIBILITY_CHANNEL)
        visibility = RadioButtonsElement(
            action_id=UPLOAD_VISIBILITY_BLOCK, options=[everyone, channel], initial_option=everyone
        )
        blocks.append(
            InputBlock(
                block_id=UPLOAD_VISIBILITY_BLOCK,
                label=plain_text(words.UPLOAD_VISIBILITY_LABEL),
                element=visibility,
            )
        )
    title = PlainTextInputElement(action_id=UPLOAD_TITLE_BLOCK, max_length=TITLE_MAX_CHARS)
    blocks.append(
        InputBlock(
            block_id=UPLOAD_TITLE_BLOCK,
            optional=True,
            label=plain_text(words.UPLOAD_TITLE_LABEL),
            hint=plain_text(words.UPLOAD_TITLE_HINT),
            element=title,
        )
    )
    return View(
        type="modal",
        callback_id=UPLOAD_CALLBACK_ID,
        title=plain_text(shorten(words.UPLOAD_MODAL_TITLE, MODAL_TITLE_LIMIT)),
        submit=plain_text(shorten(words.UPLOAD_MODAL_SUBMIT, MODAL_TITLE_LIMIT)),
        close=plain_text(shorten(words.UPLOAD_MODAL_CLOSE, MODAL_TITLE_LIMIT)),
        private_metadata=private_metadata,
        blocks=blocks,
    ).to_dict()
