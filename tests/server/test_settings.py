"""ServerSettings and `dspark serve` flags: environment fallbacks and the one engine-config conversion."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dspark_cli.main import build_parser
from dspark_cli.serve import settings_from_args
from server.settings import ServerSettings


def _serve_args(*argv: str):
    return build_parser().parse_args(["serve", *argv])


def test_defaults_are_safe(monkeypatch):
    """Defaults: loopback bind, no key, CORS off, 15 s keep-alives."""
    for name in ("DSPARK_HOST", "DSPARK_API_KEY", "DSPARK_ALLOWED_ORIGINS", "DSPARK_PORT"):
        monkeypatch.delenv(name, raising=False)
    s = ServerSettings()
    assert (s.host, s.port, s.api_key, s.allowed_origins, s.keepalive_s) == ("127.0.0.1", 8000, None, [], 15.0)


def test_environment_is_read(monkeypatch):
    """Every setting can come from DSPARK_* variables."""
    env = {"DSPARK_MODEL": "/m", "DSPARK_DRAFTER": "/d", "DSPARK_MODE": "dflash", "DSPARK_SAMPLER": "seed-stable",
           "DSPARK_MAX_DRAFT": "3", "DSPARK_HOST": "0.0.0.0", "DSPARK_PORT": "9001", "DSPARK_API_KEY": "k",
           "DSPARK_ALLOWED_ORIGINS": "http://a, http://b", "DSPARK_MAX_QUEUE": "2", "DSPARK_KEEPALIVE_S": "5",
           "DSPARK_MAX_BODY_BYTES": "2048", "DSPARK_DRAIN_GRACE_S": "1.5"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    s = ServerSettings()
    assert (s.model, s.drafter, s.mode, s.sampler, s.max_draft) == ("/m", "/d", "dflash", "seed-stable", 3)
    assert (s.host, s.port, s.api_key, s.allowed_origins) == ("0.0.0.0", 9001, "k", ["http://a", "http://b"])
    assert (s.max_queue, s.keepalive_s, s.max_body_bytes, s.drain_grace_s) == (2, 5.0, 2048, 1.5)


def test_flags_override_environment(monkeypatch):
    """A flag wins over its environment variable; absent flags fall back to it."""
    monkeypatch.setenv("DSPARK_PORT", "9001")
    monkeypatch.setenv("DSPARK_MAX_QUEUE", "7")
    s = settings_from_args(_serve_args("--port", "9100", "--mode", "baseline", "--max-draft", "auto"))
    assert (s.port, s.max_queue, s.mode, s.max_draft) == (9100, 7, "baseline", "auto")


def test_every_flag_names_its_variable():
    """Each serve flag's help names the DSPARK_* variable it falls back to."""
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    for action in serve._actions:
        if action.option_strings and action.dest != "help":
            assert "[env DSPARK_" in (action.help or ""), action.dest


def test_to_engine_config():
    """to_engine_config carries model, spec settings and the queue bound to the engine."""
    s = ServerSettings(model="/m", drafter="/d", mode="dflash", sampler="seed-stable", max_draft=5, max_queue=3,
                       confidence_threshold=0.4, drafter_quantization="8bit")
    config = s.to_engine_config()
    assert config.model == "/m" and config.max_queue == 3
    spec = config.spec
    assert (spec.mode, spec.drafter, spec.sampler, spec.max_draft) == ("dflash", "/d", "seed-stable", 5)
    assert (spec.confidence_threshold, spec.drafter_quantization) == (0.4, "8bit")


@pytest.mark.parametrize("bad", [{"mode": "fast"}, {"max_draft": 0}, {"port": 70000}, {"max_queue": -1},
                                 {"keepalive_s": 0}, {"sampler": "greedy"}])
def test_invalid_settings_refused(bad):
    """Out-of-range or unknown settings are refused at startup."""
    with pytest.raises(ValidationError):
        ServerSettings(**bad)


def test_empty_api_key_is_none(monkeypatch):
    """An empty DSPARK_API_KEY means no key, not an empty one."""
    monkeypatch.setenv("DSPARK_API_KEY", "")
    assert ServerSettings().api_key is None


def test_base_url():
    """The printed base URL brackets IPv6 hosts."""
    assert ServerSettings(host="::1", port=8001).base_url() == "http://[::1]:8001/v1"


def test_ui_on_by_default_off_by_flag_or_environment(monkeypatch):
    """The chat page is served unless `--no-ui` or DSPARK_UI=false."""
    monkeypatch.delenv("DSPARK_UI", raising=False)
    assert ServerSettings().ui is True and settings_from_args(_serve_args()).ui is True
    assert settings_from_args(_serve_args("--no-ui")).ui is False
    monkeypatch.setenv("DSPARK_UI", "false")
    assert ServerSettings().ui is False and settings_from_args(_serve_args()).ui is False
