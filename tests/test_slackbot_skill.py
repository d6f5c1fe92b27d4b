"""``kb slackbot-skill`` against the mock Slack Web API: the organisation's Slackbot skill.

The command runs in click's runner (in a thread: the mock answers from this
test's event loop) with ``SLACK_SKILL_TOKEN`` and ``SLACK_API_URL`` pointing at
the mock of ``tests/servers.py``, which follows Slack's documented methods
(docs.slack.dev/reference/methods/slackbot.skills.create, ``.update``,
``.list``): a user token only, ``description`` at most 400 characters,
``example_prompt`` at most 200, ``mcp_servers`` of the app's declared servers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
import yaml
from click.testing import CliRunner, Result
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.cli import main
from bot.mcp import SERVER_ID, SKILL, Skill
from bot.mcp.tools import ASK_TOOL, SEARCH_TOOL
from tests.servers import APP_ID, DEFAULT_BOT_TOKEN, DEFAULT_SKILL_TOKEN, MockSlackAPI

# Slack's limits on a skill's fields (slackbot.skills.create).
SLACK_DESCRIPTION_LIMIT = 400
SLACK_EXAMPLE_PROMPT_LIMIT = 200


@pytest.fixture
async def slack() -> AsyncIterator[MockSlackAPI]:
    async with MockSlackAPI() as api:
        yield api


async def _skill_command(
    slack: MockSlackAPI, *args: str, token: str = DEFAULT_SKILL_TOKEN
) -> Result:
    env = {"SLACK_SKILL_TOKEN": token, "SLACK_API_URL": slack.api_url}
    runner = CliRunner(env=env)
    return await asyncio.to_thread(runner.invoke, main, ["slackbot-skill", *args])


def _methods(slack: MockSlackAPI) -> list[str]:
    return [m for m, _ in slack.log] + [m for m, _, _ in slack.rejected]


async def test_the_skill_is_created_bound_to_the_apps_mcp_server(slack: MockSlackAPI) -> None:
    result = await _skill_command(slack, "--app-id", APP_ID, "--json")
    assert result.exit_code == 0, result.output
    # Looked for first, then created: one skill.
    assert _methods(slack) == ["slackbot.skills.list", "slackbot.skills.create"]
    [(skill_id, skill)] = slack.skills.items()
    assert json.loads(result.stdout) == {
        "action": "created",
        "skill_id": skill_id,
        "skill": {k: v for k, v in skill.items() if k != "instructions"},
    }
    assert skill["mcp_servers"] == [{"app_id": APP_ID, "server_id": SERVER_ID}]
    assert skill["display_name"] == SKILL.display_name
    # When Slackbot should use it: company questions, answered from the company's documents.
    assert "question about the company" in skill["description"]
    assert "company's own documents" in skill["description"]
    assert len(skill["description"]) <= SLACK_DESCRIPTION_LIMIT
    assert len(skill["example_prompt"]) <= SLACK_EXAMPLE_PROMPT_LIMIT
    assert "{skill}" in skill["example_prompt"]
    # The instructions are markdown naming the tools Slackbot calls.
    assert skill["instructions"].startswith("# ")
    assert f"`{ASK_TOOL}`" in skill["instructions"] and f"`{SEARCH_TOOL}`" in skill["instructions"]


async def test_a_second_run_updates_the_skill_it_created(slack: MockSlackAPI) -> None:
    first = await _skill_command(slack, "--app-id", APP_ID)
    assert first.exit_code == 0, first.output
    [skill_id] = slack.skills
    slack.skills[skill_id]["description"] = "edited by hand"
    second = await _skill_command(slack, "--app-id", APP_ID)
    assert second.exit_code == 0, second.output
    assert "updated" in second.stdout and skill_id in second.stdout
    assert list(slack.skills) == [skill_id]
    assert slack.skills[skill_id]["description"] == SKILL.description
    [update] = slack.calls("slackbot.skills.update")
    assert update["skill_id"] == skill_id


async def test_a_rate_limited_call_waits_slacks_retry_after_and_past_the_retries_says_when(
    slack: MockSlackAPI,
) -> None:
    slack.rate_limit("slackbot.skills.create", retry_after=0, times=1)
    first = await _skill_command(slack, "--app-id", APP_ID)
    assert first.exit_code == 0, first.output
    assert [e for m, _, e in slack.rejected if m == "slackbot.skills.create"] == ["ratelimited"]
    [skill_id] = slack.skills

    # Still rate-limited after the client's two retries: when to try again, nothing changed.
    slack.rate_limit("slackbot.skills.update", retry_after=0, times=3)
    second = await _skill_command(slack, "--app-id", APP_ID)
    assert second.exit_code != 0
    assert "Slack is still rate-limiting skill calls: try again in 1 s." in second.output
    assert len(slack.rejected) == 1 + 3 and slack.calls("slackbot.skills.update") == []
    assert list(slack.skills) == [skill_id]


async def test_the_skill_is_found_on_a_later_page_of_the_owners_skills(
    slack: MockSlackAPI,
) -> None:
    for i in range(45):
        slack.skills[f"F{i:010d}"] = {"id": f"F{i:010d}", "display_name": f"Other skill {i}"}
    ours = "F9999999999"  # listed last: the third page of 20
    slack.skills[ours] = {"id": ours, "display_name": SKILL.display_name}
    result = await _skill_command(slack, "--app-id", APP_ID)
    assert result.exit_code == 0, result.output
    assert len(slack.calls("slackbot.skills.list")) == 3
    assert slack.calls("slackbot.skills.create") == []
    [update] = slack.calls("slackbot.skills.update")
    assert update["skill_id"] == ours


async def test_a_bot_token_is_refused_with_what_to_use_instead(slack: MockSlackAPI) -> None:
    result = await _skill_command(slack, "--app-id", APP_ID, token=DEFAULT_BOT_TOKEN)
    assert result.exit_code == 1
    assert "user token (xoxp-...)" in result.output
    assert DEFAULT_BOT_TOKEN not in result.output
    assert slack.skills == {}


async def test_a_server_the_app_does_not_declare_is_refused_in_a_sentence(
    slack: MockSlackAPI,
) -> None:
    result = await _skill_command(slack, "--app-id", APP_ID, "--server-id", "elsewhere")
    assert result.exit_code == 1
    assert "invalid_arguments" in result.output and "MCP server id" in result.output
    assert DEFAULT_SKILL_TOKEN not in result.output
    assert slack.skills == {}


async def test_without_a_token_the_command_says_what_to_set(slack: MockSlackAPI) -> None:
    result = await _skill_command(slack, "--app-id", APP_ID, token="")
    assert result.exit_code == 1
    assert "SLACK_SKILL_TOKEN" in result.output and "--print" in result.output
    assert _methods(slack) == []


async def test_print_writes_the_skill_as_a_file_and_calls_nothing(slack: MockSlackAPI) -> None:
    result = await _skill_command(slack, "--app-id", APP_ID, "--print", token="")
    assert result.exit_code == 0, result.output
    _, front, body = result.stdout.split("---\n", 2)
    fields = yaml.safe_load(front)
    assert fields == {
        "display_name": SKILL.display_name,
        "description": SKILL.description,
        "example_prompt": SKILL.example_prompt,
        "mcp_servers": [{"app_id": APP_ID, "server_id": SERVER_ID}],
    }
    assert body.endswith(SKILL.instructions)
    assert _methods(slack) == []


async def test_the_mock_refuses_what_slack_refuses(slack: MockSlackAPI) -> None:
    # The mock has teeth: a description over Slack's 400 characters is refused.
    client = AsyncWebClient(token=DEFAULT_SKILL_TOKEN, base_url=slack.api_url)
    fields = SKILL.arguments(APP_ID)
    with pytest.raises(SlackApiError) as refused:
        await client.slackbot_skills_create(
            **{**fields, "description": "x" * (SLACK_DESCRIPTION_LIMIT + 1)}
        )
    assert refused.value.response["error"] == "invalid_arguments"
    created = await client.slackbot_skills_create(
        **{**fields, "description": "x" * SLACK_DESCRIPTION_LIMIT}
    )
    assert created["ok"] and "instructions" not in created["skill"]


def test_a_skill_over_slacks_limits_cannot_be_made() -> None:
    with pytest.raises(ValueError, match="description"):
        Skill("name", "x" * (SLACK_DESCRIPTION_LIMIT + 1), "prompt", "# instructions")
    with pytest.raises(ValueError, match="example_prompt"):
        Skill("name", "when", "x" * (SLACK_EXAMPLE_PROMPT_LIMIT + 1), "# instructions")
