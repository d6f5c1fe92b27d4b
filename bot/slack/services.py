"""What the Slack handlers need, wired once per process around the knowledge base and engine."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from bot.access import Access, SlackDirectory
from bot.conversation import Conversation
from bot.slack.agent import Agent
from bot.slack.approvals import Approvals
from bot.slack.canvases import Canvases
from bot.slack.config import SlackConfig
from bot.slack.deliveries import Deliveries
from bot.slack.home import Home
from bot.slack.people import Audience, Directory, Roles
from bot.slack.reindex import Reindexer
from bot.slack.reply import Streaming
from bot.slack.search import SlackSearcher
from bot.slack.sessions import Turns
from bot.slack.uploads import Jobs, Uploader
from bot.slack.words import Languages
from core.answer import Engine
from core.switch import ModelSwitch
from index.knowledge_base import KnowledgeBase


@dataclass
class Services:
    """What the handlers need, opened once per process."""

    config: SlackConfig
    kb: KnowledgeBase
    access: Access
    engine: Engine
    jobs: Jobs
    uploader: Uploader
    roles: Roles
    approvals: Approvals
    reindexer: Reindexer
    conversation: Conversation
    audience: Audience
    agent: Agent
    languages: Languages
    # Delivery records decide whether an event is answered at all: their own
    # threads (ack_executor), so they never queue behind embedding and retrieval work.
    ack_executor: ThreadPoolExecutor
    deliveries: Deliveries
    canvases: Canvases
    home: Home = field(init=False)
    streaming: Streaming = field(default_factory=Streaming)
    turns: Turns = field(default_factory=Turns)
    search: SlackSearcher | None = None
    """Slack's messages searched as the asker (``KB_SLACK_SEARCH=on``); ``None``: off."""

    def __post_init__(self) -> None:
        self.home = Home(
            self.kb,
            self.engine,
            self.roles,
            self.uploader,
            self.reindexer,
            self.languages,
            self.access,
        )

    @classmethod
    def open(
        cls,
        config: SlackConfig,
        kb: KnowledgeBase,
        engine: Engine,
        access: Access,
        *,
        switch: ModelSwitch | None = None,
    ) -> Services:
        """Wire the services around an opened knowledge base, engine and access rule.

        ``switch``: moves the engine with the knowledge base, for a
        ``/kb-reindex`` that moves it off the earlier default model
        (``bot.slack.reindex``); ``None``: it rebuilds on the model it runs.
        """
        jobs = Jobs()
        # One cache of users.info: the access rule's, when Slack is its directory.
        people = access.directory if isinstance(access.directory, SlackDirectory) else None
        directory = Directory(people=people)
        roles = Roles(config, directory)
        languages = Languages(directory, config.default_language)
        approvals = Approvals(kb, config, roles, engine, languages, access)
        ack_executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kb-ack")
        deliveries = Deliveries(kb.store, ack_executor, config.claim_lease)
        return cls(
            config=config,
            kb=kb,
            access=access,
            engine=engine,
            jobs=jobs,
            uploader=Uploader(kb, config, jobs, approvals, deliveries, access, engine),
            roles=roles,
            approvals=approvals,
            reindexer=Reindexer(kb, access, switch=switch),
            conversation=Conversation(engine),
            audience=Audience(config, directory),
            agent=Agent(kb, access, languages),
            languages=languages,
            streaming=Streaming(config.streaming),
            ack_executor=ack_executor,
            deliveries=deliveries,
            search=SlackSearcher(config) if config.search else None,
            canvases=Canvases(kb, config.canvas_channels, jobs),
        )
