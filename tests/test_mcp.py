"""The MCP server of a real ``kb serve`` process, called by the official MCP client.

One ``kb serve`` process per module (``KB_MCP=on``), on a data dir holding the
fixture documents (the Falcon launch plan only in ``CHANNEL_ID``), talking to
the local mock Slack Web API and OpenAI-compatible server of ``tests/servers.py``.
The SDK's own client (``mcp.client.streamable_http`` + ``ClientSession``) lists
the tools, searches and asks with tokens issued in the store; raw HTTP requests
check the door: no token, wrong, revoked and expired tokens, a token in the
query string, bodies over the limit, malformed JSON-RPC, a burst of calls,
and Slack-signed calls (Slack identity auth).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httpx2
import pytest
import pytest_asyncio
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from bot.mcp import MAX_BODY_BYTES, MAX_QUERY_CHARS
from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase
from index.storage.store import Store

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.conftest_bot import (  # noqa: E402
    FALCON_Q,
    IN_DOMAIN,
    LINK_SECRET,
    OUT_OF_DOMAIN,
    PUBLIC_URL,
    THRESHOLD,
    default_reply,
    ingest_fixture_documents,
)
from tests.servers import (  # noqa: E402
    CHANNEL_ID,
    DEFAULT_OPENAI_API_KEY,
    DEFAULT_SIGNING_SECRET,
    TEAM_ID,
    MockSlackAPI,
    OpenAICompatServer,
    closed_port_url,
    sign_slack_request,
)

on_server = pytest.mark.asyncio(loop_scope="module")

ALICE = "U0ALICE001"  # a token scoped to CHANNEL_ID
BOB = "U0BOB00001"  # no scopes, in no channel
BURSTY = "U0BURST001"  # sends a burst of calls
CAROL = "U0CAROL001"  # no scopes, a member of CHANNEL_ID
OUTSIDER = "U0EXTERN01"  # of another organisation
OTHER_TEAM = "T0OTHER001"
START_TIMEOUT_S = 90.0
CALLS_PER_MINUTE = 100
BURST = 1000


@dataclass
class Served:
    """The ``kb serve`` process and what it talks to."""

    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    data_dir: Path
    slack: MockSlackAPI
    llm: OpenAICompatServer
    http: aiohttp.ClientSession
    tokens: dict[str, str]

    @property
    def mcp(self) -> str:
        return f"{self.url}/mcp"

    def auth(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[name]}", **JSON_RPC_HEADERS}


JSON_RPC_HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
}


def _issue_tokens(data_dir: Path, kb: KnowledgeBase) -> dict[str, str]:
    tokens = kb.store.mcp_tokens
    issued = {
        "alice": tokens.issue("alice-falcon", user_id=ALICE, scopes=(CHANNEL_ID,))[0],
        "bob": tokens.issue("bob", user_id=BOB)[0],
        "carol": tokens.issue("carol", user_id=CAROL)[0],
        "burst": tokens.issue("burst", user_id=BURSTY)[0],
        "outsider": tokens.issue("outsider", user_id=OUTSIDER)[0],
        "revoked": tokens.issue("revoked", user_id=ALICE)[0],
    }
    tokens.revoke("revoked")
    # Issued three days ago for one day: expired two days ago.
    past = Store(data_dir, clock=lambda: time.time() - 3 * 86400)
    issued["expired"] = past.mcp_tokens.issue("expired", user_id=ALICE, expires_in_days=1)[0]
    past.close()
    return issued


def _env(data_dir: Path, slack: MockSlackAPI, llm: OpenAICompatServer) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KB_", "SLACK_", "OPENAI_"))
        or k in ("KB_ENCODER_CACHE", "KB_EMBEDDING_MODEL")
    }
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "KB_DATA_DIR": str(data_dir),
            "KB_MCP": "on",
            "KB_MCP_SLACK_IDENTITY": "on",
            "KB_MCP_CALLS_PER_MINUTE": str(CALLS_PER_MINUTE),
            "SLACK_BOT_TOKEN": slack.bot_token,
            "SLACK_SIGNING_SECRET": DEFAULT_SIGNING_SECRET,
            "SLACK_API_URL": slack.api_url,
            "OPENAI_BASE_URL": llm.url,
            "OPENAI_API_KEY": DEFAULT_OPENAI_API_KEY,
            "KB_LINK_SECRET": LINK_SECRET,
            "KB_PUBLIC_URL": PUBLIC_URL,
            "KB_THRESHOLD": str(THRESHOLD),
            "KB_LLM_MAX_RETRIES": "0",
            "KB_LOG_LEVEL": "DEBUG",
        }
    )
    return env


async def _until_ready(
    url: str, proc: subprocess.Popen[bytes], http: aiohttp.ClientSession
) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    last: object = "no answer"
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"kb serve exited with {proc.returncode}"
        try:
            async with http.get(f"{url}/readyz") as resp:
                if resp.status == 200:
                    return
                last = await resp.text()
        except aiohttp.ClientError as exc:
            last = exc
        await asyncio.sleep(0.2)
    raise AssertionError(f"kb serve not ready after {START_TIMEOUT_S} s: {last}")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(
    tmp_path_factory: pytest.TempPathFactory, embedder: Embedder
) -> AsyncIterator[Served]:
    """``kb serve`` with ``KB_MCP=on`` over the fixture documents, tokens issued."""
    root = tmp_path_factory.mktemp("mcp")
    data_dir = root / "data"
    kb = KnowledgeBase(IndexConfig(data_dir=data_dir), embedder=embedder)
    ingest_fixture_documents(kb)
    tokens = _issue_tokens(data_dir, kb)
    kb.store.close()
    async with (
        MockSlackAPI() as slack,
        OpenAICompatServer(reply=default_reply, api_key=DEFAULT_OPENAI_API_KEY) as llm,
        aiohttp.ClientSession() as http,
    ):
        slack.set_members(CHANNEL_ID, [CAROL, ALICE])
        outsider = slack.set_user(OUTSIDER)
        outsider["team_id"] = OTHER_TEAM
        outsider["profile"]["team"] = OTHER_TEAM
        port = int(urlsplit(closed_port_url()).port or 0)
        log = root / "serve.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "bot.cli", "serve", "--port", str(port)],
                env=_env(data_dir, slack, llm),
                cwd=root,  # no .env of the repository
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        url = f"http://127.0.0.1:{port}"
        try:
            await _until_ready(url, proc, http)
            yield Served(url, proc, log, data_dir, slack, llm, http, tokens)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.asynccontextmanager
async def mcp_client(served: Served, token: str) -> AsyncIterator[ClientSession]:
    """The SDK's client, initialized, sending ``token`` as its bearer token."""
    headers = {"Authorization": f"Bearer {served.tokens[token]}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        streamable_http_client(served.mcp, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def _call(served: Served, token: str, tool: str, **arguments: Any) -> Any:
    async with mcp_client(served, token) as session:
        return await session.call_tool(tool, arguments)


_request_ids = itertools.count(1)


def _rpc(method: str, params: dict[str, Any] | None = None, id_: int | None = None) -> bytes:
    # A new id each time, as a client numbers its requests: a Slack signature over the
    # same bytes in the same second is one request, and a second one is a replay.
    number = next(_request_ids) if id_ is None else id_
    return json.dumps(
        {"jsonrpc": "2.0", "id": number, "method": method, "params": params or {}}
    ).encode()


def _tool_call(name: str, **arguments: Any) -> bytes:
    return _rpc("tools/call", {"name": name, "arguments": arguments})


async def _post(
    served: Served, body: bytes, headers: dict[str, str], path: str = "/mcp"
) -> tuple[int, dict[str, str], bytes]:
    async with served.http.post(f"{served.url}{path}", data=body, headers=headers) as resp:
        return resp.status, dict(resp.headers), await resp.read()


def _logged(served: Served) -> list[dict[str, Any]]:
    store = Store(served.data_dir)
    try:
        return list(
            store.db.query(
                'SELECT question, outcome, model_called, "user", surface, client, scopes '
                "FROM query_log ORDER BY id"
            )
        )
    finally:
        store.close()


# ------------------------------------------------------------------ the SDK's client


@on_server
async def test_the_client_lists_the_two_tools_with_what_they_return(served: Served) -> None:
    async with mcp_client(served, "bob") as session:
        listed = await session.list_tools()
    tools = {t.name: t for t in listed.tools}
    assert set(tools) == {"search_knowledge_base", "ask_knowledge_base"}
    search = tools["search_knowledge_base"]
    assert "nothing close" in (search.description or "")
    assert search.input_schema["properties"]["query"]["maxLength"] == MAX_QUERY_CHARS
    assert {"verdict", "passages"} <= set(search.output_schema["properties"])  # type: ignore[index]
    assert {"outcome", "sources"} <= set(tools["ask_knowledge_base"].output_schema["properties"])  # type: ignore[index]


@on_server
async def test_a_search_finds_passages_with_deep_links_and_says_answerable(
    served: Served,
) -> None:
    result = await _call(served, "bob", "search_knowledge_base", query=IN_DOMAIN, limit=3)
    assert not result.is_error
    found = result.structured_content
    assert found["verdict"] == "answerable"
    first = found["passages"][0]
    assert first["document"] == "Employee handbook" and first["section"] == "Expenses"
    assert "30 days" in first["quote"]
    assert first["passes_gate"] and first["distance"] <= THRESHOLD
    assert first["link"].startswith(f"{PUBLIC_URL}/d/") and "#char=" in first["link"]
    assert len(found["passages"]) <= 3
    text = result.content[0].text
    assert text.startswith("Verdict: answerable.") and first["link"] in text


@on_server
async def test_the_signed_link_opens_the_quoted_passage_in_the_viewer(served: Served) -> None:
    result = await _call(served, "bob", "search_knowledge_base", query=IN_DOMAIN)
    link = result.structured_content["passages"][0]["link"]
    path_and_query, _, fragment = link.removeprefix(PUBLIC_URL).partition("#")
    start, end = (int(x) for x in fragment.removeprefix("char=").split(","))
    async with served.http.get(f"{served.url}{path_and_query}") as resp:
        assert resp.status == 200
    store = Store(served.data_dir)
    doc_id = int(path_and_query.split("/")[2].split("?")[0])
    assert (
        store.canonical_text(doc_id)[start:end] == result.structured_content["passages"][0]["quote"]
    )
    store.close()


@on_server
async def test_an_unrelated_search_says_nothing_close_and_lists_nothing(served: Served) -> None:
    result = await _call(served, "bob", "search_knowledge_base", query=OUT_OF_DOMAIN)
    assert result.structured_content["verdict"] == "nothing close"
    assert result.structured_content["passages"] == []


@on_server
async def test_an_unrelated_question_is_refused_without_calling_the_model(
    served: Served,
) -> None:
    before = len(served.llm.requests)
    result = await _call(served, "bob", "ask_knowledge_base", question=OUT_OF_DOMAIN)
    answer = result.structured_content
    assert answer["outcome"] == "refused" and not answer["model_called"]
    assert answer["sources"] == [] and not answer["grounded"]
    assert "nothing on this" in result.content[0].text
    assert len(served.llm.requests) == before
    assert not any(OUT_OF_DOMAIN in json.dumps(r) for r in served.llm.requests)


@on_server
async def test_an_answerable_question_is_answered_with_resolved_citations(served: Served) -> None:
    result = await _call(served, "bob", "ask_knowledge_base", question=IN_DOMAIN)
    answer = result.structured_content
    assert answer["outcome"] == "answered" and answer["grounded"] and answer["model_called"]
    assert answer["answer"] == "Here is what the documents say [1]."
    [source] = answer["sources"]
    assert source["n"] == 1 and source["document"] == "Employee handbook"
    assert "#char=" in source["link"]
    # The question reached the model through the product's prompt: in the person's
    # message beside the sources, never in the system rules.
    [request] = [r for r in served.llm.requests if IN_DOMAIN in json.dumps(r["messages"])]
    system, *_, user = request["messages"]
    assert system["role"] == "system" and IN_DOMAIN not in system["content"]
    assert user["role"] == "user" and IN_DOMAIN in user["content"]
    assert "Submit expense claims within 30 days" in user["content"]
    assert "Sources:\n[1] Employee handbook" in result.content[0].text


@on_server
async def test_every_call_is_logged_with_surface_mcp_and_the_token_name(served: Served) -> None:
    question = "Which DNS server fixes the VPN?"
    await _call(served, "carol", "ask_knowledge_base", question=question)
    await _call(served, "carol", "search_knowledge_base", query=OUT_OF_DOMAIN + " (logged)")
    rows = {r["question"]: r for r in _logged(served)}
    assert rows[question]["surface"] == "mcp" and rows[question]["client"] == "carol"
    assert rows[question]["user"] == CAROL
    searched = rows[OUT_OF_DOMAIN + " (logged)"]
    # A search that found nothing is a gap like a refused question.
    assert (searched["surface"], searched["client"], searched["outcome"]) == (
        "mcp",
        "carol",
        "refused",
    )


# ------------------------------------------------------------------ scopes


@on_server
async def test_a_token_scoped_to_a_channel_finds_its_document(served: Served) -> None:
    result = await _call(served, "alice", "search_knowledge_base", query=FALCON_Q)
    found = result.structured_content
    assert found["verdict"] == "answerable"
    assert found["passages"][0]["document"] == "Project Falcon"


@on_server
async def test_a_token_without_the_channel_does_not_find_its_document(served: Served) -> None:
    result = await _call(served, "bob", "search_knowledge_base", query=FALCON_Q, limit=20)
    documents = {p["document"] for p in result.structured_content["passages"]}
    assert "Project Falcon" not in documents
    asked = await _call(served, "bob", "ask_knowledge_base", question=FALCON_Q)
    assert all(s["document"] != "Project Falcon" for s in asked.structured_content["sources"])


@on_server
async def test_a_token_without_scopes_searches_the_channels_its_person_is_in(
    served: Served,
) -> None:
    result = await _call(served, "carol", "search_knowledge_base", query=FALCON_Q)
    assert result.structured_content["passages"][0]["document"] == "Project Falcon"
    assert any(
        m == "conversations.members" and p.get("channel") == CHANNEL_ID for m, p in served.slack.log
    )


@on_server
async def test_a_person_of_another_organisation_is_refused(served: Served) -> None:
    result = await _call(served, "outsider", "search_knowledge_base", query=IN_DOMAIN)
    assert result.is_error
    assert "only members of its own Slack workspace" in result.content[0].text
    assert result.structured_content is None


# ------------------------------------------------------------------ the door


@on_server
@pytest.mark.parametrize("credentials", [None, "Bearer kbmcp_not-a-token", "revoked", "expired"])
async def test_a_call_without_a_valid_token_gets_a_bare_401(
    served: Served, credentials: str | None
) -> None:
    headers = dict(JSON_RPC_HEADERS)
    if credentials in served.tokens:
        headers["Authorization"] = f"Bearer {served.tokens[credentials]}"
    elif credentials:
        headers["Authorization"] = credentials
    status, response_headers, body = await _post(served, _rpc("tools/list"), headers)
    assert status == 401
    assert response_headers["WWW-Authenticate"] == "Bearer"
    assert body == b""


@on_server
async def test_the_sdk_client_without_a_token_is_refused(served: Served) -> None:
    async with httpx2.AsyncClient(timeout=30) as http:
        response = await http.post(served.mcp, content=_rpc("tools/list"), headers=JSON_RPC_HEADERS)
    assert response.status_code == 401


@on_server
async def test_a_token_in_the_query_string_is_refused_and_never_logged(served: Served) -> None:
    token = served.tokens["bob"]
    status, _, body = await _post(
        served, _rpc("tools/list"), JSON_RPC_HEADERS, path=f"/mcp?token={token}"
    )
    assert status == 400
    assert "Authorization header" in json.loads(body)["error"]["message"]
    # Even with the token in the header too: the query string is refused before anything.
    status, _, _ = await _post(served, _rpc("tools/list"), served.auth("bob"), f"/mcp?t={token}")
    assert status == 400
    served_log = served.log.read_text(encoding="utf-8", errors="replace")
    assert "/mcp" in served_log  # the access log saw the requests
    assert all(t not in served_log for t in served.tokens.values())


@on_server
async def test_malformed_json_rpc_gets_a_parse_error(served: Served) -> None:
    status, _, body = await _post(served, b'{"jsonrpc": "2.0", "method": ', served.auth("bob"))
    assert status == 400
    assert json.loads(body)["error"]["code"] == -32700


@on_server
async def test_an_unknown_tool_is_an_error_naming_it(served: Served) -> None:
    async with mcp_client(served, "bob") as session:
        result = await session.call_tool("delete_everything", {})
    assert result.is_error
    assert "delete_everything" in result.content[0].text


@on_server
async def test_a_query_over_the_limit_is_refused_with_the_limit(served: Served) -> None:
    result = await _call(
        served, "bob", "search_knowledge_base", query="expenses " * (MAX_QUERY_CHARS // 8)
    )
    assert result.is_error
    assert f"at most {MAX_QUERY_CHARS} are accepted" in result.content[0].text
    empty = await _call(served, "bob", "ask_knowledge_base", question="   ")
    assert empty.is_error and "The query is empty" in empty.content[0].text


@on_server
async def test_a_question_of_a_megabyte_gets_413_before_it_is_read(served: Served) -> None:
    body = _tool_call("ask_knowledge_base", question="x" * (1024 * 1024))
    status, _, response = await _post(served, body, served.auth("bob"))
    assert status == 413
    assert f"over {MAX_BODY_BYTES // 1024} KiB" in json.loads(response)["error"]["message"]
    # Without a length up front (chunked), the door stops reading past the limit.

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(16):
            yield b"x" * 65536

    async with served.http.post(served.mcp, data=chunks(), headers=served.auth("bob")) as resp:
        assert resp.status == 413
    assert served.proc.poll() is None


@on_server
async def test_a_thousand_calls_in_a_second_are_rate_limited(served: Served) -> None:
    body = _rpc("tools/list")
    headers = served.auth("burst")

    async def one() -> tuple[int, dict[str, str], bytes]:
        return await _post(served, body, headers)

    started = time.monotonic()
    answers = await asyncio.gather(*(one() for _ in range(BURST)))
    statuses = [s for s, _, _ in answers]
    assert statuses.count(200) == CALLS_PER_MINUTE
    assert statuses.count(429) == BURST - CALLS_PER_MINUTE
    limited = next(a for a in answers if a[0] == 429)
    # The rest of the minute the burst opened, in whole seconds (a wall-clock quantity).
    waited = time.monotonic() - started
    assert 60 - math.ceil(waited) - 1 <= int(limited[1]["Retry-After"]) <= 60
    assert f"at most {CALLS_PER_MINUTE} a minute" in json.loads(limited[2])["error"]["message"]
    # Another person's token is not held up by this one's burst.
    status, _, _ = await _post(served, body, served.auth("bob"))
    assert status == 200
    assert time.monotonic() - started < 60  # the window had not passed: the limit did this


# ------------------------------------------------------------------ Slack identity auth


def _slack_signed(body: bytes, secret: str = DEFAULT_SIGNING_SECRET) -> dict[str, str]:
    return {**sign_slack_request(secret, body), **JSON_RPC_HEADERS}


def _slack_tool_call(name: str, user: str, team: str, **arguments: Any) -> bytes:
    params = {
        "name": name,
        "arguments": arguments,
        "_meta": {"slack": {"user_id": user, "team_id": team}},
    }
    return _rpc("tools/call", params)


@on_server
async def test_a_slack_signed_call_runs_as_the_person_slack_names(served: Served) -> None:
    body = _slack_tool_call("search_knowledge_base", CAROL, TEAM_ID, query=FALCON_Q)
    status, _, response = await _post(served, body, _slack_signed(body))
    assert status == 200
    result = json.loads(response)["result"]
    assert result["structuredContent"]["passages"][0]["document"] == "Project Falcon"
    rows = [r for r in _logged(served) if r["question"] == FALCON_Q and r["client"] == "slack"]
    assert rows and rows[-1]["user"] == CAROL


@on_server
async def test_a_slack_call_with_a_bad_signature_gets_401(served: Served) -> None:
    body = _slack_tool_call("search_knowledge_base", CAROL, TEAM_ID, query=FALCON_Q)
    status, headers, _ = await _post(served, body, _slack_signed(body, "wrong-signing-secret"))
    assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
    # A signature over other bytes does not carry over to a changed body.
    other = _slack_tool_call("search_knowledge_base", ALICE, TEAM_ID, query=FALCON_Q)
    status, _, _ = await _post(served, other, _slack_signed(body))
    assert status == 401


@on_server
async def test_a_token_cannot_pose_as_another_slack_person(served: Served) -> None:
    # Bob's token naming Carol in _meta.slack still runs as Bob: no Falcon.
    body = _slack_tool_call("search_knowledge_base", CAROL, TEAM_ID, query=FALCON_Q, limit=20)
    status, _, response = await _post(served, body, served.auth("bob"))
    assert status == 200
    passages = json.loads(response)["result"]["structuredContent"]["passages"]
    assert all(p["document"] != "Project Falcon" for p in passages)


@on_server
async def test_a_slack_call_from_another_workspace_is_refused(served: Served) -> None:
    body = _slack_tool_call("search_knowledge_base", CAROL, OTHER_TEAM, query=IN_DOMAIN)
    status, _, response = await _post(served, body, _slack_signed(body))
    assert status == 200
    result = json.loads(response)["result"]
    assert result["isError"] and "only members of its own Slack workspace" in json.dumps(result)


@on_server
async def test_a_slack_signed_call_naming_nobody_is_refused_as_a_tool_error(
    served: Served,
) -> None:
    listed = _rpc("tools/list")
    status, _, response = await _post(served, listed, _slack_signed(listed))
    assert status == 200 and len(json.loads(response)["result"]["tools"]) == 2
    body = _tool_call("search_knowledge_base", query=IN_DOMAIN)
    status, _, response = await _post(served, body, _slack_signed(body))
    result = json.loads(response)["result"]
    assert result["isError"] and "names no Slack person" in json.dumps(result)


# ------------------------------------------------------------------ the door, attacked


@on_server
@pytest.mark.parametrize(
    ("method", "accept"),
    [("GET", "text/event-stream"), ("DELETE", "application/json"), ("PUT", "application/json")],
)
async def test_only_post_is_served_and_a_get_for_an_event_stream_is_not_held_open(
    served: Served, method: str, accept: str
) -> None:
    headers = {**served.auth("bob"), "Accept": accept}
    timeout = aiohttp.ClientTimeout(total=20)
    async with served.http.request(method, served.mcp, headers=headers, timeout=timeout) as resp:
        assert resp.status == 405
        assert resp.headers["Allow"] == "POST"
        assert "only POST" in (await resp.json())["error"]["message"]


@on_server
@pytest.mark.parametrize("variant", ["bearer {t}", "BEARER {t}", "  Bearer   {t}  "])
async def test_the_bearer_scheme_is_read_in_any_case_and_spacing(
    served: Served, variant: str
) -> None:
    headers = {**JSON_RPC_HEADERS, "Authorization": variant.format(t=served.tokens["bob"])}
    status, _, _ = await _post(served, _rpc("tools/list"), headers)
    assert status == 200


@on_server
@pytest.mark.parametrize(
    "variant", ["Bearer{t}", "Token {t}", "Bearer {t}x", "Bearer {upper}", "Bearer {hash}"]
)
async def test_a_mangled_token_or_its_hash_gets_a_bare_401(served: Served, variant: str) -> None:
    token = served.tokens["bob"]
    digest = hashlib.sha256(token.encode()).hexdigest()
    authorization = variant.format(t=token, upper=token.upper(), hash=f"kbmcp_{digest}")
    headers = {**JSON_RPC_HEADERS, "Authorization": authorization}
    status, _, body = await _post(served, _rpc("tools/list"), headers)
    assert (status, body) == (401, b"")


@on_server
async def test_two_authorization_headers_are_refused_whichever_comes_first(
    served: Served,
) -> None:
    good, bad = f"Bearer {served.tokens['bob']}", "Bearer kbmcp_not-a-token"
    for first, second in [(good, bad), (bad, good), (good, good)]:
        headers = [("Authorization", first), ("Authorization", second), *JSON_RPC_HEADERS.items()]
        async with served.http.post(served.mcp, data=_rpc("tools/list"), headers=headers) as resp:
            assert resp.status == 401 and await resp.read() == b""


@on_server
async def test_a_bad_token_is_refused_before_its_body_arrives(served: Served) -> None:
    host, port = urlsplit(served.url).hostname, urlsplit(served.url).port
    reader, writer = await asyncio.open_connection(host, port)
    try:
        # Promises 60000 bytes, sends 10 and waits: the 401 comes without the rest.
        writer.write(
            b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer kbmcp_not-a-token\r\nContent-Length: 60000\r\n\r\n"
            b'{"jsonrpc"'
        )
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), timeout=20)
    finally:
        writer.close()
    assert status_line.startswith(b"HTTP/1.1 401")


@on_server
async def test_a_batch_is_refused_in_a_sentence(served: Served) -> None:
    batch = b"[" + _rpc("tools/list") + b"," + _rpc("tools/list", id_=2) + b"]"
    status, _, body = await _post(served, batch, served.auth("bob"))
    assert status == 400
    assert "one JSON-RPC message per request" in json.loads(body)["error"]["message"]


@on_server
@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"query": "expenses", "limit": 1000}, "less than or equal to 20"),
        ({"query": "expenses", "limit": 0}, "greater than or equal to 1"),
        ({"query": "expenses", "limit": -5}, "greater than or equal to 1"),
        ({"query": "expenses", "limit": "lots"}, "limit"),
        ({"query": 123}, "valid string"),
        ({"query": ["expenses"]}, "valid string"),
        ({}, "query"),
    ],
)
async def test_bad_tool_arguments_are_tool_errors_naming_the_argument(
    served: Served, arguments: dict[str, Any], named: str
) -> None:
    body = _tool_call("search_knowledge_base", **arguments)
    status, _, response = await _post(served, body, served.auth("bob"))
    assert status == 200
    result = json.loads(response)["result"]
    assert result["isError"] and named in result["content"][0]["text"]


@on_server
@pytest.mark.parametrize(
    "query", ["expenses\x00receipts", '" OR 1=1 -- NEAR(*) ^', "\u202eexpenses\ufeff", "経費 🧾"]
)
async def test_odd_characters_in_a_query_are_searched_as_text(served: Served, query: str) -> None:
    status, _, response = await _post(
        served, _tool_call("search_knowledge_base", query=query), served.auth("bob")
    )
    assert status == 200
    result = json.loads(response)["result"]
    assert not result["isError"]
    assert result["structuredContent"]["verdict"] in {"answerable", "related only", "nothing close"}


@on_server
@pytest.mark.parametrize(
    ("method", "listed"),
    [
        ("resources/list", "resources"),
        ("resources/templates/list", "resourceTemplates"),
        ("prompts/list", "prompts"),
    ],
)
async def test_no_resource_or_prompt_lists_a_document(
    served: Served, method: str, listed: str
) -> None:
    status, _, response = await _post(served, _rpc(method), served.auth("carol"))
    assert status == 200
    assert json.loads(response)["result"][listed] == []


@on_server
async def test_a_token_revoked_while_the_server_runs_is_refused_at_once(served: Served) -> None:
    store = Store(served.data_dir)
    try:
        token, _ = store.mcp_tokens.issue("revoked-live", user_id=BOB)
        headers = {**JSON_RPC_HEADERS, "Authorization": f"Bearer {token}"}
        status, _, _ = await _post(served, _rpc("tools/list"), headers)
        assert status == 200
        store.mcp_tokens.revoke("revoked-live")
    finally:
        store.close()
    status, _, body = await _post(served, _rpc("tools/list"), headers)
    assert (status, body) == (401, b"")


@on_server
@pytest.mark.parametrize("age_s", [301, -301])
async def test_a_slack_signature_outside_five_minutes_gets_401(served: Served, age_s: int) -> None:
    body = _slack_tool_call("search_knowledge_base", CAROL, TEAM_ID, query=FALCON_Q)
    signed = sign_slack_request(DEFAULT_SIGNING_SECRET, body, timestamp=int(time.time()) - age_s)
    status, _, response = await _post(served, body, {**signed, **JSON_RPC_HEADERS})
    assert (status, response) == (401, b"")
    # The same body signed now is served: only the timestamp was wrong.
    status, _, _ = await _post(served, body, _slack_signed(body))
    assert status == 200


@on_server
async def test_a_slack_signature_header_that_is_not_slacks_gets_401_not_500(
    served: Served,
) -> None:
    bad_timestamp = {
        **JSON_RPC_HEADERS,
        "X-Slack-Request-Timestamp": "not-a-number",
        "X-Slack-Signature": "v0=00",
    }
    status, _, _ = await _post(served, _rpc("tools/list"), bad_timestamp)
    assert status == 401
    not_utf8 = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "x": "\xff"}'
    status, _, _ = await _post(served, not_utf8, _slack_signed(not_utf8))
    assert status == 401


@on_server
async def test_no_answer_or_log_line_repeats_a_token(served: Served) -> None:
    token = served.tokens["carol"]
    requests = [
        (_rpc("tools/list"), {**JSON_RPC_HEADERS, "Authorization": f"Bearer {token}x"}),
        (_rpc("tools/list"), {**JSON_RPC_HEADERS, "Authorization": f"Basic {token}"}),
        (b"[" + _rpc("tools/list") + b"]", served.auth("carol")),
        (b'{"jsonrpc": ', served.auth("carol")),
        (_tool_call("nope"), served.auth("carol")),
        (_tool_call("search_knowledge_base", query=""), served.auth("carol")),
        (_rpc("tools/list"), {**served.auth("carol"), "Accept": "text/event-stream"}),
    ]
    answers = [await _post(served, body, headers) for body, headers in requests]
    assert [status for status, _, _ in answers] == [401, 401, 400, 400, 200, 200, 406]
    for _, response_headers, response in answers:
        assert token not in response.decode() + json.dumps(response_headers)
    served_log = served.log.read_text(encoding="utf-8", errors="replace")
    digest = hashlib.sha256(token.encode()).hexdigest()
    assert token not in served_log and digest not in served_log
    assert DEFAULT_SIGNING_SECRET not in served_log


@on_server
async def test_the_token_of_a_person_slack_has_deactivated_is_served_no_more(
    served: Served,
) -> None:
    departed = "U0GONE0001"
    served.slack.set_user(departed, deleted=True)
    store = Store(served.data_dir)
    try:
        token, _ = store.mcp_tokens.issue("departed", user_id=departed, scopes=(CHANNEL_ID,))
    finally:
        store.close()
    headers = {**JSON_RPC_HEADERS, "Authorization": f"Bearer {token}"}
    body = _tool_call("search_knowledge_base", query=FALCON_Q)
    status, _, response = await _post(served, body, headers)
    assert status == 200
    result = json.loads(response)["result"]
    assert result["isError"] and "only members of its own Slack workspace" in json.dumps(result)
    assert not any(r["user"] == departed for r in _logged(served))
