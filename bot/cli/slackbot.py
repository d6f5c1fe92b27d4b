"""``kb slackbot-skill``: create or update the organisation's Slackbot skill bound to this MCP server.

The skill (``bot.mcp.skill``) tells Slackbot to answer company questions from
the company's documents through the knowledge base's tools. The command looks
for a skill of the same name among those the token's person owns
(``slackbot.skills.list``, every page) and updates it
(``slackbot.skills.update``), or creates it (``slackbot.skills.create``).
Slack takes these methods with a user token only (``SLACK_SKILL_TOKEN``); the
token is sent to Slack and nowhere else. ``--print`` writes the skill as a file
instead, for admins who create it by hand; it calls nothing.
"""

from __future__ import annotations

from typing import Any

import click
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError

from bot.access import blocking_web_client, retry_after
from bot.cli.base import emit, json_option, main, settings_of
from bot.mcp import SERVER_ID, SKILL, Skill, skill_file
from index.errors import KBError

__all__ = ["SkillRefused", "publish_skill"]

# Pages of skills read at most: a person owns far fewer skills than this many pages hold.
_MAX_PAGES = 50
# What Slack's errors mean for the person running the command.
_ERRORS = {
    "not_allowed_token_type": "Slack takes Slackbot skills from a user token (xoxp-...) only: "
    "set SLACK_SKILL_TOKEN to the user token of the skill's owner.",
    "invalid_auth": "Slack does not know SLACK_SKILL_TOKEN: check it, or issue a new one.",
    "token_revoked": "SLACK_SKILL_TOKEN was revoked: issue a new one.",
    "invalid_arguments": "Slack refused the skill's fields (invalid_arguments): check the app id "
    "and the MCP server id, and that Slackbot skills are on for the organisation.",
}


class SkillRefused(KBError):
    """Slack did not create or update the Slackbot skill (a token, a scope, an argument)."""


def publish_skill(client: WebClient, skill: Skill, app_id: str, server_id: str) -> dict[str, Any]:
    """Create ``skill``, or update the one of the same name its owner has; Slack's skill object.

    Raises:
        SkillRefused: Slack refused a call, or could not be reached.
    """
    arguments = skill.arguments(app_id, server_id)
    try:
        existing = _owned(client, skill.display_name)
        if existing is None:
            resp = client.slackbot_skills_create(**arguments)
            action = "created"
        else:
            resp = client.slackbot_skills_update(skill_id=existing, **arguments)
            action = "updated"
    except SlackApiError as exc:
        raise SkillRefused(_refusal(exc)) from exc
    except SlackClientError as exc:
        raise SkillRefused(f"Slack could not be reached: {type(exc).__name__}.") from exc
    found = dict(resp.get("skill") or {})
    return {"action": action, "skill_id": found.get("id") or existing, "skill": found}


def _owned(client: WebClient, display_name: str) -> str | None:
    """The id of the token's person's skill named ``display_name``; ``None`` without one."""
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        resp = client.slackbot_skills_list(filter="owned", cursor=cursor)
        for skill in resp.get("skills") or []:
            if skill.get("display_name") == display_name and skill.get("id"):
                return str(skill["id"])
        cursor = (resp.get("response_metadata") or {}).get("next_cursor") or None
        if cursor is None:
            return None
    return None


def _refusal(exc: SlackApiError) -> str:
    error = str(exc.response.get("error") or "unknown_error")
    if error == "missing_scope":
        needed = exc.response.get("needed") or "the scope Slack names"
        return f"SLACK_SKILL_TOKEN lacks the scope {needed}: add it to the app's user scopes and reinstall."
    wait = retry_after(exc)
    if wait is not None:
        return f"Slack is still rate-limiting skill calls: try again in {wait:.0f} s."
    return _ERRORS.get(error, f"Slack refused the skill: {error}.")


@main.command("slackbot-skill")
@click.option(
    "--app-id",
    required=True,
    help="The Slack app's id (A..., in its Basic Information): the skill needs its MCP server.",
)
@click.option(
    "--server-id",
    default=SERVER_ID,
    show_default=True,
    help="The MCP server's id in the app (its key under mcp_servers in the manifest).",
)
@click.option(
    "--print",
    "print_only",
    is_flag=True,
    help="Write the skill as a markdown file to stdout instead of creating it (calls nothing).",
)
@json_option("Print Slack's skill as JSON.")
@click.pass_context
def slackbot_skill(
    ctx: click.Context, app_id: str, server_id: str, print_only: bool, as_json: bool
) -> None:
    """Create or update the organisation's Slackbot skill bound to this knowledge base's MCP server.

    Slackbot then answers company questions from the company's documents through
    the knowledge base (docs/mcp.md#slackbot). Needs SLACK_SKILL_TOKEN, a user
    token of the skill's owner; an admin publishes the skill to the organisation.

    Example: kb slackbot-skill --app-id A0123ABCD   (or --print > skill.md)
    """
    if print_only:
        click.echo(skill_file(SKILL, app_id, server_id), nl=False)
        return
    settings = settings_of(ctx)
    token = settings.slack_skill_token.get_secret_value()
    if not token:
        raise click.ClickException(
            "Set SLACK_SKILL_TOKEN to a user token (xoxp-...) of the skill's owner, "
            "or write the skill to a file with --print."
        )
    # A command may wait out Slack's Retry-After (twice) rather than fail.
    client = blocking_web_client(token, settings.slack_api_url)
    done = publish_skill(client, SKILL, app_id, server_id)
    emit(
        done,
        as_json,
        lambda: click.echo(
            f"Slackbot skill {SKILL.display_name!r} {done['action']} ({done['skill_id']}), "
            f"bound to MCP server {server_id!r} of app {app_id}. An admin publishes it to "
            "the organisation."
        ),
    )
