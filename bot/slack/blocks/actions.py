"""The ids Slack sends back, which the handlers match on: one place each.

Action ids of buttons, callback ids of views, and the block and action ids of the
``/kb-upload`` modal's inputs (its state is read by them). Block ids nothing
matches on stay with the block that has them.
"""

from __future__ import annotations

import re

# Under an answer (bot.slack.blocks.answers).
FEEDBACK_ACTION_ID = "kb_feedback"
ASK_A_PERSON_ACTION_ID = "kb_ask_a_person"

# A file's status (bot.slack.blocks.uploads).
RETRY_ACTION_ID = "kb_upload_retry"

# An approval request (bot.slack.blocks.approvals).
APPROVE_ACTION_ID = "kb_approve"
REJECT_ACTION_ID = "kb_reject"

# The /kb-upload modal (bot.slack.blocks.uploads): its inputs' block ids, each
# also its element's action id, and the values of the visibility choice.
UPLOAD_CALLBACK_ID = "kb_upload"
UPLOAD_FILES_BLOCK = "files"
UPLOAD_VISIBILITY_BLOCK = "visibility"
UPLOAD_TITLE_BLOCK = "title"
VISIBILITY_EVERYONE = "everyone"
VISIBILITY_CHANNEL = "channel"

# The Home tab (bot.slack.blocks.home): its view, and its buttons.
HOME_CALLBACK_ID = "kb_home"
HOME_REFRESH_ACTION_ID = "kb_home_refresh"
HOME_RETRY_ACTION_ID = "kb_home_retry"
HOME_REINDEX_ACTION_ID = "kb_home_reindex"
HOME_PREVIOUS_ACTION_ID = "kb_home_page_previous"
HOME_NEXT_ACTION_ID = "kb_home_page_next"
HOME_PAGE_ACTION_RE = re.compile(r"^kb_home_page_(?:previous|next)$")
