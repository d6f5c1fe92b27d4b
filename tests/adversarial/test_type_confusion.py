"""Values of the wrong JSON type, from every caller: each is refused by name, never read as another.

A hostile payload sends a boolean where a number is expected, a string "3"
or a float where an integer is, NaN or Infinity, null, a list or an object
where a scalar is. Lax parsing reads ``true`` as 1 and ``"3"`` as 3: a value
the caller never meant, accepted in silence. Each attack here worked before
its fix:

* the MCP tools' arguments (the bot's real app in process, called by the
  official MCP client with a bearer token): ``limit: true`` searched with one
  passage, ``"3"`` and ``2.0`` with three and two; ``query: true`` is refused
  as it always was.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from mcp import ClientSession

pytest.register_assert_rewrite("tests.conftest_bot")

from bot.mcp import MAX_QUERY_CHARS  # noqa: E402
from tests.conftest_bot import IN_DOMAIN, Bot, BotFactory, mcp_session  # noqa: E402

SEARCH = "search_knowledge_base"
ASK = "ask_knowledge_base"


def _mcp(bot: Bot) -> contextlib.AbstractAsyncContextManager[ClientSession]:
    """The official MCP client, as a person holding a token."""
    return mcp_session(bot, "type-confusion", "U0TYPES001")


# ------------------------------------------------------------------ the MCP tools' arguments

WRONG_ARGUMENTS: dict[str, tuple[str, dict[str, Any], str]] = {
    "limit true": (SEARCH, {"query": IN_DOMAIN, "limit": True}, "limit"),
    "limit false": (SEARCH, {"query": IN_DOMAIN, "limit": False}, "limit"),
    "limit the string 3": (SEARCH, {"query": IN_DOMAIN, "limit": "3"}, "limit"),
    "limit the string 1e3": (SEARCH, {"query": IN_DOMAIN, "limit": "1e3"}, "limit"),
    "limit the float 2.0": (SEARCH, {"query": IN_DOMAIN, "limit": 2.0}, "limit"),
    "limit the float 2.5": (SEARCH, {"query": IN_DOMAIN, "limit": 2.5}, "limit"),
    "limit 1e3": (SEARCH, {"query": IN_DOMAIN, "limit": 1e3}, "limit"),
    "limit null": (SEARCH, {"query": IN_DOMAIN, "limit": None}, "limit"),
    "limit a list": (SEARCH, {"query": IN_DOMAIN, "limit": [3]}, "limit"),
    "limit a list in a string": (SEARCH, {"query": IN_DOMAIN, "limit": "[3]"}, "limit"),
    "limit an object": (SEARCH, {"query": IN_DOMAIN, "limit": {"n": 3}}, "limit"),
    "limit a huge integer": (SEARCH, {"query": IN_DOMAIN, "limit": 10**400}, "limit"),
    "query true": (SEARCH, {"query": True}, "query"),
    "query null": (SEARCH, {"query": None}, "query"),
    "query an object": (SEARCH, {"query": {"text": IN_DOMAIN}}, "query"),
    "query a float": (SEARCH, {"query": 2.5}, "query"),
    "question a number": (ASK, {"question": 42}, "question"),
    "question a list": (ASK, {"question": [IN_DOMAIN]}, "question"),
    "question false": (ASK, {"question": False}, "question"),
    "question null": (ASK, {"question": None}, "question"),
}


@pytest.mark.parametrize("name", list(WRONG_ARGUMENTS))
async def test_an_argument_of_the_wrong_type_is_a_tool_error_naming_it(
    make_bot: BotFactory, name: str
) -> None:
    tool, arguments, argument = WRONG_ARGUMENTS[name]
    bot = await make_bot(mcp=True)
    async with _mcp(bot) as session:
        result = await session.call_tool(tool, arguments)
    text = result.content[0].text  # type: ignore[union-attr]
    assert result.is_error, f"{name} was accepted: {text[:300]}"
    assert argument in text
    assert "Traceback" not in text
    # Nothing was searched or asked on a value the caller never meant.
    assert list(bot.kb.store.db.query("SELECT id FROM query_log")) == []


async def test_valid_calls_still_work_and_the_schema_still_says_integer(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(mcp=True)
    async with _mcp(bot) as session:
        listed = {t.name: t for t in (await session.list_tools()).tools}
        one = await session.call_tool(SEARCH, {"query": IN_DOMAIN, "limit": 1})
        default = await session.call_tool(SEARCH, {"query": IN_DOMAIN})
        asked = await session.call_tool(ASK, {"question": IN_DOMAIN})
        # A query that reads as JSON is still text: the SDK parses no str argument.
        json_like = await session.call_tool(SEARCH, {"query": '["expenses"]', "limit": 2})
    schema = listed[SEARCH].input_schema["properties"]
    assert schema["limit"]["type"] == "integer"
    assert (schema["limit"]["minimum"], schema["limit"]["maximum"]) == (1, 20)
    assert schema["query"]["type"] == "string"
    assert schema["query"]["maxLength"] == MAX_QUERY_CHARS
    assert listed[ASK].input_schema["properties"]["question"]["type"] == "string"
    assert not one.is_error and len(one.structured_content["passages"]) == 1  # type: ignore[index]
    assert not default.is_error and default.structured_content["verdict"] == "answerable"  # type: ignore[index]
    assert not asked.is_error and asked.structured_content["outcome"] == "answered"  # type: ignore[index]
    assert not json_like.is_error, json_like.content
