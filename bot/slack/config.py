"""What the Slack surface needs to know: its tokens, its API address, who its admins and publishers are.

Built at the entry point from the product's one settings object
(``bot.settings.Settings.slack_config``); tests build it directly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from index.config import DEFAULT_DOWNLOAD_TIMEOUT

DEFAULT_SLACK_API_URL = "https://slack.com/api/"
DEFAULT_MAX_UPLOADS_PER_USER = 3
# A claim on a Slack event lapses this long after its last renewal (every third of it):
# long enough that a database busy for a few seconds does not hand a live answer to a
# redelivery, short enough that Slack's redelivery a minute later finds a dead replica's
# claim lapsed.
DEFAULT_CLAIM_LEASE = 15.0
# Each replica looks this often for uploads whose claim lapsed (their replica died): a
# dead replica's upload is finished within the lease plus this (20 s). A look is one
# read of the few files not done yet, so a short period costs nothing worth counting.
DEFAULT_UPLOAD_SWEEP = 5.0
# The bot's words for a person whose Slack locale and question tell no language.
DEFAULT_LANGUAGE = "en"
# Public channels are C..., private ones C... (newer) or G... (older); never a DM (D...).
_CHANNEL_ID_RE = re.compile(r"[CG][A-Z0-9]{2,}")


def is_channel_id(text: str) -> bool:
    """Whether ``text`` is a Slack channel id (public or private, not a DM)."""
    return _CHANNEL_ID_RE.fullmatch(text) is not None


@dataclass(frozen=True)
class SlackConfig:
    """Tokens and admin policy of one Slack workspace's app.

    Attributes:
        bot_token: ``xoxb-...``; also authenticates file downloads.
        signing_secret: verifies HTTP requests came from Slack.
        app_token: ``xapp-...``; when set the bot connects in Socket Mode.
        api_url: Slack Web API base URL (a test server in tests).
        admin_user_ids: the knowledge-base admins: they run ``/kb-reindex``,
            approve documents for everyone and may always publish.
        workspace_admins_are_admins: Slack workspace admins and owners are admins too.
        allow_external: answer people of other organisations (Slack Connect), and
            use the documents for everyone in channels shared with them.
        publisher_ids: user ids and user-group ids (``S...``) who may add and
            replace documents for everyone without an approval.
        approvals_channel: where approval requests go; empty: to each admin
            of ``admin_user_ids`` by direct message.
        escalation_channel: where "Ask a person" hands questions to people;
            empty: answers have no such button.
        download_timeout: seconds one file's download from Slack may take in all.
        max_uploads_per_user: files of one person downloaded or indexed at a
            time; their further files wait.
        streaming: stream answers natively (``chat.startStream``) where the
            workspace allows it; off: always post, then edit.
        claim_lease: seconds a replica's claim on a Slack event lasts unrenewed
            (``bot.slack.deliveries``).
        upload_sweep: seconds between two looks for uploads whose claim lapsed
            (``bot.slack.uploads.Uploader.take_over``).
        default_language: the catalog language (``bot.slack.words``) of messages
            for several people, and of a person whose locale and question tell none.
        search: also search Slack's messages as the asker (Real-time Search,
            ``bot.slack.search``) and show what is close as its own group.
        canvas_channels: the channels whose canvases are documents (``bot.slack.canvases``).
        canvas_sync: seconds between two syncs of their canvases; 0: events only.
    """

    # Secrets never in a repr: a repr ends up in tracebacks and logs.
    bot_token: str = field(default="", repr=False)
    signing_secret: str = field(default="", repr=False)
    app_token: str = field(default="", repr=False)
    api_url: str = DEFAULT_SLACK_API_URL
    admin_user_ids: frozenset[str] = frozenset()
    workspace_admins_are_admins: bool = True
    allow_external: bool = False
    publisher_ids: frozenset[str] = frozenset()
    approvals_channel: str = ""
    escalation_channel: str = ""
    download_timeout: float = DEFAULT_DOWNLOAD_TIMEOUT
    max_uploads_per_user: int = DEFAULT_MAX_UPLOADS_PER_USER
    streaming: bool = True
    claim_lease: float = DEFAULT_CLAIM_LEASE
    upload_sweep: float = DEFAULT_UPLOAD_SWEEP
    default_language: str = DEFAULT_LANGUAGE
    search: bool = False
    canvas_channels: frozenset[str] = frozenset()
    canvas_sync: float = 0.0

    @property
    def missing(self) -> list[str]:
        """Environment variables that must be set before the bot can talk to Slack."""
        missing = [] if self.bot_token else ["SLACK_BOT_TOKEN"]
        if not self.app_token and not self.signing_secret:
            missing.append("SLACK_SIGNING_SECRET (or SLACK_APP_TOKEN for Socket Mode)")
        return missing


@dataclass(frozen=True)
class SignInConfig:
    """Sign in with Slack for the document viewer (``KB_VIEWER_AUTH=slack``).

    The app's OAuth credentials serve this sign-in only, never the bolt app:
    with them bolt would switch to multi-workspace OAuth installation mode.

    Attributes:
        client_id: the Slack app's client id.
        client_secret: its client secret.
        public_url: where people's browsers reach this server (no trailing slash);
            Slack sends them back to ``<public_url>/auth/slack/callback``.
        session_hours: how long a sign-in lasts in a browser.
    """

    client_id: str
    client_secret: str = field(repr=False)
    public_url: str = "http://localhost:3000"
    session_hours: float = 8.0

    @property
    def session_seconds(self) -> int:
        """The session's lifetime in whole seconds (at least one)."""
        return max(1, round(self.session_hours * 3600))
