"""The web page in a real browser: Debian's headless Chromium driven by Selenium, against a real
`vsurge serve` of the default model that requires an API key (so the page's key prompt is exercised too).

VSURGE_SCREENSHOTS=DIR also saves chat.png and dashboard.png there (docs/web.md's pictures are those files in docs/).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from server_process import DEFAULT_SERVER_ARGS, ENV, ServerProcess

try:
    from selenium import webdriver
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # pragma: no cover: reported by the skip below
    webdriver = None

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
NO_BROWSER = ("needs selenium (pip install -e '.[test]') and Debian's chromium + chromium-driver "
              "(apt-get install chromium chromium-driver; `make test` tries to install them)")

API_KEY = "sk-web-test"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MODEL = "SmolLM2-135M-Instruct"


# ---------------------------------------------------------------- fixtures and helpers
@pytest.fixture(scope="module")
def server(cache_dir):
    cache = cache_dir  # the suite's default server arguments: its compiled programs come from the shared cache
    proc = ServerProcess("default", "--api-key", API_KEY, *DEFAULT_SERVER_ARGS, cache_dir=cache)
    proc.wait_ready()
    yield proc
    assert proc.stop() == 0


def start_chromium():
    """Headless Chromium (quit it when done); the caller's test skips, with the reason, where it is not
    installed or does not start."""
    if webdriver is None or not CHROMIUM or not CHROMEDRIVER:
        pytest.skip(NO_BROWSER)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,800", "--force-device-scale-factor=1"):
        options.add_argument(arg)
    try:
        return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    except WebDriverException as exc:
        pytest.skip(f"chromium did not start: {exc.msg}")


@pytest.fixture(scope="module")
def browser():
    driver = start_chromium()
    yield driver
    driver.quit()


def screenshot(driver, tmp_path: Path, name: str) -> None:
    driver.save_screenshot(str(tmp_path / name))
    if os.environ.get("VSURGE_SCREENSHOTS"):
        folder = Path(os.environ["VSURGE_SCREENSHOTS"])
        folder.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(folder / name))


def wait(driver, condition, timeout=30, message=""):
    """Poll `condition`; an element replaced by a redraw while it was read counts as "not yet"."""
    return WebDriverWait(driver, timeout, poll_frequency=0.1,
                         ignored_exceptions=(StaleElementReferenceException,)).until(condition, message)


def stats(server) -> dict:
    return server.get("/v1/stats", headers=AUTH).json()["models"][0]


def wait_for(predicate, timeout=30, message="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {message}")


def open_page(driver, server, path="/"):
    """Opens a page with the key already saved and an empty conversation."""
    driver.get(server.base + path)
    driver.execute_script("localStorage.clear(); localStorage.setItem('vsurge.apiKey', arguments[0]);", API_KEY)
    driver.get(server.base + path)
    if path == "/":
        wait(driver, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-models") == "1",
             message="the model list")


def field(driver, element_id: str, value: str) -> None:
    element = driver.find_element(By.ID, element_id)
    element.clear()
    if value:
        element.send_keys(value)


def ask(driver, text: str) -> None:
    field(driver, "prompt", text)
    driver.find_element(By.ID, "send").click()


def idle(driver):
    return driver.find_element(By.TAG_NAME, "body").get_attribute("data-state") == "idle"


def assistant_text(driver) -> str:
    bubbles = driver.find_elements(By.CSS_SELECTOR, "#conversation .message.assistant .body")
    return bubbles[-1].text if bubbles else ""


# ---------------------------------------------------------------- routes, key, URL
def test_pages_are_open_and_stats_need_the_key(server):
    assert "chat page and dashboard: " + server.base + "/" in server.output  # the serving line names the page
    for path, kind in (("/", "text/html"), ("/dashboard", "text/html"), ("/static/chat.js", "javascript"),
                       ("/static/style.css", "text/css")):
        r = server.get(path)
        assert r.status_code == 200 and kind in r.headers["content-type"], path
    missing = server.get("/static/missing.js")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "invalid_request_error"
    r = server.get("/v1/stats")
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert server.get("/v1/stats", headers=AUTH).status_code == 200
    assert "/v1/stats" in server.get("/openapi.json", headers=AUTH).json()["paths"]


def test_page_asks_for_the_key_then_lists_the_models(browser, server):
    browser.get(server.base + "/")
    browser.execute_script("localStorage.clear();")
    browser.get(server.base + "/")
    dialog = wait(browser, lambda d: d.find_element(By.ID, "key-dialog").is_displayed() and
                  d.find_element(By.ID, "key-dialog"), message="the key dialog")
    assert "API key" in dialog.text
    browser.find_element(By.ID, "api-key").send_keys(API_KEY)
    dialog.find_element(By.CSS_SELECTOR, "button").click()
    wait(browser, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-models") == "1")
    options = [o.get_attribute("value") for o in browser.find_elements(By.CSS_SELECTOR, "#model option")]
    assert options == [MODEL]
    assert browser.execute_script("return localStorage.getItem('vsurge.apiKey')") == API_KEY

    # a wrong key when sending: the page asks again, then sends the same question with the new key
    browser.execute_script("localStorage.setItem('vsurge.apiKey', 'sk-wrong')")
    field(browser, "temperature", "0")
    field(browser, "max-tokens", "8")
    ask(browser, "What is the capital of France?")
    wait(browser, lambda d: d.find_element(By.ID, "key-dialog").is_displayed(), message="the key dialog again")
    assert not browser.find_elements(By.CSS_SELECTOR, "#conversation .message")  # the failed try is not kept
    browser.find_element(By.ID, "api-key").send_keys(API_KEY)
    browser.find_element(By.CSS_SELECTOR, "#key-dialog button").click()
    wait(browser, lambda d: idle(d) and "Paris" in assistant_text(d), timeout=60, message="the answer")
    assert not error_messages(browser)


# ---------------------------------------------------------------- chat
def test_answer_streams_token_by_token_and_survives_a_reload(browser, server, tmp_path):
    open_page(browser, server)
    field(browser, "temperature", "0")
    # every change of the answer's text length, as the page renders it
    browser.execute_script("""
        window.lengths = [];
        new MutationObserver(() => {
          const bodies = document.querySelectorAll('#conversation .message.assistant .body');
          if (bodies.length) window.lengths.push(bodies[bodies.length - 1].textContent.length);
        }).observe(document.getElementById('conversation'), {childList: true, subtree: true, characterData: true});
    """)
    ask(browser, "What is the capital of France?")
    polled = []
    wait(browser, lambda d: polled.append(len(assistant_text(d))) or idle(d), timeout=60, message="the answer")
    assert "Paris" in assistant_text(browser)
    lengths = [n for n in browser.execute_script("return window.lengths") if n]
    # it grew, chunk by chunk: the 8 tokens in at least two (a prompt an earlier test left in the prefix
    # cache goes straight to decode steps of several tokens each, with no one-token prefill step first)
    assert len(set(lengths)) >= 2 and lengths == sorted(lengths), lengths
    assert max(polled) > 0
    meta = browser.find_elements(By.CSS_SELECTOR, "#conversation .message.assistant .meta")[-1].text
    assert "8 tokens" in meta and "tok/s" in meta

    # a second question whose answer has code: rendered as a code block
    field(browser, "max-tokens", "60")
    ask(browser, "Write a Python function that adds two numbers.")
    wait(browser, idle, timeout=60)
    assert browser.find_elements(By.CSS_SELECTOR, "#conversation .message.assistant pre code")
    screenshot(browser, tmp_path, "chat.png")

    browser.refresh()  # the conversation is kept in localStorage
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#conversation .message")) == 4)
    assert "Paris" in browser.find_element(By.ID, "conversation").text
    browser.find_element(By.ID, "new-chat").click()
    assert not browser.find_elements(By.CSS_SELECTOR, "#conversation .message")
    assert browser.execute_script("return localStorage.getItem('vsurge.conversation')") == "[]"


def test_stop_cancels_the_request_and_frees_the_slot(browser, server):
    open_page(browser, server)
    field(browser, "temperature", "0")
    field(browser, "max-tokens", "400")
    ask(browser, "Write a long story about a dragon.")
    first = wait(browser, lambda d: len(assistant_text(d)) > 10 and len(assistant_text(d)), timeout=60,
                 message="the story to start")
    wait(browser, lambda d: len(assistant_text(d)) > first, message="the story to grow")
    assert stats(server)["running"] == 1
    browser.find_element(By.ID, "stop").click()
    wait(browser, idle, timeout=10, message="the page to stop")
    wait_for(lambda: stats(server)["running"] == 0, timeout=15, message="the server to free the slot")
    meta = browser.find_elements(By.CSS_SELECTOR, "#conversation .message.assistant .meta")[-1].text
    assert "stopped" in meta
    stopped_at = len(assistant_text(browser))
    time.sleep(0.5)
    assert len(assistant_text(browser)) == stopped_at  # nothing arrives after stop


def error_messages(driver) -> list[str]:
    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#conversation .message.error")]


def test_bad_parameters_show_the_servers_error(browser, server):
    open_page(browser, server)
    field(browser, "temperature", "-1")
    ask(browser, "Hello")
    wait(browser, lambda d: error_messages(d), timeout=30, message="an error message")
    assert "temperature" in error_messages(browser)[-1] and "HTTP 400" in error_messages(browser)[-1]
    assert browser.find_elements(By.CSS_SELECTOR, "#conversation .message.user.failed")

    field(browser, "temperature", "0")
    field(browser, "max-tokens", "0")
    ask(browser, "Hello")
    wait(browser, lambda d: len(error_messages(d)) == 2, timeout=30)
    assert "max_tokens" in error_messages(browser)[-1]

    # the JSON schema box: not JSON -> the page says so and sends nothing
    field(browser, "max-tokens", "8")
    field(browser, "schema", "{not json")
    ask(browser, "Hello")
    wait(browser, lambda d: len(error_messages(d)) == 3, timeout=10)
    assert "not hold valid JSON" in error_messages(browser)[-1]
    assert browser.find_element(By.ID, "prompt").get_attribute("value") == "Hello"  # kept for a retry

    # valid JSON -> sent as response_format; whatever the server answers is shown
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    field(browser, "schema", json.dumps(schema))
    browser.execute_script("""
        const original = window.fetch;
        window.fetch = (url, init) => {
          if (String(url).includes('chat/completions')) window.lastBody = JSON.parse(init.body);
          return original(url, init);
        };
    """)
    ask(browser, "Hello")
    wait(browser, idle, timeout=60)
    sent = browser.execute_script("return window.lastBody")
    format_ = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    assert sent["response_format"] == format_
    whole = {k: v for k, v in sent.items() if k != "stream_options"}
    direct = server.post("/v1/chat/completions", headers=AUTH, json={**whole, "stream": False})
    if direct.status_code != 200:  # the server refused it: the page shows the same error
        wait(browser, lambda d: len(error_messages(d)) == 4, timeout=10)
        assert direct.json()["error"]["message"] in error_messages(browser)[-1]


def test_an_error_inside_the_stream_is_shown_after_the_partial_answer(browser, server):
    """A stream that fails after its first byte ends with `data: {"error": ...}` (generation.event_stream).
    The real server cannot be made to fail on demand, so the page's fetch gets that body here, cut at
    awkward places (inside an event, between \\r and \\n) to exercise the page's event parser too."""
    open_page(browser, server)
    browser.execute_script("""
        const events = 'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\\r\\n\\r\\n' +
          'data: {"choices":[{"index":0,"delta":{"content":"Half an "}}]}\\n\\n' +
          'data: {"choices":[{"index":0,"delta":{"content":"answer"}}]}\\n\\n' +
          'data: {"error":{"message":"generation failed: the decode thread crashed","type":"InternalServerError",' +
          '"param":null,"code":500}}\\n\\ndata: [DONE]\\n\\n';
        const bytes = new TextEncoder().encode(events);
        const cuts = [5, 74, 76, 100, 140, 190, bytes.length];  // 74: between CR and LF; 76: inside CRLF CRLF
        const original = window.fetch;
        window.fetch = (url, init) => {
          if (!String(url).includes('chat/completions')) return original(url, init);
          let start = 0;
          const body = new ReadableStream({pull(controller) {
            const end = cuts.shift();
            controller.enqueue(bytes.slice(start, end));
            start = end;
            if (start >= bytes.length) controller.close();
          }});
          return Promise.resolve(new Response(body, {headers: {'Content-Type': 'text/event-stream'}}));
        };
    """)
    ask(browser, "Hello")
    wait(browser, lambda d: error_messages(d), timeout=10, message="the in-stream error")
    assert "generation failed: the decode thread crashed" in error_messages(browser)[-1]
    assert assistant_text(browser) == "Half an answer"  # what came before the error stays
    assert idle(browser)


INJECTIONS = ['<script>window.pwned = "script"</script>', '<img src=x onerror="window.pwned = \'img\'">']


def test_html_in_messages_stays_text(browser, server):
    open_page(browser, server)
    field(browser, "max-tokens", "4")
    user_text = " and ".join(INJECTIONS)
    ask(browser, user_text)  # the user bubble, through the page's own send path
    wait(browser, idle, timeout=60)
    reply = ("# Title <img src=x onerror=\"window.pwned = 'h1'\">\n\n"
             "Some **bold <script>window.pwned = 'b'</script>** and `<img src=x onerror=alert(1)>` and *it*.\n\n"
             "- item <b onmouseover=\"window.pwned = 'li'\">one</b>\n- item two\n\n"
             "```html\n" + INJECTIONS[1] + "\n```\n\n" + INJECTIONS[0])
    browser.execute_script("window.vsurge.renderAssistant(arguments[0])", reply)  # what streaming calls per chunk
    conversation = browser.find_element(By.ID, "conversation")
    for tag in ("script", "img", "b"):
        assert not conversation.find_elements(By.TAG_NAME, tag), tag
    assert browser.execute_script("return window.pwned") is None
    text = conversation.text
    assert user_text in text and INJECTIONS[0] in text and INJECTIONS[1] in text
    # the Markdown subset was rendered, with the tags inside it as text
    assert conversation.find_element(By.CSS_SELECTOR, ".message.assistant h1").text.startswith("Title <img")
    assert "<script>" in conversation.find_element(By.CSS_SELECTOR, ".message.assistant strong").text
    assert len(conversation.find_elements(By.CSS_SELECTOR, ".message.assistant ul li")) == 2
    assert conversation.find_elements(By.CSS_SELECTOR, ".message.assistant em")
    codes = [c.text for c in conversation.find_elements(By.CSS_SELECTOR, ".message.assistant code")]
    assert "<img src=x onerror=alert(1)>" in codes and INJECTIONS[1] in codes

    browser.refresh()  # restored from localStorage: rendered as text again
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#conversation .message.user"))
    conversation = browser.find_element(By.ID, "conversation")
    assert not conversation.find_elements(By.TAG_NAME, "script") and not conversation.find_elements(By.TAG_NAME, "img")
    assert user_text in conversation.text and browser.execute_script("return window.pwned") is None


# ---------------------------------------------------------------- dashboard
def tile(driver, name: str) -> str:
    return driver.find_element(By.CSS_SELECTOR, f"#model-0 .tile[data-tile={name}] .value").text


def test_dashboard_follows_eight_running_requests(browser, server, tmp_path):
    open_page(browser, server, "/dashboard")
    wait(browser, lambda d: int(d.find_element(By.TAG_NAME, "body").get_attribute("data-updates") or 0) >= 2,
         message="two polls of /v1/stats")
    assert browser.find_element(By.CSS_SELECTOR, "#model-0").get_attribute("data-model") == MODEL
    finished_before = int(tile(browser, "finished"))
    chart = browser.find_element(By.ID, "model-0-toks")
    client = openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0)

    def one(i):
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Tell me a story about the number {i}."}],
            max_tokens=96, temperature=0.5, seed=i, extra_body={"ignore_eos": True})

    def updates(driver) -> int:
        return int(driver.find_element(By.TAG_NAME, "body").get_attribute("data-updates"))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(one, i) for i in range(8)]
        wait(browser, lambda d: tile(d, "running") == "8", timeout=60, message="8 running requests")
        wait(browser, lambda d: (json.loads(chart.get_attribute("data-latest") or "{}").get("toks") or 0) > 0,
             timeout=30, message="tokens per second above 0")
        path = wait(browser, lambda d: chart.find_element(By.CSS_SELECTOR, "path[data-series=toks]").get_attribute("d"),
                    timeout=10, message="the tok/s chart's line")
        wait(browser, lambda d: chart.find_element(By.CSS_SELECTOR, "path[data-series=toks]").get_attribute("d")
             != path, timeout=10, message="the tok/s chart to move")
        seen = updates(browser)
        wait(browser, lambda d: updates(d) >= seen + 2, timeout=10)  # a few more points for the picture
        screenshot(browser, tmp_path, "dashboard.png")
        replies = [f.result(timeout=120) for f in futures]
    assert all(r.usage.completion_tokens == 96 for r in replies)
    wait(browser, lambda d: tile(d, "running") == "0", timeout=15)
    wait(browser, lambda d: int(tile(d, "finished")) == finished_before + 8, timeout=15)
    assert tile(browser, "ttft") != "– / –"
    # the page's percentile estimate is the server's
    s = stats(server)
    page_p90 = browser.execute_script("return window.vsurgeDashboard.bucketQuantile(0.9, arguments[0], arguments[1])",
                                      s["ttft"]["bucket_bounds"], s["ttft"]["bucket_counts"])
    assert page_p90 == pytest.approx(s["ttft"]["p90"])


def model_rows(driver) -> dict:
    """The dashboard's Models table, read at once (one poll's rendering): model -> {column: text}."""
    return driver.execute_script("""
        return Object.fromEntries([...document.querySelectorAll('#model-table tbody tr')].map((row) => [
          row.dataset.model, Object.fromEntries([...row.cells].map((c) => [c.dataset.col, c.innerText]))]));
    """)


def row_cells(driver, model: str) -> dict:
    return model_rows(driver).get(model, {})


def test_dashboard_lists_the_model_with_its_memory(browser, server):
    open_page(browser, server, "/dashboard")
    row = wait(browser, lambda d: row_cells(d, MODEL), message="the model's row")
    s = stats(server)
    total = s["weight_bytes"] + s["kv_cache_bytes"] + s["state_cache_bytes"]
    human = browser.execute_script("return window.vsurgeDashboard.formatBytes(arguments[0])", total)
    assert row["state"] == "loaded" and row["memory"] == human and total > 0
    assert row["memory"].split()[1] in ("KiB", "MiB", "GiB") and float(row["memory"].split()[0]) > 0
    assert row["weights"] == browser.execute_script("return window.vsurgeDashboard.formatBytes(arguments[0])",
                                                    s["weight_bytes"])
    assert (row["loads"], row["load"]) == ("–", "–")  # one model, no router: loaded once, at start-up
    assert tile(browser, "memory") == human
    assert "weights" in browser.find_element(By.CSS_SELECTOR, "#model-0 .tile[data-tile=memory] .detail").text
    assert not browser.find_element(By.CSS_SELECTOR, "#model-0 .adapters").is_displayed()  # no LoRA here
    assert browser.execute_script("return window.vsurgeDashboard.formatBytes(730460160)") == "696.6 MiB"


def test_dashboard_follows_a_catalog_and_adapters(browser, server):
    """A multi-model server's /v1/stats, made from this server's by the page's fetch (a catalog, adapters,
    the model unloaded and loaded again), with names that are HTML: the rows and panels follow, as text."""
    open_page(browser, server, "/dashboard")
    wait(browser, lambda d: row_cells(d, MODEL), message="the model's row")
    evil = INJECTIONS[1]
    browser.execute_script("""
        const [model, evil] = arguments;
        window.unloaded = false;
        const original = window.fetch;
        window.fetch = async (url, init) => {
          const response = await original(url, init);
          if (!String(url).includes('v1/stats')) return response;
          const stats = await response.json();
          stats.catalog = [
            {id: model, state: window.unloaded ? 'unloaded' : 'loaded', path: '/models/m', loads: 2, load_seconds: 1.5},
            {id: 'other', state: 'unloaded', path: '/models/o', loads: 1, load_seconds: 0.25, memory_bytes: 3 << 20},
            {id: evil, state: 'failed', path: evil, loads: 0, load_seconds: null, error: 'bad file ' + evil}];
          if (window.unloaded) stats.models = [];
          stats.adapters = {[model]: {[evil]: 2, plain: 0}};
          return new Response(JSON.stringify(stats), {headers: {'Content-Type': 'application/json'}});
        };
    """, MODEL, evil)
    wait(browser, lambda d: row_cells(d, "other"), message="the catalog's rows")
    rows = [r.get_attribute("data-model") for r in browser.find_elements(By.CSS_SELECTOR, "#model-table tbody tr")]
    assert rows == [MODEL, "other", evil]
    mine, other, failed = (row_cells(browser, name) for name in rows)
    assert (mine["state"], mine["loads"], mine["load"]) == ("loaded", "2", "1.50 s") and mine["memory"] != "–"
    assert (other["state"], other["memory"], other["weights"]) == ("unloaded", "3.0 MiB", "–")
    assert failed["state"] == f"failed\nbad file {evil}" and failed["memory"] == "–"
    chips = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#model-0 .adapters .adapter"),
                 message="the adapters")
    assert sorted(c.text for c in chips) == sorted([f"{evil} · 2 running", "plain · 0 running"])
    page = browser.find_element(By.TAG_NAME, "main")
    assert not page.find_elements(By.TAG_NAME, "img") and browser.execute_script("return window.pwned") is None

    browser.execute_script("window.unloaded = true")  # unloaded: its panel goes, its row stays
    wait(browser, lambda d: not d.find_elements(By.CSS_SELECTOR, "#models .model-panel"), timeout=10,
         message="the panel to go")
    assert row_cells(browser, MODEL)["state"] == "unloaded" and row_cells(browser, MODEL)["memory"] == "–"
    browser.execute_script("window.unloaded = false")  # loaded again: a new panel, charts from scratch
    panel = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#models .model-panel"), timeout=10,
                 message="the panel to come back")
    assert len(panel) == 1 and panel[0].get_attribute("data-model") == MODEL
    assert panel[0].get_attribute("id") != "model-0"  # a fresh id: never two panels with one
    wait(browser, lambda d: row_cells(d, MODEL)["state"] == "loaded", timeout=10)


# ---------------------------------------------------------------- /v1/stats' memory
def resident_bytes(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, bytes, as this test reads them (not as the server does)."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: int(v.split()[0]) * 1024 for k, _, v in (line.partition(":") for line in lines) if k in ("VmRSS", "VmHWM")}


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_stats_memory_parts_add_up_to_the_servers_resident_memory(server):
    """Each part is measured on its own (the weights, KV pool and states by their bytes, the runtime, loading
    and programs by the resident set's growth while they were made, serving by its growth since ready): each is
    positive, and together they come within 15% of the resident set that this test reads from /proc. A part
    counted twice, or a copy of the weights that no part names, would break the sum. (The sum first missed by
    15.7% in a full run, where the module's server had grown 0.15 GB serving the file's earlier tests.)"""
    body = server.get("/v1/stats", headers=AUTH).json()
    memory, model = body["memory"], body["models"][0]
    seen = resident_bytes(server.proc.pid)
    parts = memory["parts"]
    # no recurrent layers here; `serving` is 0 until the server has served (the tests' order decides)
    assert {k for k, v in parts.items() if not v} - {"serving"} == {"recurrent_states"}, parts
    assert parts["serving"] is not None
    assert (parts["weights"], parts["kv_pool"]) == (model["weight_bytes"], model["kv_cache_bytes"])
    assert sum(memory["weights_by_format"].values()) == parts["weights"]
    assert set(memory["weights_by_format"]) >= {"q4_1", "float32"}  # the default model's file: Q4_1 blocks
    assert memory["jax_arrays_bytes"] >= parts["weights"] + parts["kv_pool"]
    assert abs(memory["rss_bytes"] - seen["VmRSS"]) < 0.05 * seen["VmRSS"]  # (it moves a little between reads)
    assert memory["peak_rss_bytes"] >= memory["rss_bytes"] and memory["peak_rss_bytes"] <= seen["VmHWM"]
    assert abs(sum(parts.values()) - seen["VmRSS"]) <= 0.15 * seen["VmRSS"], (parts, seen)
    assert sum(parts.values()) + memory["unattributed"] == memory["rss_bytes"]
    assert memory["peak_reached_while"] in ("importing", "loading", "building the engine", "compiling",
                                            "making the KV pool", "serving", "now")
    assert memory["device"] is None  # CPU: the weights and pool are host memory, counted in the parts
    line = next(line for line in server.output.splitlines() if line.startswith("vsurge: serving"))
    assert " GiB resident, " in line and "programs " in line and "KV pool " in line


# ---------------------------------------------------------------- /v1/stats against /metrics
def metric_samples(server) -> dict:
    samples = {}
    for family in text_string_to_metric_families(server.get("/metrics").text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "replica")))
            samples[(s.name, labels)] = s.value  # one replica: its series are the model's
    return samples


def test_stats_schema_and_agreement_with_metrics(server):
    from vsurge.server.stats import ServerStats

    for max_tokens in (32, 2):  # at least one request finished by "stop" and one by "length"
        r = server.post("/v1/chat/completions", headers=AUTH, json={
            "messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0,
            "max_tokens": max_tokens})
        assert r.status_code == 200
    wait_for(lambda: stats(server)["running"] == 0, message="an idle server")
    before = metric_samples(server)
    body = server.get("/v1/stats", headers=AUTH).json()
    assert metric_samples(server) == before  # nothing moved while we read
    parsed = ServerStats.model_validate(body)
    assert parsed.object == "stats" and parsed.ready and parsed.uptime_s > 0
    assert abs(parsed.timestamp - time.time()) < 60
    model = body["models"][0]
    assert (model["name"], model["max_model_len"], model["ready"]) == (MODEL, 512, True)
    assert [(r["id"], r["role"]) for r in model["replicas"]] == [(0, "both")]
    replica = dict(model["replicas"][0])
    del replica["id"], replica["role"]
    model_only = ("name", "ready", "programs_compiling", "max_model_len", "replicas", "weight_bytes", "kv_cache_bytes",
                  "kv_cache_pages", "state_cache_bytes")
    assert replica == {k: v for k, v in model.items() if k not in model_only}  # memory: per model, not replica
    assert model["programs_compiling"] == 0  # a CPU compiles every program before ready
    assert model["weight_bytes"] > 0 and model["kv_cache_bytes"] > 0 and model["kv_cache_pages"] > 0
    assert model["state_cache_bytes"] == 0  # no recurrent layers in the default model

    def m(name, **labels):
        return before.get((name, tuple(sorted(labels.items()))), 0.0)

    assert model["prompt_tokens"] == m("vsurge:prompt_tokens_total") > 0
    assert model["generation_tokens"] == m("vsurge:generation_tokens_total") > 0
    assert model["failures"] == m("vsurge:request_failure_total")
    assert model["running"] == m("vsurge:num_requests_running") == 0
    assert model["waiting"] == m("vsurge:num_requests_waiting")
    assert model["finished"]["stop"] == m("vsurge:request_success_total", finished_reason="stop") > 0
    assert model["finished"]["length"] == m("vsurge:request_success_total", finished_reason="length") > 0
    for key, series in (("ttft", "vsurge:time_to_first_token_seconds"), ("itl", "vsurge:inter_token_latency_seconds"),
                        ("e2e", "vsurge:e2e_request_latency_seconds")):
        assert model[key]["count"] == m(series + "_count") > 0, key
        assert model[key]["sum"] == pytest.approx(m(series + "_sum")), key
        bounds = model[key]["bucket_bounds"] + [float("inf")]
        assert model[key]["bucket_counts"] == [m(series + "_bucket", le=_le(b)) for b in bounds], key
    assert model["streamed_tokens"] == model["ttft"]["count"] + model["itl"]["count"]
    assert model["steps"] == {"both": m("vsurge:engine_steps_total", role="both")} and model["steps"]["both"] > 0
    assert model["kv_transfer"]["count"] == 0 and model["kv_transfer_queue_depth"] == 0  # one engine: no hand-over


def _le(bound: float) -> str:
    from prometheus_client.utils import floatToGoString

    return floatToGoString(bound)


def test_thinking_is_shown_folded_and_as_text(browser, server):
    """A reasoning model's thinking (chat `reasoning_content`, kept with the message) sits folded above the
    answer, as plain text."""
    open_page(browser, server)
    conversation = [{"role": "user", "content": "Why?"},
                    {"role": "assistant", "content": "Because.", "reasoning": "<b>first</b> I weigh it"}]
    browser.execute_script("localStorage.setItem('vsurge.conversation', arguments[0]);", json.dumps(conversation))
    browser.refresh()
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#conversation .message")) == 2)
    thinking = browser.find_element(By.CSS_SELECTOR, "#conversation .message.assistant details.thinking")
    assert thinking.is_displayed() and thinking.get_attribute("open") is None
    thinking.find_element(By.TAG_NAME, "summary").click()
    assert "<b>first</b> I weigh it" in thinking.text and not thinking.find_elements(By.TAG_NAME, "b")
    assert assistant_text(browser) == "Because."
    user = browser.find_element(By.CSS_SELECTOR, "#conversation .message.user details.thinking")
    assert not user.is_displayed()


# ---------------------------------------------------------------- vsurge bench serve --plot
def test_bench_serve_levels_servers_and_plot(server, tmp_path):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "bench.png"
    out = subprocess.run(
        [sys.executable, "-m", "vsurge.cli", "bench", "serve", "--base-url", server.base, "--base-url", server.base,
         "--label", "first", "--label", "second", "--concurrency", "1,2", "--input-len", "8", "--output-len", "4",
         "--api-key", API_KEY, "--plot", str(plot)],
        capture_output=True, text=True, timeout=300, env=ENV)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| first") or line.startswith("| second")]
    assert len(rows) == 4 and "| first @ 1 |" in out.stdout and "| second @ 2 |" in out.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("endpoint", ["/v1/chat/completions", "/v1/responses", "/v1/messages"])
def test_bench_serve_speaks_each_wire_format(server, endpoint):
    out = subprocess.run(
        [sys.executable, "-m", "vsurge.cli", "bench", "serve", "--base-url", server.base, "--endpoint", endpoint,
         "--num-prompts", "2", "--input-len", "8", "--output-len", "4", "--temperature", "0.8", "--api-key", API_KEY,
         "--json"],
        capture_output=True, text=True, timeout=300, env=ENV)
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json.loads(out.stdout)
    assert (summary["completed"], summary["failed"], summary["output_tokens"]) == (2, 0, 8)
    assert summary["ttft"]["median"] > 0 and summary["tpot"]["median"] > 0
    # the engine's per-request trace from /v1/stats: queue + step wait + prefill = its time to first token
    trace = summary["server_trace"]
    assert set(trace) == {"queue", "step_wait", "prefill", "ttft"} and min(trace.values()) >= 0
    assert trace["queue"] + trace["step_wait"] + trace["prefill"] == pytest.approx(trace["ttft"], abs=1e-3)
    assert 0 < trace["ttft"] <= summary["ttft"]["mean"]  # the client's includes the HTTP way
