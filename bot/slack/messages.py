"""Every sentence the bot shows a person, in one place.

Strings here are Slack ``mrkdwn`` written by the server, never by a model or a
document, so they may contain formatting; anything interpolated into them that
came from outside (file names, failure reasons) is escaped by the caller.
"""

from __future__ import annotations

from core.answer import REFUSAL_TEXT

# ---------------------------------------------------------------- questions

PLACEHOLDER = "Searching the knowledge base…"
STATUS_SEARCHING = "is searching the knowledge base…"
WRITING = "Writing the answer…"
EMPTY_QUESTION = (
    "Ask me anything the company's documents cover, for example "
    "_“How do I submit an expense claim?”_. I answer only from the knowledge base, "
    "with a link to every passage I use."
)
REFUSAL = f"{REFUSAL_TEXT} If a document should answer it, add it with `/kb-upload` and ask again."
EXTERNAL_ASKER = (
    "Sorry, I answer only members of this workspace: the knowledge base holds internal documents."
)
SHARED_CHANNEL_NOTE = (
    "This channel is shared with another organisation, so I searched only the "
    "documents added to this channel."
)
EVIDENCE_HEADER = "*No answer generated — here is what the knowledge base says.*"
EVIDENCE_REASON = (
    "The language model is unavailable right now; these passages matched your question."
)
EVIDENCE_FALLBACK = "No answer generated — here is what the knowledge base says:"
RELATED_HEADER = "*Not an answer — possibly related passages.*"
RELATED_REASON = (
    "Nothing in the knowledge base is close enough to answer this, so no answer was written. "
    "These passages came nearest; open them to check, or ask again in other words."
)
RELATED_FALLBACK = "Not an answer — possibly related passages:"
UNSUPPORTED_WARNING = ":warning: This answer cites no source; treat it with care."
UNCITED_HEADER = "*Passages I was given, none of them cited*"
UNCITED_REASON = (
    "The answer above cites none of these, so it may not come from the knowledge base. "
    "They came nearest to your question; open them to check."
)
UNCITED_FALLBACK = "Passages I was given, none of them cited:"
SOURCES_HEADER = "*Sources*"
UNNAMED_PASSAGE = "passage"
BESIDE_HEADER = "Possibly related, not used for this answer (too far from your question):"
EMPTY_ANSWER = "_The model returned an empty answer._"
TRUNCATED = "_(The answer was too long for one message and was shortened.)_"
FEEDBACK_POSITIVE = "Helpful"
FEEDBACK_NEGATIVE = "Not helpful"
FEEDBACK_THANKS_POSITIVE = "Thanks! Glad it helped."
FEEDBACK_THANKS_NEGATIVE = "Thanks for telling me. The answer is flagged for review."
FEEDBACK_UNKNOWN = "Sorry, I could not record that feedback: the answer is no longer on record."

# ---------------------------------------------------------------- handing a question to a person

ASK_A_PERSON = "Ask a person"
HAND_OFF_TITLE = ":raising_hand: *A question for a person*"
HAND_OFF_DM_PLACE = "in a direct message with me"
HAND_OFF_SOMEONE = "someone"
HAND_OFF_QUESTION_WITHHELD = (
    "_The question is shown only when its asker hands it off; open the thread to read it._"
)
HAND_OFF_ANSWERED = "*My answer:*"
HAND_OFF_UNSUPPORTED = "*My answer, which cited no source:*"
HAND_OFF_ANSWER_WITHHELD = (
    "_I answered from documents not everyone here may read; open the thread to see the answer._"
)
HAND_OFF_RELATED = "I found no answer, only possibly related passages."
HAND_OFF_REFUSED = "The knowledge base has nothing on this, so I did not answer."
HAND_OFF_EVIDENCE = (
    "The language model was unavailable, so I showed matching passages without an answer."
)
HAND_OFF_OPEN_THREAD = "Open the thread"
HAND_OFF_NO_LINK = "_Slack gave no link to the thread; look for it in the channel._"
HAND_OFF_OFF = "Handing questions to a person is turned off."
HAND_OFF_UNKNOWN = "Sorry, that question is no longer on record, so I cannot hand it off."
HAND_OFF_NOT_YOURS = "Only the person who asked this question can hand it to a person."
HAND_OFF_FAILED = "Sorry, I could not reach Slack to hand this off. Please try again in a minute."


def hand_off_asked(asker: str, place: str) -> str:
    """Who asked where (``asker`` a mention, ``place`` server-written)."""
    return f"Asked by {asker} {place}."


def hand_off_by(user: str) -> str:
    """Who handed it off, when not the asker."""
    return f"Handed off by {user}."


def hand_off_reply_directly(asker: str) -> str:
    """What to do about a question from a direct message (nobody else can open that thread)."""
    return f"Please get in touch with {asker} directly: only they can see that conversation."


def hand_off_posted(channel: str, *, direct: bool) -> str:
    """The clicker's confirmation."""
    follow_up = "someone will get in touch with you" if direct else "someone will follow up here"
    return f"Sent to {channel}: {follow_up}."


def hand_off_marked(channel: str, user: str, *, direct: bool) -> str:
    """What replaces the button under the answer once the question was handed off."""
    follow_up = "someone will get in touch" if direct else "someone will follow up here"
    return f":raising_hand: {user} asked a person in {channel}: {follow_up}."


def hand_off_already(channel: str, user: str) -> str:
    """A second click: the question was handed off already."""
    return f"Already sent to {channel} (by {user}): someone will follow up."


def hand_off_not_in_channel(channel: str) -> str:
    """The bot may not post in the escalation channel."""
    return (
        f"I could not post in {channel}: I am not a member of it, or it no longer exists. "
        "An admin must invite me there (or fix `KB_ESCALATION_CHANNEL`); then click "
        f"*{ASK_A_PERSON}* again."
    )


# ---------------------------------------------------------------- the Messages tab

AGENT_GREETING = (
    "Hi! Ask me anything the company's documents cover: I answer only from the knowledge base "
    "and link every passage I use. While you are looking at a channel, I also use the "
    "documents added to it, if you are a member. Try a suggestion below, or add documents "
    "with `/kb-upload`."
)
AGENT_GREETING_EMPTY = (
    "Hi! I answer questions from the company's documents, but none have been added yet. "
    "Add some with `/kb-upload`, or send me a file here, then ask away."
)
PROMPTS_TITLE = "Ask about what the knowledge base holds"


def suggested_question(title: str, section: str) -> str:
    """A suggested prompt about a document (plain text: Slack sends it as the person's message)."""
    if not section:
        return f"What does “{title}” cover?"
    # "Deploy windows" reads as "deploy windows"; "API keys" keeps its capitals.
    if len(section) > 1 and section[1].islower():
        section = section[0].lower() + section[1:]
    return f"What does “{title}” say about {section}?"


# ---------------------------------------------------------------- errors

ERROR_GENERIC = (
    "Sorry, something went wrong on my side while handling that. "
    "Please try again in a minute; if it keeps happening, tell the bot's administrator."
)
ERROR_SEARCH_UNAVAILABLE = (
    "I can't search the knowledge base right now: the service that reads questions for "
    "the search is not answering. Please try again in a few minutes; if it keeps "
    "happening, tell the bot's administrator."
)

# ---------------------------------------------------------------- /kb-upload

UPLOAD_MODAL_TITLE = "Add documents"
UPLOAD_MODAL_SUBMIT = "Upload"
UPLOAD_MODAL_CLOSE = "Cancel"
UPLOAD_MODAL_INTRO = (
    "Documents you add here are used to answer questions. "
    "Supported: Markdown, plain text, HTML, PDF (scanned pages too), Word, PowerPoint, "
    "Excel and CSV."
)
UPLOAD_FILES_LABEL = "Files"
UPLOAD_VISIBILITY_LABEL = "Who may get answers from them"
UPLOAD_VISIBILITY_EVERYONE = "Everyone in the workspace"
UPLOAD_VISIBILITY_CHANNEL = "Only this channel"
UPLOAD_TITLE_LABEL = "Title (optional)"
UPLOAD_TITLE_HINT = "Used when you upload one file; otherwise each file's own title is used."
UPLOAD_NO_FILE = "Choose at least one file to upload."


UNNAMED_FILE = "your file"  # a file Slack has not named yet (shared from another organisation)


def upload_queued(name: str) -> str:
    """Status of a file waiting for its turn (``name`` already escaped)."""
    return f":hourglass_flowing_sand: *{name}*: queued."


def upload_waiting_for_yours(name: str, per_user: int) -> str:
    """Status of a file waiting until fewer of the same person's files are in progress."""
    files = "file" if per_user == 1 else "files"
    return (
        f":hourglass_flowing_sand: *{name}*: waiting for your other uploads to finish "
        f"(at most {per_user} {files} per person at a time, KB_MAX_UPLOADS_PER_USER)."
    )


def upload_waiting(name: str) -> str:
    """Status of a downloaded file waiting while other documents are indexed."""
    return f":hourglass_flowing_sand: *{name}*: downloaded, waiting for its turn to be indexed…"


def upload_downloading(name: str) -> str:
    """Status while the file is fetched from Slack."""
    return f":arrow_down: *{name}*: downloading…"


def upload_indexing(name: str) -> str:
    """Status while the file is extracted, chunked and embedded."""
    return f":gear: *{name}*: indexing…"


def upload_indexed(name: str, chunks: int) -> str:
    """Final status of a document that is now searchable."""
    unit = "chunk" if chunks == 1 else "chunks"
    return f":white_check_mark: *{name}*: indexed, {chunks} {unit}."


def upload_duplicate(name: str, chunks: int) -> str:
    """Final status when the same bytes are already in the knowledge base."""
    unit = "chunk" if chunks == 1 else "chunks"
    return f":white_check_mark: *{name}*: already in the knowledge base ({chunks} {unit})."


def upload_failed(name: str, reason: str) -> str:
    """Final status of a failed file (``reason`` already escaped)."""
    return f":x: *{name}*: failed: {reason}"


def upload_state(name: str, state: str) -> str:
    """Status of a document a retry leaves as it is (replaced meanwhile, say)."""
    return f":information_source: *{name}*: {state.replace('_', ' ')}; nothing to retry."


UPLOAD_REPLACED = "It replaces the earlier version of this document, which an admin can restore."
UPLOAD_BESIDE = (
    "It is a separate document: the document of the same name someone else added stays "
    "as it is (only they, a publisher or an admin can replace it)."
)


def upload_awaiting(name: str, chunks: int) -> str:
    """Final status of a document for everyone from someone who is not a publisher."""
    unit = "chunk" if chunks == 1 else "chunks"
    return (
        f":hourglass_flowing_sand: *{name}*: indexed, {chunks} {unit}, and sent to the "
        "knowledge-base admins for approval: documents for everyone are added by publishers, "
        "or approved by an admin. It is not used for answers until then."
    )


UPLOAD_AWAITING_REPLACES = "If it is approved, it replaces the current version of this document."
UPLOAD_AWAITING_NOBODY = (
    "No admin could be told about it (no approvals channel or admin is configured, "
    "or Slack refused the message): ask an admin to approve it with `kb approve`."
)


def upload_awaiting_duplicate(name: str) -> str:
    """Final status when the same bytes already wait for approval."""
    return f":hourglass_flowing_sand: *{name}*: already in the knowledge base, waiting for an admin's approval."


def upload_approved(name: str, chunks: int, admin: str) -> str:
    """What the uploader is told once an admin approved (``admin`` a mention)."""
    unit = "chunk" if chunks == 1 else "chunks"
    return (
        f":white_check_mark: *{name}*: approved by {admin}; its {chunks} {unit} "
        "are now used for answers."
    )


def upload_rejected(name: str, admin: str) -> str:
    """What the uploader is told once an admin rejected (``admin`` a mention)."""
    return (
        f":no_entry_sign: *{name}*: not approved by {admin}, so it was removed from the "
        "knowledge base. Ask them if you think it should be there."
    )


UPLOAD_RETRY = "Retry"
UPLOAD_UNEXPECTED = "an unexpected error on the server (details are in its log)."
UPLOAD_AGAIN = "Upload the file again with `/kb-upload` once this is fixed."
RETRY_NOT_YOURS = (
    "Sorry, only the person who uploaded that document or a knowledge-base admin can retry it."
)
BUTTON_NOT_HERE = (
    "Sorry, that button does not belong to the message it came from, so nothing was changed."
)
RETRY_GONE = (
    ":wastebasket: That document is no longer in the knowledge base, so there is nothing to "
    "retry. Upload the file again with `/kb-upload`."
)

# ---------------------------------------------------------------- downloads

DOWNLOAD_LOGIN_PAGE = (
    "Slack returned a login page instead of the file; check the bot token has files:read."
)
DOWNLOAD_NO_URL = "Slack did not give a download link for this file."


def download_bad_host(host: str) -> str:
    """Reason for refusing a download link that does not point at Slack."""
    return (
        f"Refused to download from {host or 'an unknown host'}: files are only fetched from Slack."
    )


def download_too_large(limit: int) -> str:
    """Reason for a file over the configured size limit."""
    return f"The file is too large: the limit is {limit // (1024 * 1024) or 1} MB (KB_MAX_UPLOAD_BYTES)."


def download_status(status: int) -> str:
    """Reason for a download answered with an HTTP error."""
    return f"Slack answered HTTP {status} when the file was downloaded."


def download_unreachable(detail: str) -> str:
    """Reason for a download that failed on the network."""
    return f"The file could not be downloaded from Slack ({detail})."


DOWNLOAD_TOO_MANY_REDIRECTS = "Slack redirected the download too many times."


def download_timed_out(seconds: float) -> str:
    """Reason for a download that did not finish within the deadline."""
    return (
        f"The download from Slack did not finish within {seconds:g} s (KB_DOWNLOAD_TIMEOUT); "
        "Slack or the network is slow right now."
    )


def file_info_timed_out(seconds: float) -> str:
    """Reason for a file whose details Slack did not send within the deadline."""
    return (
        f"Slack did not send the file's details within {seconds:g} s (KB_DOWNLOAD_TIMEOUT); "
        "it may be having trouble right now."
    )


def file_info_failed(detail: str) -> str:
    """Reason for a file whose details Slack refused to send (``detail``: Slack's error code)."""
    return f"Slack did not give a download link for this file (files.info: {detail})."


# ---------------------------------------------------------------- /kb-reindex

REINDEX_NOT_ADMIN = (
    "Sorry, only knowledge-base admins can run `/kb-reindex`. "
    "Ask an admin, or ask for your user id to be added to KB_ADMIN_USERS."
)
REINDEX_RUNNING = "A reindex is already running; I'll keep answering questions meanwhile. Try again when it has finished."
REINDEX_STARTED = "Reindex started… Questions keep being answered while it runs."


def reindex_progress(done: int, total: int) -> str:
    """Progress of a running reindex."""
    return f"Reindexing… {done} of {total} documents prepared."


def reindex_done(
    documents: int, chunks: int, failed: int, stale_before: int, stale_after: int
) -> str:
    """The final report of a reindex."""
    mark = ":warning:" if failed else ":white_check_mark:"
    return (
        f"{mark} Reindex finished: {documents} documents, {chunks} chunks; "
        f"{failed} failed; stale documents before {stale_before}, after {stale_after}."
    )


def reindex_failure_line(name: str, reason: str) -> str:
    """One failed document in the report (both already escaped)."""
    return f"• *{name}*: {reason}"


def reindex_more_failures(n: int) -> str:
    """How many failures the report leaves out."""
    return f"…and {n} more (see `kb docs`)."


def reindex_skipped_line(name: str, reason: str) -> str:
    """One document the reindex did not read again (both already escaped)."""
    return f"• skipped *{name}*: {reason}"


def reindex_more_skipped(n: int) -> str:
    """How many skipped documents the report leaves out."""
    return f"…and {n} more skipped (see `kb docs`)."


# ---------------------------------------------------------------- approvals

APPROVE = "Approve"
REJECT = "Reject"
REJECT_CONFIRM_TITLE = "Reject this document?"
REJECT_CONFIRM_YES = "Reject it"
REJECT_CONFIRM_NO = "Cancel"
APPROVAL_OPEN = "Open the whole document"
APPROVAL_NOT_ADMIN = (
    "Sorry, only knowledge-base admins can approve or reject documents. Nothing was changed."
)
APPROVAL_RECENT_HEADER = "*Recent changes to the knowledge base*"


def reject_confirm_text(name: str) -> str:
    """The confirmation dialog of the Reject button (plain text: ``name`` not escaped)."""
    return f"{name} is deleted from the knowledge base and the person who added it is told."


def approval_request(uploader: str, name: str, scope: str, chunks: int) -> str:
    """The head of an approval request (``uploader`` a mention, the rest escaped)."""
    unit = "chunk" if chunks == 1 else "chunks"
    return (
        f":inbox_tray: *Approval needed*: {uploader} wants to add *{name}* for {scope} "
        f"({chunks} {unit}). Until an admin approves it, no answer uses it."
    )


def approval_title(title: str) -> str:
    """The title answers will cite the document by (already escaped)."""
    return f"Answers will cite it as *{title}*."


def approval_replaces(names: list[str]) -> str:
    """Which searchable documents an approval would replace (each already escaped)."""
    return "Approving it replaces: " + ", ".join(names) + " (kept as an earlier version)."


def approval_approved(admin: str, name: str, uploader: str, replaced: int) -> str:
    """An approval request once approved (mentions and name already escaped)."""
    tail = f"; it replaces {replaced} earlier version(s)" if replaced else ""
    return f":white_check_mark: {admin} approved *{name}* from {uploader}{tail}. It is now used for answers."


def approval_rejected(admin: str, name: str, uploader: str) -> str:
    """An approval request once rejected."""
    return f":no_entry_sign: {admin} rejected *{name}* from {uploader}; it was removed."


def approval_decided_already(detail: str) -> str:
    """To an admin clicking a request someone already decided (``detail`` already escaped)."""
    return f"Nothing to do: {detail}"


# ---------------------------------------------------------------- the audit log

AUDIT_ACTIONS = {
    "add": "added",
    "replace": "replaced with a new version",
    "remove": "removed",
    "submit": "sent for approval",
    "approve": "approved",
    "reject": "rejected",
    "reindex": "reindexed every document",
    "restore": "restored an earlier version of",
    "prune": "deleted an old version of",
}
EVERYONE_LABEL = "everyone"


def audit_line(when: str, actor: str, action: str, document: str) -> str:
    """One change in a list of recent changes (every part already escaped)."""
    return f"• {when} · {actor} {action}{' ' + document if document else ''}"


# ---------------------------------------------------------------- the Home tab

HOME_TITLE = "Company knowledge base"
HOME_ASK = (
    "*Ask a question*\n"
    "• Mention me in a channel: I answer in a thread, from the documents for everyone and "
    "those added to that channel.\n"
    "• Message me in the *Messages* tab: each message gets its own answer thread.\n"
    "• Reply in a thread I answered to ask a follow-up; I read the whole thread.\n"
    "I answer only from the knowledge base, with a link to every passage I use, "
    "and say so when it has nothing on a question."
)
HOME_UPLOAD = (
    "*Add documents*\n"
    "• `/kb-upload` in a channel: for everyone, or only for that channel.\n"
    "• Send a file to me in the *Messages* tab: for everyone.\n"
    "Markdown, text, HTML, PDF, Word, PowerPoint, Excel and CSV. Documents for everyone "
    "from someone who is not a publisher wait for an admin's approval."
)
HOME_REFRESH = "Refresh"
HOME_UPLOADS_HEADER = "Your uploads"
HOME_NO_UPLOADS = "You have not added any documents yet."
HOME_PREVIOUS = "Previous"
HOME_NEXT = "Next"
HOME_ADMIN_HEADER = "For admins"
HOME_FAILED_HEADER = "Failed uploads"
HOME_NO_FAILED = "No failed uploads."
HOME_RETRY = "Retry"
HOME_STALE_HEADER = "Stale documents"
HOME_NO_STALE = "None: every document is indexed with the current model and pipeline."
HOME_REINDEX = "Reindex"
HOME_REINDEX_RUNNING_NOW = ":hourglass_flowing_sand: A reindex is running."
HOME_GAPS_HEADER = "Knowledge gaps (last 30 days)"
HOME_GAPS_INTRO = (
    "Questions the knowledge base could not answer (refused, or only possibly related "
    "passages shown), similar wordings grouped, largest groups first."
)
HOME_NO_GAPS = "No unanswered questions in the last 30 days."
HOME_GAPS_PENDING = ":hourglass_flowing_sand: Grouping the questions… they appear here in a moment."
HOME_GAPS_FAILED = (
    ":warning: The knowledge gaps could not be worked out; the server's log says why."
)
HOME_DISLIKED_HEADER = "Answers marked not helpful"
HOME_NO_DISLIKED = "No answer has been marked not helpful."
HOME_CALIBRATION_HEADER = "Calibration"
HOME_NO_CALIBRATION = "No calibration recorded: run `kb calibrate` on the server."
HOME_NOT_ADMIN = "Sorry, only knowledge-base admins can do that. Nothing was changed."
HOME_SHORTENED = "_(Not everything fits on the Home tab; `kb docs` and `kb status` list it all.)_"
HOME_STATES = {
    "pending": "waiting to be indexed",
    "indexing": "indexing…",
    "indexed": "indexed",
    "failed": "failed",
    "awaiting_approval": "waiting for an admin's approval",
    "replaced": "replaced by a newer version",
}


def home_counts(documents: int, chunks: int, channel_documents: int) -> str:
    """How much the knowledge base holds (searchable documents only)."""
    unit = "document" if documents == 1 else "documents"
    tail = f", {channel_documents} of them for one channel only" if channel_documents else ""
    return f":books: The knowledge base holds *{documents}* searchable {unit} ({chunks} passages){tail}."


def home_upload_line(name: str, state: str, when: str, scope: str, reason: str) -> str:
    """One of the person's uploads (``name``, ``scope`` and ``reason`` already escaped)."""
    line = f"• *{name}* ({scope}) · {state} · {when}"
    return f"{line}\n    {reason}" if reason else line


def home_page(page: int, pages: int, total: int) -> str:
    """Where a paged list is."""
    return f"Page {page} of {pages} · {total} in all"


def home_failed_line(name: str, uploader: str, when: str, reason: str) -> str:
    """A failed upload, for admins (every part already escaped)."""
    return f":x: *{name}* from {uploader} · {when}\n{reason}"


def home_stale_summary(count: int) -> str:
    """How many documents are stale, and what a reindex does about it."""
    unit = "document is" if count == 1 else "documents are"
    return (
        f"*{count}* {unit} indexed with another model or pipeline version and not searched "
        "until a reindex. *Reindex* rebuilds every document, as `/kb-reindex` does; "
        "questions keep being answered meanwhile."
    )


def home_stale_line(name: str, model: str, when: str) -> str:
    """A stale document (``name`` and ``model`` already escaped)."""
    return f"• *{name}* · indexed with {model} · {when}"


def home_gap(question: str, count: int, outcomes: str, when: str, people: int = 0) -> str:
    """A group of unanswered questions (``question`` already escaped); ``people``: how many
    asked, said when fewer than the askings."""
    times = "once" if count == 1 else f"{count} times"
    if 0 < people < count:
        times += " by 1 person" if people == 1 else f" by {people} people"
    return f"*“{question}”*\nAsked {times} ({outcomes}), last {when}"


def home_gap_outcome(outcome: str, n: int) -> str:
    """How often a group of questions ended one way."""
    return f"{HOME_GAP_OUTCOMES.get(outcome, outcome)} {n}"


HOME_GAP_OUTCOMES = {"refused": "refused", "related": "possibly related shown"}


def home_gap_examples(examples: list[str]) -> str:
    """Other wordings of the same question (each already escaped)."""
    return "Also asked as: " + "; ".join(f"“{e}”" for e in examples)


def home_gap_closest(passage: str, distance: str) -> str:
    """The passage that came closest (a link or a label, already escaped)."""
    return f"Closest passage: {passage} (distance {distance})"


def home_gap_channel_passage(channel: str) -> str:
    """A closest passage from a channel's documents: where it is, never what it says."""
    return f"a passage in {channel}"


HOME_GAP_NO_PASSAGE = "No passage came close."


def home_disliked_line(question: str, outcome: str, dislikes: int, when: str, where: str) -> str:
    """An answer marked not helpful (every part already escaped); ``when``: the latest mark."""
    people = "1 person" if dislikes == 1 else f"{dislikes} people"
    return f"• *“{question}”* · {outcome} · not helpful to {people}, last {when} · {where}"


HOME_IN_A_DM = "asked in a direct message"
HOME_ANSWER_WITHHELD = "_Written from a channel's documents: not shown here._"
HOME_THREAD = "open the thread"


def home_thresholds(threshold: float, related: float | None) -> str:
    """The thresholds in force (settings)."""
    loose = f"{related:.3f}" if related is not None else "off"
    return (
        f"Threshold in force: *{threshold:.3f}* (`KB_THRESHOLD`); related passages: *{loose}* "
        "(`KB_RELATED_THRESHOLD`)."
    )


def home_calibrated(when: str, source: str, budget: float, proposed: str, related: str) -> str:
    """The last `kb calibrate` (``source`` already escaped)."""
    return (
        f"Last `kb calibrate`: {when}, on {source}, bluff budget {budget:.0%}. "
        f"It proposed threshold *{proposed}*, related *{related}*."
    )


def home_rates(threshold: float, bluffs: str, refused: str) -> str:
    """The measured rates at the threshold in force."""
    return (
        f"At {threshold:.3f}: bluffs (off-topic questions answered) {bluffs}; "
        f"in-domain questions refused {refused}."
    )


def home_rate(n: int, of: int, low: float, high: float) -> str:
    """One rate with its 95 % interval."""
    share = n / of if of else 0.0
    return f"{n}/{of} = {share:.1%} [{low:.1%}, {high:.1%}]"


def home_no_rates(threshold: float) -> str:
    """The record did not measure the threshold in force."""
    return f"The last calibration measured no threshold near {threshold:.3f}: run `kb calibrate` again."


def home_retrying(name: str, *, message: bool = True) -> str:
    """An admin's Retry from the Home tab, while it runs (``name`` already escaped);
    ``message``: its result also comes as a message."""
    tail = " The result comes as a message too." if message else ""
    return f":hourglass_flowing_sand: Retrying *{name}*…{tail}"


def home_channel_document(channel: str, doc_id: int) -> str:
    """A channel's document, to an admin not in that channel: where it is, not what it is called."""
    return f"a document in {channel} (#{doc_id})"


HOME_REASON_WITHHELD = "_Why it failed is shown to the channel's members._"


def home_retried(name: str, state: str, reason: str) -> str:
    """What a retry from the Home tab came to (every part already escaped)."""
    mark = ":white_check_mark:" if state == "indexed" else ":warning:"
    tail = f": {reason.rstrip('.')}" if reason else ""
    return f"{mark} *{name}*: {HOME_STATES.get(state, state)}{tail}."


DOWNLOAD_BAD_URL = "Refused to download the file: Slack's link to it is not a valid URL."
