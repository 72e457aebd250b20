"""The chat page in headless Chromium (Debian's chromium and chromium-driver, through Selenium) against
`dspark serve` on the default model, and the page's request extensions on that real engine.

The main server runs in lookup mode, where prompt-lookup drafts are really accepted on a prompt that
repeats itself, so the page has both token origins to show. Checked: the page loads with no console
errors (and lays out in a narrow window); a message streams the answer the API gives for the same greedy
request; its tokens are coloured by origin exactly as the stream lists them; the stats panel shows the
request's `dspark_stats`; Stop cancels the request in the server (the worker frees: nothing runs and
the metrics count it cancelled); side by side, baseline and speculative give the same answer; and a
server started with `--api-key` gets its key asked for, then works.

One browser and one lookup server serve the whole module; the `--api-key` server starts only for its
test. Screenshots go to tests/artifacts/page/ (DSPARK_TEST_ARTIFACTS overrides), printed at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.real_server import ServeProcess
from tests.server.conftest import free_port

pytestmark = pytest.mark.slow

# Repeats itself, so lookup finds drafts the target accepts (as measured: 6 of 24 tokens at cap 3).
PROMPT = "Copy this list exactly: apple, banana, cherry, apple, banana, cherry, apple, banana, cherry."
MAX_TOKENS = 24
LONG_PROMPT = "Write a very long story about a lighthouse keeper, chapter by chapter."
KEY = "page-test-key"
WAIT_S = 120.0  # a hang guard for a loaded 2-core machine, not a speed bound
ARTIFACTS = Path(os.environ.get("DSPARK_TEST_ARTIFACTS", Path(__file__).resolve().parents[1] / "artifacts")) / "page"


def _chromium() -> tuple[str, str] | None:
    """(browser, driver) paths of the system Chromium, or None when either is missing."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.fixture(scope="module")
def server() -> Iterator[ServeProcess]:
    """`dspark serve --mode lookup` on the default model, for this module."""
    proc = ServeProcess(free_port(), "--mode", "lookup")
    try:
        proc.health = proc.wait_ready()
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module. Missing Chromium skips the module, except in CI (where
    scripts/bootstrap.sh installs it) where it fails."""
    paths = _chromium()
    if paths is None:
        if os.environ.get("CI"):
            pytest.fail("chromium and chromium-driver are not installed (scripts/bootstrap.sh installs them)")
        pytest.skip("no system Chromium: apt-get install chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = paths[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900",
                "--disable-gpu", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(paths[1]))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()
        print(f"\nchat page screenshots: {ARTIFACTS}")


# ---------------------------------------------------------------------------------------------- helpers

def _wait(driver, condition, timeout: float = WAIT_S):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(condition)


def _by_id(driver, element_id: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id)


def _all(driver, css: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, css)


def _open(driver, base_url: str, *, ready: bool = True) -> None:
    """Load the page fresh (a new conversation) and wait until it knows the served model."""
    driver.get(base_url + "/")
    driver.get_log("browser")  # start each page with an empty console log
    if ready:
        _wait(driver, lambda d: d.find_element("tag name", "body").get_attribute("data-ready") == "true")


def _set(driver, element_id: str, value: str) -> None:
    field = _by_id(driver, element_id)
    field.clear()
    field.send_keys(value)


def _configure(driver, max_tokens: int, origins: bool = True, compare: bool = False) -> None:
    """Open the settings and set max tokens and the two checkboxes (temperature stays 0: greedy)."""
    settings = _by_id(driver, "settings")
    if settings.get_attribute("open") is None:
        settings.find_element("tag name", "summary").click()
    _set(driver, "max-tokens", str(max_tokens))
    for element_id, wanted in (("origins", origins), ("compare", compare)):
        box = _by_id(driver, element_id)
        if box.is_selected() != wanted:
            box.click()


def _send(driver, text: str) -> None:
    """Type the message and press Enter (the keyboard path)."""
    from selenium.webdriver.common.keys import Keys

    box = _by_id(driver, "prompt")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def _wait_answered(driver) -> Any:
    """The last assistant turn, once every pane of it finished."""
    _wait(driver, lambda d: _all(d, '.msg.assistant[data-done="true"]'))
    return _all(driver, ".msg.assistant")[-1]


def _console_errors(driver) -> list[dict]:
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def _shot(driver, name: str) -> None:
    driver.save_screenshot(str(ARTIFACTS / name))


def _rendered(driver, text: str) -> str:
    """The HTML the page's own Markdown renderer makes of `text` (to compare with what it showed)."""
    return driver.execute_script("const d = document.createElement('div');"
                                 "d.appendChild(window.DsparkMarkdown.render(arguments[0])); return d.innerHTML;", text)


# Text on the page whose contrast is checked: both token colours, muted hints, labels, the send button.
CONTRAST_CHECKED = (".legend .tok-draft", ".legend .tok-target", ".hint", "#served", "label[for=prompt]", "#send",
                    ".numbers dt", "h1")
# WCAG contrast of each selector's first element: its colour against the first opaque background up its tree.
_CONTRAST_JS = """
const rgb = (s) => s.match(/[\\d.]+/g).map(Number);
const lum = (c) => { const [r, g, b] = c.slice(0, 3).map((v) => { v /= 255;
  return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); }); return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
const background = (el) => { for (; el; el = el.parentElement) { const c = rgb(getComputedStyle(el).backgroundColor);
  if (c.length < 4 || c[3] > 0) return c; } return [255, 255, 255]; };
const out = {};
for (const sel of arguments[0]) { const el = document.querySelector(sel);
  const f = lum(rgb(getComputedStyle(el).color)), b = lum(background(el));
  out[sel] = (Math.max(f, b) + 0.05) / (Math.min(f, b) + 0.05); }
return out;
"""


def _contrast(driver, selectors: tuple[str, ...]) -> dict[str, float]:
    return driver.execute_script(_CONTRAST_JS, list(selectors))


def _api_stream(base_url: str, content: str, max_tokens: int, headers: dict | None = None,
                **dspark: Any) -> dict[str, Any]:
    """The API's streamed answer to the page's request: text, token origins, stats and usage."""
    body = {"messages": [{"role": "user", "content": content}], "temperature": 0, "top_p": 1,
            "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True},
            "dspark": {"token_origins": True, **dspark}}
    out: dict[str, Any] = {"text": "", "tokens": []}
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, headers=headers, timeout=WAIT_S) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if chunk["choices"]:
                out["text"] += chunk["choices"][0]["delta"].get("content") or ""
            out["tokens"] += chunk.get("dspark_tokens", [])
            out["stats"] = chunk.get("dspark_stats", out.get("stats"))
            out["usage"] = chunk.get("usage") or out.get("usage")
    return out


def _metrics(base_url: str) -> dict[str, float]:
    """Running requests, and chat requests by outcome, from /metrics."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    out = {"running": float(re.search(r"^dspark_requests_running (\S+)$", text, re.M).group(1))}
    for outcome in ("ok", "cancelled"):
        match = re.search(rf'^dspark_requests_total{{endpoint="chat",outcome="{outcome}"}} (\S+)$', text, re.M)
        out[outcome] = float(match.group(1)) if match else 0.0
    return out


# ---------------------------------------------------------------------------------------------- tests

def test_token_origins_on_the_real_engine(server):
    """No browser: off by default no chunk carries `dspark_tokens`; on, they list every generated token
    (as many as `completion_tokens`) and the drafts among them are `dspark_stats`' accepted tokens, which
    lookup really produced; `dspark.baseline` gives the same greedy text with no drafts at all."""
    body = {"messages": [{"role": "user", "content": PROMPT}], "temperature": 0, "max_tokens": MAX_TOKENS,
            "stream": True}
    plain = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=WAIT_S)
    assert plain.status_code == 200 and "dspark_tokens" not in plain.text
    spec = _api_stream(server.base_url, PROMPT, MAX_TOKENS)
    assert len(spec["tokens"]) == spec["usage"]["completion_tokens"] == spec["stats"]["generated_tokens"]
    drafts = [t for t in spec["tokens"] if t["origin"] == "draft"]
    assert len(drafts) == spec["stats"]["accepted_tokens"] > 0 and spec["stats"]["mode"] == "lookup"
    assert "".join(t["text"] for t in spec["tokens"]).startswith(spec["text"])
    base = _api_stream(server.base_url, PROMPT, MAX_TOKENS, baseline=True)
    assert base["text"] == spec["text"] and base["stats"]["mode"] == "baseline"
    assert base["stats"]["drafted_tokens"] == 0 and {t["origin"] for t in base["tokens"]} == {"target"}


def test_page_loads_without_console_errors(browser, server):
    """The page loads from the server alone, says what is served and logs no console error; its text
    (tokens of both origins, hints, labels, the send button) has at least 4.5:1 contrast; in a narrow
    window the stats panel moves below the chat."""
    _open(browser, server.base_url)
    assert "lookup" in _by_id(browser, "served").text
    assert _console_errors(browser) == []
    _shot(browser, "loaded.png")
    ratios = _contrast(browser, CONTRAST_CHECKED)
    assert all(ratio >= 4.5 for ratio in ratios.values()), ratios  # WCAG AA for normal text
    try:
        browser.set_window_size(420, 900)
        chat, stats = _all(browser, ".chat")[0], _all(browser, ".stats")[0]
        _wait(browser, lambda d: stats.rect["y"] >= chat.rect["y"] + chat.rect["height"])
        _shot(browser, "narrow.png")
    finally:
        browser.set_window_size(1280, 900)


@pytest.fixture(scope="module")
def answered(browser, server) -> dict[str, Any]:
    """One greedy message through the page (tokens coloured by origin), and the same request through
    the API: what both showed."""
    _open(browser, server.base_url)
    _configure(browser, MAX_TOKENS)
    _send(browser, PROMPT)
    turn = _wait_answered(browser)
    page = {
        "answer_html": turn.find_element("css selector", ".answer").get_attribute("innerHTML"),
        "tokens": [(span.get_attribute("textContent"), span.get_attribute("class"))
                   for span in turn.find_elements("css selector", ".tokens .tok")],
        "panel": {element_id: (_by_id(browser, element_id).get_attribute("data-value"), _by_id(browser, element_id).text)
                  for element_id in ("stat-tps", "stat-tau", "stat-cap", "stat-mode", "stat-tokens", "stat-accepted",
                                     "stat-rounds", "stat-prefill", "stat-draft", "stat-verify", "stat-other")},
        "bars": [float(bar.get_attribute("data-rate")) for bar in _all(browser, "#accept-chart .bar")],
        "raw": json.loads(_by_id(browser, "raw-stats").get_attribute("textContent")),
        "console": _console_errors(browser),
    }
    _shot(browser, "answer.png")
    api = _api_stream(server.base_url, PROMPT, MAX_TOKENS)
    # What the page's own renderer makes of the API's text, for comparison with what it showed.
    api["answer_html"] = _rendered(browser, api["text"])
    return {"page": page, "api": api}


def test_message_streams_the_apis_greedy_answer(answered):
    """The answer the page streamed is the API's greedy answer to the same request."""
    page, api = answered["page"], answered["api"]
    assert api["text"].strip() and page["answer_html"] == api["answer_html"]
    visible = "".join(text for text, _ in page["tokens"][: api["usage"]["completion_tokens"]])
    assert visible.startswith(api["text"])  # the token pieces spell the text (an EOS piece may follow)
    assert page["console"] == []


def test_every_token_coloured_by_origin_as_streamed(answered):
    """With the origin extension on, the page shows one coloured token per generated token, with the
    text and origin the stream gives; the drafts among them are `dspark_stats`' accepted tokens."""
    page, api = answered["page"], answered["api"]
    expected = [(t["text"], f"tok tok-{t['origin']}") for t in api["tokens"]]
    assert page["tokens"] == expected
    assert len(page["tokens"]) == api["usage"]["completion_tokens"] == api["stats"]["generated_tokens"]
    drafts = sum(cls == "tok tok-draft" for _, cls in page["tokens"])
    assert drafts == api["stats"]["accepted_tokens"] > 0  # lookup really drafted on this prompt


def test_stats_panel_shows_dspark_stats(answered):
    """Every number in the panel is the request's `dspark_stats` value, formatted: the deterministic
    ones equal the API's for the same greedy request, the timings equal those the stream carried."""
    page, api = answered["page"], answered["api"]
    raw, stats, panel = page["raw"], api["stats"], page["panel"]
    for key in ("mode", "cap", "rounds", "generated_tokens", "drafted_tokens", "accepted_tokens",
                "mean_accepted_length", "acceptance_by_position"):
        assert raw[key] == stats[key], key
    assert page["bars"] == stats["acceptance_by_position"]

    def shown(element_id: str) -> tuple[str, str]:
        return panel[element_id]

    assert shown("stat-mode") == ("lookup", "lookup")
    assert shown("stat-cap") == (str(stats["cap"]), str(stats["cap"]))
    assert shown("stat-tokens") == (str(stats["generated_tokens"]),) * 2
    assert shown("stat-rounds") == (str(stats["rounds"]),) * 2
    assert shown("stat-accepted")[1] == f"{stats['accepted_tokens']} of {stats['drafted_tokens']}"
    assert float(shown("stat-tau")[0]) == stats["mean_accepted_length"]
    assert shown("stat-tau")[1] == f"{stats['mean_accepted_length']:.2f}"
    assert float(shown("stat-tps")[0]) == raw["tokens_per_s"] and shown("stat-tps")[1] == f"{raw['tokens_per_s']:.1f}"
    for element_id, seconds in (("stat-prefill", raw["time_prefill_s"]), ("stat-draft", raw["time_draft_s"]),
                                ("stat-verify", raw["time_verify_s"]),
                                ("stat-other", raw["time_accept_s"] + raw["time_other_s"])):
        assert float(shown(element_id)[0]) == pytest.approx(seconds, abs=1e-9), element_id
        assert shown(element_id)[1] == f"{seconds * 1000:.1f} ms", element_id


def test_stop_cancels_the_request_on_the_server(browser, server):
    """Stop (here the Escape key) aborts the stream; the server cancels the request: nothing runs any
    more and the metrics count one more cancelled chat request and no finished one. Regenerate then
    replaces the stopped answer."""
    from selenium.webdriver.common.keys import Keys

    _open(browser, server.base_url)
    _configure(browser, 4000)
    before = _metrics(server.base_url)
    _send(browser, LONG_PROMPT)
    _wait(browser, lambda d: len(_all(d, ".tokens .tok")) >= 3)  # streaming has begun
    assert _metrics(server.base_url)["running"] == 1
    _by_id(browser, "prompt").send_keys(Keys.ESCAPE)
    _wait(browser, lambda d: _all(d, '.pane[data-state="stopped"]'))
    _wait(browser, lambda d: _metrics(server.base_url)["running"] == 0)
    after = _metrics(server.base_url)
    assert after["cancelled"] == before["cancelled"] + 1 and after["ok"] == before["ok"]
    assert not _by_id(browser, "send").get_attribute("disabled")  # the page is ready for the next message
    _shot(browser, "stopped.png")
    # Regenerate replaces the stopped answer with a new one (shorter here).
    _set(browser, "max-tokens", "4")
    _by_id(browser, "regenerate").click()
    _wait_answered(browser)
    assert len(_all(browser, ".msg.assistant")) == 1 and len(_all(browser, ".msg.user")) == 1


def test_side_by_side_baseline_and_speculative(browser, server):
    """Side by side, the same prompt decodes as a per-request baseline (no drafts at all) and in the
    server's mode: the same greedy answer, both speeds shown."""
    _open(browser, server.base_url)
    _configure(browser, MAX_TOKENS, compare=True)
    _send(browser, PROMPT)
    turn = _wait_answered(browser)
    panes = turn.find_elements("css selector", ".pane")
    assert [p.get_attribute("data-kind") for p in panes] == ["baseline", "speculative"]
    answers = [p.find_element("css selector", ".answer").get_attribute("innerHTML") for p in panes]
    assert answers[0] == answers[1]
    origins = [[s.get_attribute("class") for s in p.find_elements("css selector", ".tokens .tok")] for p in panes]
    assert "tok tok-draft" not in origins[0] and "tok tok-draft" in origins[1]
    assert "mode baseline" in panes[0].text and "mode lookup" in panes[1].text
    assert re.search(r"baseline [\d.]+ tokens/s · speculative [\d.]+ tokens/s", turn.text)
    _shot(browser, "side-by-side.png")


def test_api_key_is_asked_for_then_used(browser):
    """Against `--api-key`, the page asks for the key (a wrong one is refused), keeps it in the tab's
    session storage only, and answers once it has the right one, over two turns of a conversation."""
    proc = ServeProcess(free_port(), "--api-key", KEY)
    try:
        proc.wait_ready()
        _open(browser, proc.base_url, ready=False)
        _wait(browser, lambda d: _by_id(d, "key-dialog").get_attribute("open") is not None)
        _shot(browser, "api-key.png")
        for key in ("wrong-key", KEY):
            _set(browser, "key", key)
            _by_id(browser, "key-submit").click()
            if key != KEY:
                _wait(browser, lambda d: _by_id(d, "key-error").is_displayed())
        _wait(browser, lambda d: d.find_element("tag name", "body").get_attribute("data-ready") == "true")
        assert browser.execute_script("return sessionStorage.getItem('dspark-api-key')") == KEY
        assert browser.execute_script("return localStorage.length") == 0
        _configure(browser, 8)
        # Two turns: the second answer is the API's greedy answer to the whole conversation so far.
        messages: list[dict[str, str]] = []
        for n, question in enumerate(("Say hello.", "Now say goodbye."), start=1):
            _send(browser, question)
            _wait(browser, lambda d, n=n: len(_all(d, '.msg.assistant[data-done="true"]')) == n)
            messages.append({"role": "user", "content": question})
            reply = httpx.post(f"{proc.base_url}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                               json={"messages": messages, "temperature": 0, "top_p": 1, "max_tokens": 8},
                               timeout=WAIT_S).json()["choices"][0]["message"]["content"]
            messages.append({"role": "assistant", "content": reply})
            shown = _all(browser, ".msg.assistant .answer")[-1].get_attribute("innerHTML")
            assert reply.strip() and shown == _rendered(browser, reply)
    finally:
        proc.stop()


def test_markdown_is_rendered_without_html(browser, server):
    """Model text is never markup: tags stay text, only http(s) links become links, code stays code."""
    _open(browser, server.base_url)
    text = ("# Title\n<script>window.pwned = 1</script> **bold** and `<b>code</b>`\n"
            "<img src=x onerror=\"window.pwned = 1\">\n- [bad](javascript:alert(1)) [good](https://example.org/)\n"
            "```html\n<i>kept as text</i>\n```")
    html = _rendered(browser, text)
    assert "<script" not in html and "<img" not in html and "<i>" not in html
    assert "&lt;script&gt;" in html and "&lt;img" in html and "&lt;i&gt;kept as text&lt;/i&gt;" in html
    assert '<a href="https://example.org/"' in html and 'href="javascript' not in html and "[bad](javascript:" in html
    assert "<strong>bold</strong>" in html and "<code>&lt;b&gt;code&lt;/b&gt;</code>" in html and "<h3>" in html
    assert browser.execute_script("return window.pwned") is None


def test_tool_calls_are_shown(browser, server):
    """With tools given in the settings and `tool_choice: required` (a call forced by the grammar, as
    this model does not call tools on its own), the streamed call is shown with its name and arguments."""
    from selenium.webdriver.support.ui import Select

    _open(browser, server.base_url)
    _configure(browser, 64, origins=False)  # room for the whole call, however the grammar lets it space its JSON
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
        "additionalProperties": False}}}
    _set(browser, "tools", json.dumps([tool]))
    Select(_by_id(browser, "tool-choice")).select_by_value("required")
    _send(browser, "What is the weather in Paris?")
    turn = _wait_answered(browser)
    _shot(browser, "tool-call.png")  # before the checks: also when one fails
    call = turn.find_element("css selector", ".tool-call")
    assert "Tool call: get_weather" in call.text and json.loads(call.find_element("tag name", "pre").text) == {
        "city": "Paris"}
    assert _console_errors(browser) == []
