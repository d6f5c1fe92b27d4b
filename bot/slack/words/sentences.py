"""Every sentence the bot shows a person, in one place: :class:`Words`, one per language.

Message ids are the English text (standard gettext): the code reads as what an
English-speaking person sees, ``pybabel extract`` finds every id, and a
sentence not yet translated shows in English rather than as a key. Every
sentence is whole, with named ``{fields}`` (``str.format``) for what varies,
and counted sentences are plural entries (``ngettext``: Czech and Romanian
have three forms); no sentence is glued from translated fragments, except that
a sentence with more than one count takes each further counted phrase whole
from its own plural entry (``"{count} passages"``), since one plural entry
follows one number. Numbers are written as the language writes them (Babel:
``1 234`` in Czech, ``1.234`` in Danish, ``0,675`` wherever the comma is the
decimal mark), never with Python's defaults.

Strings are Slack ``mrkdwn`` written by the server, never by a model or a
document, so they may contain formatting; anything interpolated into them that
came from outside (file names, failure reasons) is escaped by the caller.
Failure reasons that come from the index layer (``index.errors``) are English
sentences and stay English inside the translated frame around them.
"""

from __future__ import annotations

import gettext
from datetime import UTC, datetime, tzinfo
from typing import overload
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from babel import Locale
from babel.dates import format_date, format_time
from babel.numbers import format_decimal, format_percent


class N_:  # noqa: N801 - gettext's name for "mark for translation", which extraction finds
    """A fixed sentence: read on a :class:`Words`, it is that language's translation."""

    def __init__(self, msgid: str) -> None:
        self.msgid = msgid

    @overload
    def __get__(self, obj: None, owner: type) -> N_: ...
    @overload
    def __get__(self, obj: Words, owner: type) -> str: ...
    def __get__(self, obj: Words | None, owner: type) -> N_ | str:
        return self if obj is None else obj._(self.msgid)


class _Labels:
    """A mapping of codes to fixed sentences (states, outcomes): read on a :class:`Words`,
    the translated ``dict``."""

    def __init__(self, labels: dict[str, N_]) -> None:
        self.labels = labels

    @overload
    def __get__(self, obj: None, owner: type) -> _Labels: ...
    @overload
    def __get__(self, obj: Words, owner: type) -> dict[str, str]: ...
    def __get__(self, obj: Words | None, owner: type) -> _Labels | dict[str, str]:
        if obj is None:
            return self
        return {code: obj._(label.msgid) for code, label in self.labels.items()}


def _zone(tz: str | None) -> tzinfo:
    """Slack's ``tz`` of a person (``Europe/Prague``), or UTC when it names no zone known here."""
    if not tz:
        return UTC
    try:
        return ZoneInfo(tz)
    except (ValueError, OSError, ZoneInfoNotFoundError):  # not a zone name, or not one known
        return UTC


class Words:
    """The bot's words in one language (``lang``, a catalog's code), its moments shown in
    the time zone ``tz`` (a person's, from Slack; ``None``: UTC).

    Constants read as translated text (``words.PLACEHOLDER``); methods fill
    their fields. Build one with :func:`bot.slack.words.words_for`.
    """

    def __init__(
        self, lang: str, translations: gettext.NullTranslations, tz: str | None = None
    ) -> None:
        self.lang = lang
        self._translations = translations
        self.zone = _zone(tz)

    def __repr__(self) -> str:
        return f"Words({self.lang!r})"

    def _(self, msgid: str, **fields: object) -> str:
        """The translation of ``msgid``, its ``{fields}`` filled (numbers as the language
        writes them)."""
        text = self._translations.gettext(msgid)
        return text.format(**self._shown(fields)) if fields else text

    def ngettext(self, singular: str, plural: str, n: int, **fields: object) -> str:
        """The form of a counted sentence for ``n``, its ``{fields}`` filled (numbers as the
        language writes them)."""
        return self._translations.ngettext(singular, plural, n).format(**self._shown(fields))

    def number(self, value: float, places: int | None = None) -> str:
        """``value`` as the language writes it; ``places``: exactly that many decimals."""
        pattern = None if places is None else "#,##0." + "0" * places if places else "#,##0"
        return format_decimal(value, format=pattern, locale=self.lang)

    def percent(self, share: float, places: int = 0) -> str:
        """``share`` (0.05) as the language writes a percentage (``5 %`` in Czech)."""
        pattern = Locale.parse(self.lang).percent_formats[None].pattern
        if places:  # the language's own pattern (its space before %, or none), more decimals
            pattern = pattern.replace("#,##0", "#,##0." + "0" * places)
        return format_percent(share, format=pattern, locale=self.lang)

    def when(self, at: float | None) -> str:
        """A moment as the language writes it (``7. 12. 2026 23:40``), in the person's Slack
        time zone; ``UTC`` said after it when Slack gave none."""
        if not at:
            return "—"
        try:
            moment = datetime.fromtimestamp(at, self.zone)
        except (OverflowError, OSError, ValueError):  # a time no calendar holds
            return "—"
        joined = str(Locale.parse(self.lang).datetime_formats["medium"])
        shown = joined.replace("{1}", format_date(moment, "medium", locale=self.lang)).replace(
            "{0}", format_time(moment, "short", locale=self.lang)
        )
        return f"{shown} UTC" if self.zone is UTC else shown

    def _shown(self, fields: dict[str, object]) -> dict[str, object]:
        # Counts and measures are ints and floats; identifiers (a document's #id) come as str.
        return {
            k: self.number(v) if isinstance(v, int | float) and not isinstance(v, bool) else v
            for k, v in fields.items()
        }

    # ------------------------------------------------------------ questions

    PLACEHOLDER = N_("Searching the knowledge base…")
    STATUS_SEARCHING = N_("is searching the knowledge base…")
    WRITING = N_("Writing the answer…")
    EMPTY_QUESTION = N_(
        "Ask me anything the company's documents cover, for example "
        "_“How do I submit an expense claim?”_. I answer only from the knowledge base, "
        "with a link to every passage I use."
    )
    REFUSAL = N_(
        "The knowledge base has nothing on this, so I won't guess. "
        "If a document should answer it, add it with `/kb-upload` and ask again."
    )
    EXTERNAL_ASKER = N_(
        "Sorry, I answer only members of this workspace: "
        "the knowledge base holds internal documents."
    )
    SHARED_CHANNEL_NOTE = N_(
        "This channel is shared with another organisation, so I searched only the "
        "documents added to this channel."
    )
    EVIDENCE_HEADER = N_("*No answer generated — here is what the knowledge base says.*")
    EVIDENCE_REASON = N_(
        "The language model is unavailable right now; these passages matched your question."
    )
    EVIDENCE_FALLBACK = N_("No answer generated — here is what the knowledge base says:")
    RELATED_HEADER = N_("*Not an answer — possibly related passages.*")
    RELATED_REASON = N_(
        "Nothing in the knowledge base is close enough to answer this, so no answer was "
        "written. These passages came nearest; open them to check, or ask again in other words."
    )
    RELATED_FALLBACK = N_("Not an answer — possibly related passages:")
    UNSUPPORTED_WARNING = N_(":warning: This answer cites no source; treat it with care.")
    UNCITED_HEADER = N_("*Passages I was given, none of them cited*")
    UNCITED_REASON = N_(
        "The answer above cites none of these, so it may not come from the knowledge base. "
        "They came nearest to your question; open them to check."
    )
    UNCITED_FALLBACK = N_("Passages I was given, none of them cited:")
    SOURCES_HEADER = N_("*Sources*")
    # Beside a passage of a document synced from a source (Confluence...): where it opens there.
    OPEN_ORIGINAL = N_("open the original")
    # core.answer.UNSIGNED_LINKS_TEXT, the engine's note when links cannot be signed.
    UNSIGNED_LINKS = N_(
        "The sources are listed without links: the server cannot sign links right now "
        "(its link secret cannot be created)."
    )
    UNNAMED_PASSAGE = N_("passage")
    BESIDE_HEADER = N_("Possibly related, not used for this answer (too far from your question):")
    EMPTY_ANSWER = N_("_The model returned an empty answer._")
    TRUNCATED = N_("_(The answer was too long for one message and was shortened.)_")
    FEEDBACK_POSITIVE = N_("Helpful")
    FEEDBACK_NEGATIVE = N_("Not helpful")
    FEEDBACK_THANKS_POSITIVE = N_("Thanks! Glad it helped.")
    FEEDBACK_THANKS_NEGATIVE = N_("Thanks for telling me. The answer is flagged for review.")
    FEEDBACK_UNKNOWN = N_(
        "Sorry, I could not record that feedback: the answer is no longer on record."
    )

    def page(self, page: int) -> str:
        """Where a passage of a PDF is (after its document and section)."""
        return self._("p. {page}", page=page)

    def question_waiting_for_yours(self, per_user: int) -> str:
        """A question waiting until fewer of the same person's questions are being answered."""
        return self.ngettext(
            ":hourglass_flowing_sand: Your other question is being answered; this one starts "
            "as soon as it is done (at most {per_user} question per person at a time, "
            "KB_MAX_QUESTIONS_PER_USER).",
            ":hourglass_flowing_sand: Your other questions are being answered; this one starts "
            "as soon as one of them is done (at most {per_user} questions per person at a time, "
            "KB_MAX_QUESTIONS_PER_USER).",
            per_user,
            per_user=per_user,
        )

    def too_long(self, length: int, limit: int) -> str:
        """A question of ``length`` characters, over the ``limit`` read: refused, and what to do."""
        return self._(
            "Your question is {length} long; I read questions of up to {limit}. Ask it in "
            "fewer words, or add the text as a document with `/kb-upload` and ask about it.",
            length=self.ngettext("{count} character", "{count} characters", length, count=length),
            limit=self.ngettext("{count} character", "{count} characters", limit, count=limit),
        )

    # ------------------------------------------------------------ Slack's own messages (KB_SLACK_SEARCH)

    FROM_SLACK_HEADER = N_("*From Slack*")
    FROM_SLACK_AS_YOU = N_(
        "Messages you can read in Slack, searched as you. Only you see them; nothing is stored."
    )
    FROM_SLACK_PUBLIC_ONLY = N_(
        "Public channels only: Slack gave no permission to search as you. "
        "Only you see them; nothing is stored."
    )
    FROM_SLACK_FALLBACK = N_("From Slack, only for you:")
    FROM_SLACK_OPEN = N_("Open")
    FROM_SLACK_RATELIMITED = N_(
        "Slack's messages were not searched this time: Slack allows only a few searches a "
        "minute. The rest of the answer is from the knowledge base; ask again in a minute."
    )
    FROM_SLACK_UNREACHABLE = N_(
        "Slack's messages were not searched: Slack did not answer in time. "
        "The rest of the answer is from the knowledge base."
    )

    def from_slack_refused(self, reason: str) -> str:
        """Slack refused the search; ``reason`` is Slack's error code, already made inert."""
        return self._(
            "Slack's messages were not searched: Slack refused the search ({reason}). "
            "The rest of the answer is from the knowledge base.",
            reason=reason,
        )

    # ------------------------------------------------------------ handing a question to a person

    ASK_A_PERSON = N_("Ask a person")
    HAND_OFF_TITLE = N_(":raising_hand: *A question for a person*")
    HAND_OFF_SOMEONE = N_("someone")
    HAND_OFF_QUESTION_WITHHELD = N_(
        "_The question is shown only when its asker hands it off; open the thread to read it._"
    )
    HAND_OFF_ANSWERED = N_("*My answer:*")
    HAND_OFF_UNSUPPORTED = N_("*My answer, which cited no source:*")
    HAND_OFF_ANSWER_WITHHELD = N_(
        "_I answered from documents not everyone here may read; open the thread to see the answer._"
    )
    HAND_OFF_RELATED = N_("I found no answer, only possibly related passages.")
    HAND_OFF_REFUSED = N_("The knowledge base has nothing on this, so I did not answer.")
    HAND_OFF_EVIDENCE = N_(
        "The language model was unavailable, so I showed matching passages without an answer."
    )
    HAND_OFF_OPEN_THREAD = N_("Open the thread")
    HAND_OFF_NO_LINK = N_("_Slack gave no link to the thread; look for it in the channel._")
    HAND_OFF_OFF = N_("Handing questions to a person is turned off.")
    HAND_OFF_UNKNOWN = N_("Sorry, that question is no longer on record, so I cannot hand it off.")
    HAND_OFF_NOT_YOURS = N_("Only the person who asked this question can hand it to a person.")
    HAND_OFF_FAILED = N_(
        "Sorry, I could not reach Slack to hand this off. Please try again in a minute."
    )

    def hand_off_asked(self, asker: str | None, channel: str | None) -> str:
        """Who asked where: ``asker`` a mention (``None``: unknown), ``channel`` a channel link
        (``None``: a direct message with the bot)."""
        if asker is None and channel is None:
            return self._("Asked by someone in a direct message with me.")
        if asker is None:
            return self._("Asked by someone in {channel}.", channel=channel)
        if channel is None:
            return self._("Asked by {asker} in a direct message with me.", asker=asker)
        return self._("Asked by {asker} in {channel}.", asker=asker, channel=channel)

    def hand_off_by(self, user: str) -> str:
        """Who handed it off, when not the asker."""
        return self._("Handed off by {user}.", user=user)

    def hand_off_reply_directly(self, asker: str) -> str:
        """What to do about a question from a direct message (nobody else can open that thread)."""
        return self._(
            "Please get in touch with {asker} directly: only they can see that conversation.",
            asker=asker,
        )

    def hand_off_posted(self, channel: str, *, direct: bool) -> str:
        """The clicker's confirmation."""
        if direct:
            return self._("Sent to {channel}: someone will get in touch with you.", channel=channel)
        return self._("Sent to {channel}: someone will follow up here.", channel=channel)

    def hand_off_marked(self, channel: str, user: str, *, direct: bool) -> str:
        """What replaces the button under the answer once the question was handed off."""
        if direct:
            return self._(
                ":raising_hand: {user} asked a person in {channel}: someone will get in touch.",
                channel=channel,
                user=user,
            )
        return self._(
            ":raising_hand: {user} asked a person in {channel}: someone will follow up here.",
            channel=channel,
            user=user,
        )

    def hand_off_already(self, channel: str, user: str) -> str:
        """A second click: the question was handed off already."""
        return self._(
            "Already sent to {channel} (by {user}): someone will follow up.",
            channel=channel,
            user=user,
        )

    def hand_off_not_in_channel(self, channel: str) -> str:
        """The bot may not post in the escalation channel."""
        return self._(
            "I could not post in {channel}: I am not a member of it, or it no longer exists. "
            "An admin must invite me there (or fix `KB_ESCALATION_CHANNEL`); then click "
            "*{button}* again.",
            channel=channel,
            button=self.ASK_A_PERSON,
        )

    # ------------------------------------------------------------ the Messages tab

    AGENT_GREETING = N_(
        "Hi! Ask me anything the company's documents cover: I answer only from the knowledge "
        "base and link every passage I use. While you are looking at a channel, I also use the "
        "documents added to it, if you are a member. Try a suggestion below, or add documents "
        "with `/kb-upload`."
    )
    AGENT_GREETING_EMPTY = N_(
        "Hi! I answer questions from the company's documents, but none have been added yet. "
        "Add some with `/kb-upload`, or send me a file here, then ask away."
    )
    PROMPTS_TITLE = N_("Ask about what the knowledge base holds")

    def suggested_question(self, title: str, section: str) -> str:
        """A suggested prompt about a document (plain text: Slack sends it as the person's message)."""
        if not section:
            return self._("What does “{title}” cover?", title=title)
        # "Deploy windows" reads as "deploy windows"; "API keys" keeps its capitals.
        if len(section) > 1 and section[1].islower():
            section = section[0].lower() + section[1:]
        return self._("What does “{title}” say about {section}?", title=title, section=section)

    # ------------------------------------------------------------ errors

    ERROR_GENERIC = N_(
        "Sorry, something went wrong on my side while handling that. "
        "Please try again in a minute; if it keeps happening, tell the bot's administrator."
    )
    ERROR_SEARCH_UNAVAILABLE = N_(
        "I can't search the knowledge base right now: the service that reads questions for "
        "the search is not answering. Please try again in a few minutes; if it keeps "
        "happening, tell the bot's administrator."
    )

    # ------------------------------------------------------------ /kb-upload

    UPLOAD_MODAL_TITLE = N_("Add documents")
    UPLOAD_MODAL_SUBMIT = N_("Upload")
    UPLOAD_MODAL_CLOSE = N_("Cancel")
    UPLOAD_MODAL_INTRO = N_(
        "Documents you add here are used to answer questions. "
        "Supported: Markdown, plain text, HTML, PDF (scanned pages too), Word, PowerPoint, "
        "Excel and CSV."
    )
    UPLOAD_FILES_LABEL = N_("Files")
    UPLOAD_VISIBILITY_LABEL = N_("Who may get answers from them")
    UPLOAD_VISIBILITY_EVERYONE = N_("Everyone in the workspace")
    UPLOAD_VISIBILITY_CHANNEL = N_("Only this channel")
    UPLOAD_TITLE_LABEL = N_("Title (optional)")
    UPLOAD_TITLE_HINT = N_(
        "Used when you upload one file; otherwise each file's own title is used."
    )
    UPLOAD_NO_FILE = N_("Choose at least one file to upload.")
    # "Only this channel" chosen on a form that names no channel it could be kept to.
    UPLOAD_CHANNEL_UNKNOWN = N_(
        "This form does not say which channel it was opened in, so it cannot keep the files "
        "to it. Open /kb-upload again in that channel."
    )
    # A file Slack has not named yet (shared from another organisation).
    UNNAMED_FILE = N_("your file")

    def upload_queued(self, name: str) -> str:
        """Status of a file waiting for its turn (``name`` already escaped)."""
        return self._(":hourglass_flowing_sand: *{name}*: queued.", name=name)

    def upload_waiting_for_yours(self, name: str, per_user: int) -> str:
        """Status of a file waiting until fewer of the same person's files are in progress."""
        return self.ngettext(
            ":hourglass_flowing_sand: *{name}*: waiting for your other uploads to finish "
            "(at most {per_user} file per person at a time, KB_MAX_UPLOADS_PER_USER).",
            ":hourglass_flowing_sand: *{name}*: waiting for your other uploads to finish "
            "(at most {per_user} files per person at a time, KB_MAX_UPLOADS_PER_USER).",
            per_user,
            name=name,
            per_user=per_user,
        )

    def upload_waiting(self, name: str) -> str:
        """Status of a downloaded file waiting while other documents are indexed."""
        return self._(
            ":hourglass_flowing_sand: *{name}*: downloaded, waiting for its turn to be indexed…",
            name=name,
        )

    def upload_downloading(self, name: str) -> str:
        """Status while the file is fetched from Slack."""
        return self._(":arrow_down: *{name}*: downloading…", name=name)

    def upload_indexing(self, name: str) -> str:
        """Status while the file is extracted, chunked and embedded."""
        return self._(":gear: *{name}*: indexing…", name=name)

    def upload_indexed(self, name: str, chunks: int) -> str:
        """Final status of a document that is now searchable."""
        return self.ngettext(
            ":white_check_mark: *{name}*: indexed, {chunks} chunk.",
            ":white_check_mark: *{name}*: indexed, {chunks} chunks.",
            chunks,
            name=name,
            chunks=chunks,
        )

    def upload_duplicate(self, name: str, chunks: int) -> str:
        """Final status when the same bytes are already in the knowledge base."""
        return self.ngettext(
            ":white_check_mark: *{name}*: already in the knowledge base ({chunks} chunk).",
            ":white_check_mark: *{name}*: already in the knowledge base ({chunks} chunks).",
            chunks,
            name=name,
            chunks=chunks,
        )

    def upload_failed(self, name: str, reason: str) -> str:
        """Final status of a failed file (``reason`` already escaped)."""
        return self._(":x: *{name}*: failed: {reason}", name=name, reason=reason)

    def upload_not_a_reader(self, name: str) -> str:
        """Final status of a file for everyone from someone who reads no document for
        everyone (a guest of the workspace): nothing was read or added."""
        return self._(
            ":no_entry: *{name}*: not added. Documents for everyone are added only by people "
            "who read them, which a guest of the workspace does not: add it to one of your "
            "channels with `/kb-upload` there.",
            name=name,
        )

    def upload_reader_unknown(self, name: str) -> str:
        """Final status of a file for everyone from someone Slack could not say now reads
        those (``users.info`` failed): nothing was read or added, it may be sent again."""
        return self._(
            ":x: *{name}*: not added. Slack could not say just now whether you read the "
            "documents for everyone, so nothing was read: upload it again with `/kb-upload` "
            "in a minute.",
            name=name,
        )

    def upload_state(self, name: str, state: str) -> str:
        """Status of a document a retry leaves as it is (replaced meanwhile, say)."""
        shown = self.HOME_STATES.get(state, state.replace("_", " "))
        return self._(
            ":information_source: *{name}*: {state}; nothing to retry.", name=name, state=shown
        )

    def upload_repeats(self, documents: str, count: int) -> str:
        """Beside a status: the document's text is that of ``count`` others the uploader may read
        (``documents``, their linked titles), and answers quote one of the copies."""
        return self.ngettext(
            "Its text is the same as that of {documents}, already in the knowledge base: "
            "answers quote only one of them.",
            "Its text is the same as that of {documents}, already in the knowledge base: "
            "answers quote only one of them.",
            count,
            documents=documents,
        )

    def upload_near_copies(self, documents: str, count: int) -> str:
        """Beside a status: the document's text is nearly that of ``count`` others the uploader
        may read (``documents``, their linked titles), which answers cite as often as it."""
        return self.ngettext(
            "Its text is nearly that of {documents}, already in the knowledge base: perhaps the "
            "same document in another format or version. If so, keep only one of them, or "
            "answers will cite both.",
            "Its text is nearly that of {documents}, already in the knowledge base: perhaps the "
            "same document in other formats or versions. If so, keep only one of them, or "
            "answers will cite each.",
            count,
            documents=documents,
        )

    UPLOAD_REPLACED = N_(
        "It replaces the earlier version of this document, which an admin can restore."
    )
    UPLOAD_KEPT_EARLIER = N_(
        "A newer version of this document was added while it was indexed and stays the one "
        "used for answers; an admin can restore this one."
    )
    UPLOAD_BESIDE = N_(
        "It is a separate document: the document of the same name someone else added stays "
        "as it is (only they, a publisher or an admin can replace it)."
    )

    def upload_awaiting(self, name: str, chunks: int) -> str:
        """Final status of a document for everyone from someone who is not a publisher."""
        return self.ngettext(
            ":hourglass_flowing_sand: *{name}*: indexed, {chunks} chunk, and sent to the "
            "knowledge-base admins for approval: documents for everyone are added by "
            "publishers, or approved by an admin. It is not used for answers until then.",
            ":hourglass_flowing_sand: *{name}*: indexed, {chunks} chunks, and sent to the "
            "knowledge-base admins for approval: documents for everyone are added by "
            "publishers, or approved by an admin. It is not used for answers until then.",
            chunks,
            name=name,
            chunks=chunks,
        )

    UPLOAD_AWAITING_REPLACES = N_(
        "If it is approved, it replaces the current version of this document."
    )
    UPLOAD_AWAITING_NOBODY = N_(
        "No admin could be told about it (no approvals channel or admin is configured, "
        "Slack refused the message, or people who may not read it read the approvals "
        "channel and no admin gets requests by direct message): ask an admin to approve "
        "it with `kb approve`."
    )

    def upload_awaiting_duplicate(self, name: str) -> str:
        """Final status when the same bytes already wait for approval."""
        return self._(
            ":hourglass_flowing_sand: *{name}*: already in the knowledge base, waiting for an "
            "admin's approval.",
            name=name,
        )

    def upload_approved(self, name: str, chunks: int, admin: str) -> str:
        """What the uploader is told once an admin approved (``admin`` a mention)."""
        return self.ngettext(
            ":white_check_mark: *{name}*: approved by {admin}; its {chunks} chunk "
            "is now used for answers.",
            ":white_check_mark: *{name}*: approved by {admin}; its {chunks} chunks "
            "are now used for answers.",
            chunks,
            name=name,
            chunks=chunks,
            admin=admin,
        )

    def upload_rejected(self, name: str, admin: str) -> str:
        """What the uploader is told once an admin rejected (``admin`` a mention)."""
        return self._(
            ":no_entry_sign: *{name}*: not approved by {admin}, so it was removed from the "
            "knowledge base. Ask them if you think it should be there.",
            name=name,
            admin=admin,
        )

    UPLOAD_RETRY = N_("Retry")
    UNKNOWN_REASON = N_("unknown reason")
    UPLOAD_UNEXPECTED = N_("an unexpected error on the server (details are in its log).")
    UPLOAD_AGAIN = N_("Upload the file again with `/kb-upload` once this is fixed.")
    RETRY_NOT_YOURS = N_(
        "Sorry, only the person who uploaded that document or a knowledge-base admin can retry it."
    )
    BUTTON_NOT_HERE = N_(
        "Sorry, that button does not belong to the message it came from, so nothing was changed."
    )
    RETRY_GONE = N_(
        ":wastebasket: That document is no longer in the knowledge base, so there is nothing "
        "to retry. Upload the file again with `/kb-upload`."
    )

    # ------------------------------------------------------------ downloads

    DOWNLOAD_LOGIN_PAGE = N_(
        "Slack returned a login page instead of the file; check the bot token has files:read."
    )
    DOWNLOAD_NO_URL = N_("Slack did not give a download link for this file.")
    DOWNLOAD_BAD_URL = N_("Refused to download the file: Slack's link to it is not a valid URL.")
    DOWNLOAD_TOO_MANY_REDIRECTS = N_("Slack redirected the download too many times.")
    DOWNLOAD_CUT_SHORT = N_(
        "The download from Slack ended before the whole file arrived; send the file again."
    )

    def download_bad_host(self, host: str) -> str:
        """Reason for refusing a download link that does not point at Slack."""
        if not host:
            return self._(
                "Refused to download from an unknown host: files are only fetched from Slack."
            )
        return self._(
            "Refused to download from {host}: files are only fetched from Slack.", host=host
        )

    def download_too_large(self, limit: int) -> str:
        """Reason for a file over the configured size limit."""
        return self._(
            "The file is too large: the limit is {megabytes} MB (KB_MAX_UPLOAD_BYTES).",
            megabytes=limit // (1024 * 1024) or 1,
        )

    def download_status(self, status: int) -> str:
        """Reason for a download answered with an HTTP error."""
        return self._("Slack answered HTTP {status} when the file was downloaded.", status=status)

    def download_unreachable(self, detail: str) -> str:
        """Reason for a download that failed on the network."""
        return self._("The file could not be downloaded from Slack ({detail}).", detail=detail)

    def download_timed_out(self, seconds: float) -> str:
        """Reason for a download that did not finish within the deadline."""
        return self._(
            "The download from Slack did not finish within {seconds} s (KB_DOWNLOAD_TIMEOUT); "
            "Slack or the network is slow right now.",
            seconds=seconds,
        )

    def file_info_timed_out(self, seconds: float) -> str:
        """Reason for a file whose details Slack did not send within the deadline."""
        return self._(
            "Slack did not send the file's details within {seconds} s (KB_DOWNLOAD_TIMEOUT); "
            "it may be having trouble right now.",
            seconds=seconds,
        )

    def file_info_failed(self, detail: str) -> str:
        """Reason for a file whose details Slack refused to send (``detail``: Slack's error code)."""
        return self._(
            "Slack did not give a download link for this file (files.info: {detail}).",
            detail=detail,
        )

    # ------------------------------------------------------------ /kb-reindex

    REINDEX_NOT_ADMIN = N_(
        "Sorry, only knowledge-base admins can run `/kb-reindex`. "
        "Ask an admin, or ask for your user id to be added to KB_ADMIN_USERS."
    )
    REINDEX_RUNNING = N_(
        "A reindex is already running; I'll keep answering questions meanwhile. "
        "Try again when it has finished."
    )
    REINDEX_STARTED = N_("Reindex started… Questions keep being answered while it runs.")

    def reindex_progress(self, done: int, total: int) -> str:
        """Progress of a running reindex."""
        return self.ngettext(
            "Reindexing… {done} of {total} document prepared.",
            "Reindexing… {done} of {total} documents prepared.",
            total,
            done=done,
            total=total,
        )

    def reindex_done(
        self, documents: int, chunks: int, failed: int, stale_before: int, stale_after: int
    ) -> str:
        """The final report of a reindex."""
        return self._(
            "{mark} Reindex finished: {documents}, {chunks}; {failed}; stale documents "
            "before {stale_before}, after {stale_after}.",
            mark=":warning:" if failed else ":white_check_mark:",
            documents=self.ngettext(
                "{count} document", "{count} documents", documents, count=documents
            ),
            chunks=self.ngettext("{count} chunk", "{count} chunks", chunks, count=chunks),
            failed=self.ngettext("{count} failed", "{count} failed", failed, count=failed),
            stale_before=stale_before,
            stale_after=stale_after,
        )

    def reindex_moved(self, built_on: str, default: str) -> str:
        """A reindex moved the knowledge base off the earlier default model it was kept on."""
        return self._(
            ":arrows_counterclockwise: The knowledge base moved from {built_on} to {default}, "
            "the default model: questions are answered on it from now on.",
            built_on=built_on,
            default=default,
        )

    def reindex_stopped(self, reason: str) -> str:
        """A reindex that stopped on an error (``reason`` escaped, English from the index layer)."""
        return self._(":x: The reindex stopped: {reason}", reason=reason)

    def reindex_not_moved(self, built_on: str, default: str) -> str:
        """A reindex could not move the knowledge base off the earlier default model."""
        return self._(
            ":warning: The knowledge base stays on {built_on}: the documents below could not "
            "be rebuilt on {default}, so nothing was changed. Fix or remove them, then run "
            "`/kb-reindex` again.",
            built_on=built_on,
            default=default,
        )

    def reindex_failure_line(self, name: str, reason: str) -> str:
        """One failed document in the report (both already escaped)."""
        return f"• *{name}*: {reason}"

    def reindex_more_failures(self, n: int) -> str:
        """How many failures the report leaves out."""
        return self.ngettext(
            "…and {count} more (see `kb docs`).", "…and {count} more (see `kb docs`).", n, count=n
        )

    def reindex_skipped_line(self, name: str, reason: str) -> str:
        """One document the reindex did not read again (both already escaped)."""
        return self._("• skipped *{name}*: {reason}", name=name, reason=reason)

    def reindex_more_skipped(self, n: int) -> str:
        """How many skipped documents the report leaves out."""
        return self.ngettext(
            "…and {count} more skipped (see `kb docs`).",
            "…and {count} more skipped (see `kb docs`).",
            n,
            count=n,
        )

    # ------------------------------------------------------------ approvals

    APPROVE = N_("Approve")
    REJECT = N_("Reject")
    REJECT_CONFIRM_TITLE = N_("Reject this document?")
    REJECT_CONFIRM_YES = N_("Reject it")
    REJECT_CONFIRM_NO = N_("Cancel")
    APPROVAL_OPEN = N_("Open the whole document")
    APPROVAL_NOT_ADMIN = N_(
        "Sorry, only knowledge-base admins can approve or reject documents. Nothing was changed."
    )
    APPROVAL_RECENT_HEADER = N_("*Recent changes to the knowledge base*")

    def reject_confirm_text(self, name: str) -> str:
        """The confirmation dialog of the Reject button (plain text: ``name`` not escaped)."""
        return self._(
            "{name} is deleted from the knowledge base and the person who added it is told.",
            name=name,
        )

    def approval_request(self, uploader: str, name: str, scope: str, chunks: int) -> str:
        """The head of an approval request (``uploader`` a mention, the rest escaped)."""
        return self.ngettext(
            ":inbox_tray: *Approval needed*: {uploader} wants to add *{name}* for {scope} "
            "({chunks} chunk). Until an admin approves it, no answer uses it.",
            ":inbox_tray: *Approval needed*: {uploader} wants to add *{name}* for {scope} "
            "({chunks} chunks). Until an admin approves it, no answer uses it.",
            chunks,
            uploader=uploader,
            name=name,
            scope=scope,
            chunks=chunks,
        )

    def approval_title(self, title: str) -> str:
        """The title answers will cite the document by (already escaped)."""
        return self._("Answers will cite it as *{title}*.", title=title)

    def approval_version(self, name: str, doc_id: int, uploader: str) -> str:
        """A searchable document an approval would replace (every part already escaped)."""
        return self._(
            "*{name}* #{doc_id} from {uploader}", name=name, doc_id=str(doc_id), uploader=uploader
        )

    def approval_replaces(self, names: list[str]) -> str:
        """Which searchable documents an approval would replace (each already escaped)."""
        return self._(
            "Approving it replaces: {names} (kept as an earlier version).",
            names=", ".join(names),
        )

    def approval_approved(self, admin: str, name: str, uploader: str, replaced: int) -> str:
        """An approval request once approved (mentions and name already escaped)."""
        if not replaced:
            return self._(
                ":white_check_mark: {admin} approved *{name}* from {uploader}. "
                "It is now used for answers.",
                admin=admin,
                name=name,
                uploader=uploader,
            )
        return self.ngettext(
            ":white_check_mark: {admin} approved *{name}* from {uploader}; it replaces "
            "{replaced} earlier version. It is now used for answers.",
            ":white_check_mark: {admin} approved *{name}* from {uploader}; it replaces "
            "{replaced} earlier versions. It is now used for answers.",
            replaced,
            admin=admin,
            name=name,
            uploader=uploader,
            replaced=replaced,
        )

    def approval_rejected(self, admin: str, name: str, uploader: str) -> str:
        """An approval request once rejected."""
        return self._(
            ":no_entry_sign: {admin} rejected *{name}* from {uploader}; it was removed.",
            admin=admin,
            name=name,
            uploader=uploader,
        )

    def approval_decided_already(self, detail: str) -> str:
        """To an admin clicking a request someone already decided (``detail`` already escaped;
        an English sentence of the index layer)."""
        return self._("Nothing to do: {detail}", detail=detail)

    # ------------------------------------------------------------ the audit log

    AUDIT_ACTIONS = _Labels(
        {
            "add": N_("added"),
            "replace": N_("replaced with a new version"),
            "remove": N_("removed"),
            "submit": N_("sent for approval"),
            "approve": N_("approved"),
            "reject": N_("rejected"),
            "reindex": N_("reindexed every document"),
            "restore": N_("restored an earlier version of"),
            "prune": N_("deleted an old version of"),
            "readers": N_("changed who reads a synced source"),
        }
    )
    EVERYONE_LABEL = N_("everyone")

    def audit_line(self, when: str, actor: str, action: str, document: str) -> str:
        """One change in a list of recent changes (every part already escaped)."""
        if not document:
            return self._("• {when} · {actor} {action}", when=when, actor=actor, action=action)
        return self._(
            "• {when} · {actor} {action} {document}",
            when=when,
            actor=actor,
            action=action,
            document=document,
        )

    # ------------------------------------------------------------ the Home tab

    HOME_TITLE = N_("Company knowledge base")
    HOME_ASK = N_(
        "*Ask a question*\n"
        "• Mention me in a channel: I answer in a thread, from the documents for everyone and "
        "those added to that channel.\n"
        "• Message me in the *Messages* tab: each message gets its own answer thread.\n"
        "• Reply in a thread I answered to ask a follow-up; I read the whole thread.\n"
        "I answer only from the knowledge base, with a link to every passage I use, "
        "and say so when it has nothing on a question."
    )
    HOME_UPLOAD = N_(
        "*Add documents*\n"
        "• `/kb-upload` in a channel: for everyone, or only for that channel.\n"
        "• Send a file to me in the *Messages* tab: for everyone.\n"
        "Markdown, text, HTML, PDF, Word, PowerPoint, Excel and CSV. Documents for everyone "
        "from someone who is not a publisher wait for an admin's approval."
    )
    HOME_REFRESH = N_("Refresh")
    HOME_UPLOADS_HEADER = N_("Your uploads")
    HOME_NO_UPLOADS = N_("You have not added any documents yet.")
    HOME_PREVIOUS = N_("Previous")
    HOME_NEXT = N_("Next")
    HOME_ADMIN_HEADER = N_("For admins")
    HOME_FAILED_HEADER = N_("Failed uploads")
    HOME_NO_FAILED = N_("No failed uploads.")
    HOME_RETRY = N_("Retry")
    HOME_STALE_HEADER = N_("Stale documents")
    HOME_NO_STALE = N_("None: every document is indexed with the current model and pipeline.")
    HOME_REINDEX = N_("Reindex")
    HOME_REINDEX_RUNNING_NOW = N_(":hourglass_flowing_sand: A reindex is running.")
    HOME_GAPS_HEADER = N_("Knowledge gaps (last 30 days)")
    HOME_GAPS_INTRO = N_(
        "Questions the knowledge base could not answer (refused, or only possibly related "
        "passages shown), similar wordings grouped, largest groups first."
    )
    HOME_NO_GAPS = N_("No unanswered questions in the last 30 days.")
    HOME_GAPS_PENDING = N_(
        ":hourglass_flowing_sand: Grouping the questions… they appear here in a moment."
    )
    HOME_GAPS_FAILED = N_(
        ":warning: The knowledge gaps could not be worked out; the server's log says why."
    )
    HOME_DISLIKED_HEADER = N_("Answers marked not helpful")
    HOME_NO_DISLIKED = N_("No answer has been marked not helpful.")
    HOME_CALIBRATION_HEADER = N_("Calibration")
    # A threshold `kb calibrate` could not propose.
    NO_THRESHOLD = N_("none")
    HOME_NO_CALIBRATION = N_("No calibration recorded: run `kb calibrate` on the server.")
    HOME_NOT_ADMIN = N_("Sorry, only knowledge-base admins can do that. Nothing was changed.")
    HOME_SHORTENED = N_(
        "_(Not everything fits on the Home tab; `kb docs` and `kb status` list it all.)_"
    )
    HOME_STATES = _Labels(
        {
            "pending": N_("waiting to be indexed"),
            "indexing": N_("indexing…"),
            "indexed": N_("indexed"),
            "failed": N_("failed"),
            "awaiting_approval": N_("waiting for an admin's approval"),
            "replaced": N_("replaced by a newer version"),
        }
    )
    HOME_GAP_OUTCOMES = _Labels({"refused": N_("refused"), "related": N_("possibly related shown")})
    HOME_GAP_NO_PASSAGE = N_("No passage came close.")
    HOME_IN_A_DM = N_("asked in a direct message")
    HOME_ANSWER_WITHHELD = N_("_Written from a channel's documents: not shown here._")
    HOME_THREAD = N_("open the thread")
    HOME_REASON_WITHHELD = N_("_Why it failed is shown to the channel's members._")
    HOME_SOURCES_HEADER = N_("Failing sources")
    HOME_SOURCES_INTRO = N_(
        "Their last sync failed. A sync is tried again on the schedule; `kb source sync NAME` "
        "on the server tries it now, and `kb source list` shows every source."
    )
    HOME_NEVER = N_("never")

    def home_counts(self, documents: int, chunks: int, channel_documents: int) -> str:
        """How much the knowledge base holds (searchable documents only)."""
        passages = self.ngettext("{count} passage", "{count} passages", chunks, count=chunks)
        if channel_documents:
            return self.ngettext(
                ":books: The knowledge base holds *{documents}* searchable document "
                "({passages}), {channel_share}.",
                ":books: The knowledge base holds *{documents}* searchable documents "
                "({passages}), {channel_share}.",
                documents,
                documents=documents,
                passages=passages,
                channel_share=self.ngettext(
                    "{count} of them for one channel only",
                    "{count} of them for one channel only",
                    channel_documents,
                    count=channel_documents,
                ),
            )
        return self.ngettext(
            ":books: The knowledge base holds *{documents}* searchable document ({passages}).",
            ":books: The knowledge base holds *{documents}* searchable documents ({passages}).",
            documents,
            documents=documents,
            passages=passages,
        )

    def home_upload_line(self, name: str, state: str, when: str, scope: str, reason: str) -> str:
        """One of the person's uploads (``name``, ``scope`` and ``reason`` already escaped)."""
        line = f"• *{name}* ({scope}) · {state} · {when}"
        return f"{line}\n    {reason}" if reason else line

    def home_page(self, page: int, pages: int, total: int) -> str:
        """Where a paged list is."""
        return self._(
            "Page {page} of {pages} · {total} in all", page=page, pages=pages, total=total
        )

    def home_failed_line(self, name: str, uploader: str, when: str, reason: str) -> str:
        """A failed upload, for admins (every part already escaped)."""
        return self._(
            ":x: *{name}* from {uploader} · {when}\n{reason}",
            name=name,
            uploader=uploader,
            when=when,
            reason=reason,
        )

    def home_failing_source(self, name: str, kind: str, reason: str, last_good: str) -> str:
        """A source whose last sync failed, for admins (``name`` and ``reason`` escaped)."""
        return self._(
            ":warning: *{name}* ({kind}) · last good sync: {last_good}\n{reason}",
            name=name,
            kind=kind,
            reason=reason,
            last_good=last_good,
        )

    def home_stale_summary(self, count: int) -> str:
        """How many documents are stale, and what a reindex does about it."""
        return self.ngettext(
            "*{count}* document is indexed with another model or pipeline version and not "
            "searched until a reindex. *{button}* rebuilds every document, as `/kb-reindex` "
            "does; questions keep being answered meanwhile.",
            "*{count}* documents are indexed with another model or pipeline version and not "
            "searched until a reindex. *{button}* rebuilds every document, as `/kb-reindex` "
            "does; questions keep being answered meanwhile.",
            count,
            count=count,
            button=self.HOME_REINDEX,
        )

    def home_stale_line(self, name: str, model: str, when: str) -> str:
        """A stale document (``name`` and ``model`` already escaped)."""
        return self._(
            "• *{name}* · indexed with {model} · {when}", name=name, model=model, when=when
        )

    def home_gap(self, question: str, count: int, outcomes: str, when: str, people: int = 0) -> str:
        """A group of unanswered questions (``question`` already escaped); ``people``: how many
        asked, said when fewer than the askings."""
        times = self.ngettext("once", "{count} times", count, count=count)
        if 0 < people < count:
            return self.ngettext(
                "*“{question}”*\nAsked {times} by {people} person ({outcomes}), last {when}",
                "*“{question}”*\nAsked {times} by {people} people ({outcomes}), last {when}",
                people,
                question=question,
                times=times,
                people=people,
                outcomes=outcomes,
                when=when,
            )
        return self._(
            "*“{question}”*\nAsked {times} ({outcomes}), last {when}",
            question=question,
            times=times,
            outcomes=outcomes,
            when=when,
        )

    def home_gap_outcome(self, outcome: str, n: int) -> str:
        """How often a group of questions ended one way."""
        return f"{self.HOME_GAP_OUTCOMES.get(outcome, outcome)} {self.number(n)}"

    def home_gap_examples(self, examples: list[str]) -> str:
        """Other wordings of the same question (each already escaped)."""
        quoted = "; ".join(self._("“{example}”", example=e) for e in examples)
        return self._("Also asked as: {examples}", examples=quoted)

    def home_gap_closest(self, passage: str, distance: float) -> str:
        """The passage that came closest (a link or a label, already escaped)."""
        return self._(
            "Closest passage: {passage} (distance {distance})",
            passage=passage,
            distance=self.number(distance, 3),
        )

    def home_gap_channel_passage(self, channel: str) -> str:
        """A closest passage from a channel's documents: where it is, never what it says."""
        return self._("a passage in {channel}", channel=channel)

    def home_disliked_line(
        self, question: str, outcome: str, dislikes: int, when: str, where: str
    ) -> str:
        """An answer marked not helpful (every part already escaped); ``when``: the latest mark."""
        return self.ngettext(
            "• *“{question}”* · {outcome} · not helpful to {dislikes} person, last {when} · {where}",
            "• *“{question}”* · {outcome} · not helpful to {dislikes} people, last {when} · {where}",
            dislikes,
            question=question,
            outcome=outcome,
            dislikes=dislikes,
            when=when,
            where=where,
        )

    def home_thresholds_model(self, model: str, origin: str) -> str:
        """Which embedding model the thresholds in force were calibrated for, and from where."""
        if not model:
            return self._(
                "Not calibrated for the running embedding model ({origin}).", origin=origin
            )
        return self._(
            "Calibrated for the embedding model `{model}` ({origin}).", model=model, origin=origin
        )

    def home_kept_model(self, built_on: str, default: str) -> str:
        """The knowledge base still answers on the earlier default model it was built on."""
        return self._(
            ":information_source: *This knowledge base was built on {built_on}* and answers "
            "on it. `/kb-reindex` moves it to {default}, the default model, without a restart "
            "(`kb reindex` on the server does too: running servers follow it).",
            built_on=built_on,
            default=default,
        )

    def home_wrong_model(self, advice: str) -> str:
        """The knowledge base holds languages its embedding model does not read (English advice)."""
        return self._(
            ":warning: *Wrong embedding model for these documents.* {advice}", advice=advice
        )

    def home_store_model_refused(self, reason: str) -> str:
        """The store's documents moved to a model this server cannot load (English reason)."""
        return self._(
            ":no_entry: *Questions are refused: this server cannot run the store's embedding "
            "model.* {reason}",
            reason=reason,
        )

    def home_thresholds(self, threshold: float, related: float | None) -> str:
        """The thresholds in force (settings)."""
        if related is None:
            return self._(
                "Threshold in force: *{threshold}* (`KB_THRESHOLD`); related passages: "
                "*off* (`KB_RELATED_THRESHOLD`).",
                threshold=self.number(threshold, 3),
            )
        return self._(
            "Threshold in force: *{threshold}* (`KB_THRESHOLD`); related passages: "
            "*{related}* (`KB_RELATED_THRESHOLD`).",
            threshold=self.number(threshold, 3),
            related=self.number(related, 3),
        )

    def home_calibrated(
        self, when: str, source: str, budget: float, proposed: str, related: str
    ) -> str:
        """The last `kb calibrate` (``source`` already escaped)."""
        return self._(
            "Last `kb calibrate`: {when}, on {source}, bluff budget {budget}. "
            "It proposed threshold *{proposed}*, related *{related}*.",
            when=when,
            source=source,
            budget=self.percent(budget),
            proposed=proposed,
            related=related,
        )

    def home_rates(self, threshold: float, bluffs: str, refused: str) -> str:
        """The measured rates at the threshold in force."""
        return self._(
            "At {threshold}: bluffs (off-topic questions answered) {bluffs}; "
            "in-domain questions refused {refused}.",
            threshold=self.number(threshold, 3),
            bluffs=bluffs,
            refused=refused,
        )

    def home_rate(self, n: int, of: int, low: float, high: float) -> str:
        """One rate with its 95 % interval (numbers only)."""
        share = n / of if of else 0.0
        shown = ", ".join(self.percent(p, 1) for p in (low, high))
        return f"{self.number(n)}/{self.number(of)} = {self.percent(share, 1)} [{shown}]"

    def home_no_rates(self, threshold: float) -> str:
        """The record did not measure the threshold in force."""
        return self._(
            "The last calibration measured no threshold near {threshold}: "
            "run `kb calibrate` again.",
            threshold=self.number(threshold, 3),
        )

    def home_retrying(self, name: str, *, message: bool = True) -> str:
        """An admin's Retry from the Home tab, while it runs (``name`` already escaped);
        ``message``: its result also comes as a message."""
        if message:
            return self._(
                ":hourglass_flowing_sand: Retrying *{name}*… The result comes as a message too.",
                name=name,
            )
        return self._(":hourglass_flowing_sand: Retrying *{name}*…", name=name)

    def home_channel_document(self, channel: str, doc_id: int) -> str:
        """A channel's document, to an admin not in that channel: where it is, not what it is called."""
        return self._("a document in {channel} (#{doc_id})", channel=channel, doc_id=str(doc_id))

    def home_retried(self, name: str, state: str, reason: str) -> str:
        """What a retry from the Home tab came to (every part already escaped)."""
        mark = ":white_check_mark:" if state == "indexed" else ":warning:"
        shown = self.HOME_STATES.get(state, state)
        if not reason:
            return self._("{mark} *{name}*: {state}.", mark=mark, name=name, state=shown)
        return self._(
            "{mark} *{name}*: {state}: {reason}.",
            mark=mark,
            name=name,
            state=shown,
            reason=reason.rstrip("."),
        )

    # ------------------------------------------------------------ Work Objects (passage links)

    ENTITY_PASSAGE = N_("Passage")
    ENTITY_OPEN_VIEWER = N_("Open in the viewer")
    ENTITY_UNAVAILABLE = N_("This passage is no longer in the knowledge base.")
    ENTITY_RESTRICTED = N_("A passage from a channel's documents")
    ENTITY_SECTION = N_("Section")
    ENTITY_PAGE = N_("Page")
    ENTITY_BEFORE = N_("Passage before")
    ENTITY_AFTER = N_("Passage after")

    def entity_page(self, page: int) -> str:
        """Where a passage is in a PDF, as an entity's display id."""
        return self._("Page {page}", page=page)

    # ------------------------------------------------------------ the steps of an answer, Stop

    STEPS_TITLE = N_("Answering from the knowledge base")
    STEP_NOTHING_FOUND = N_("Nothing in the knowledge base is close enough")
    STOPPED = N_("Stopped.")

    def step_found(self, passages: int, documents: int) -> str:
        """The search step done: how many passages the answer is written from, in how many documents."""
        return self.ngettext(
            "Found {passages} passage {in_documents}",
            "Found {passages} passages {in_documents}",
            passages,
            passages=passages,
            in_documents=self.ngettext(
                "in one document", "in {count} documents", documents, count=documents
            ),
        )
