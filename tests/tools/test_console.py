"""`mqstore console` end to end: a real store under load (a producer process sending), the
console as its own process, and the page driven in headless Chromium (Debian's chromium and
chromedriver through Selenium). No part is a stand-in.

MQSTORE_SCREENSHOTS=DIR also writes each page's screenshot there (docs/img for the guide).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ipc.control_block import Role
from tests.workers.store_harness import (
    REPO_ROOT,
    checked_store,
    child_env,
    cli,
    module_store,
    run_python,
    spawn_python,
    wait_for,
)
from tools.console.access import cookie_name
from tools.console.events import EventKind, recent_events

pytestmark = pytest.mark.slow

TOPIC = "orders"
GROUP = "billing"
HOSTILE_BODY = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">&amp;'
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1280,900")

LOAD_SCRIPT = """
import os, sys, time
from engine.message import Message
from ipc.producer import Producer
store, topic, stop_file = sys.argv[1], sys.argv[2], sys.argv[3]
deadline = time.monotonic() + 240  # bounded even if the test never asks it to stop
i = 0
with Producer(store, reattach_timeout_s=0) as producer:
    while not os.path.exists(stop_file) and time.monotonic() < deadline:
        producer.send_batch([Message(topic, f"load-{i + j}".encode(), keys=(f"load-{i + j}",))
                             for j in range(20)])
        if i == 0:
            print("sending", flush=True)  # once: nobody drains this pipe later
        i += 20
        time.sleep(0.1)  # a trickle (~200 msg/s): the overview must see growth, teardown checks it all
"""

SEED_SCRIPT = """
import json, sys
from ipc.consumer import Consumer
from ipc.producer import Producer
store, topic, group, hostile = sys.argv[1:5]
with Producer(store) as producer:
    first = producer.send(topic, b"hello console", keys=("order-42",), tags="paid",
                          properties={"region": "eu"})
    bad = producer.send(topic, hostile.encode(), keys=("hostile-1",))
with Consumer(store, group) as consumer:
    result = consumer.pull(topic, first.queue_id, 0, 32, timeout_ms=5000)
    consumer.commit(topic, first.queue_id, result.next_offset)
    consumer.flush_offsets()
print(json.dumps({"msg_id": first.msg_id, "queue_id": first.queue_id,
                  "queue_offset": first.queue_offset, "committed": result.next_offset}))
"""


# ---------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("console") / "store"
    yield from module_store(root)


@pytest.fixture(scope="module")
def seeded(store):
    result = run_python(SEED_SCRIPT, str(store.root), TOPIC, GROUP, HOSTILE_BODY)
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def load(store, seeded):
    """A producer process sending until the module's tests are done."""
    stop_file = store.root.parent / "stop-load"
    proc = spawn_python(LOAD_SCRIPT, str(store.root), TOPIC, str(stop_file))
    wait_for(lambda: proc.stdout.readline(), "the load producer's first batch")
    yield proc
    stop_file.touch()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()


class Console:
    def __init__(self, proc: subprocess.Popen, url: str):
        self.proc = proc
        self.url = url
        self.base = url.split("/?", 1)[0]
        self.token = url.split("token=", 1)[1]
        self.cookie = f"{cookie_name(int(self.base.rsplit(':', 1)[1]))}={self.token}"


@pytest.fixture(scope="module")
def console(store, load):
    proc = subprocess.Popen([sys.executable, "-m", "tools.cli", "console", "--store", str(store.root),
                             "--listen", "127.0.0.1:0"], cwd=REPO_ROOT, env=child_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = proc.stdout.readline().decode()
    match = re.match(r"console: (http://127\.0\.0\.1:\d+/\?token=[A-Za-z0-9_-]{40,})$", line.strip())
    assert match, (line, proc.stderr.read().decode() if proc.poll() is not None else "")
    yield Console(proc, match[1])
    proc.terminate()
    assert proc.wait(30) == 0, proc.stderr.read().decode()


@pytest.fixture(scope="module")
def browser(console):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in CHROMIUM_ARGS:
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.get(console.url)  # the token once, as a user pastes the printed URL
    yield driver
    driver.quit()


def text_of(driver, element_id: str) -> str:
    return driver.find_element("id", element_id).text


def open_tab(driver, name: str) -> None:
    driver.find_element("css selector", f"nav a[data-tab={name}]").click()
    wait_for(lambda: driver.find_element("id", f"tab-{name}").is_displayed(), f"the {name} tab")


def table_rows(driver, table_id: str) -> list[dict]:
    """The rows of a rendered table as {column: cell text}."""
    return driver.execute_script("""
        const rows = [];
        for (const tr of document.querySelectorAll('#' + arguments[0] + ' tbody tr')) {
            const row = {};
            for (const td of tr.querySelectorAll('td[data-column]')) row[td.dataset.column] = td.textContent;
            rows.push(row);
        }
        return rows;""", table_id)


DATE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC([+-]\d\d:\d\d)?$")  # one format, its zone named
BYTES = re.compile(r"^\d+ B$|^\d+\.\d (KiB|MiB|GiB|TiB)$")
DURATION = re.compile(r"^\d+ ms$|^\d+\.\d (s|min|h)$")
NICE_FACTORS = (1, 2, 2.5, 5)
UNKNOWN = "\N{EN DASH}"  # the page's cell for a value it does not know


def assert_cells(rows: list[dict], column: str, pattern: re.Pattern) -> None:
    """Every known cell of `column` reads in its unit (UNKNOWN is an unknown value)."""
    cells = [row[column] for row in rows if row[column] != UNKNOWN]
    assert cells, f"no value in column {column}"
    assert all(pattern.match(cell) for cell in cells), (column, cells)


def chart_ticks(driver, canvas_id: str) -> list[str]:
    """The axis labels a chart drew, top to bottom."""
    return driver.execute_script("return document.getElementById(arguments[0]).dataset.ticks",
                                 canvas_id).split("|")


def tick_value(label: str) -> float:
    """A tick's label as a number: 2.5k is 2500, 4 KiB is 4096."""
    number, _, unit = label.partition(" ")
    scale = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    if unit:
        return float(number) * scale[unit]
    multiplier = {"k": 1e3, "M": 1e6, "G": 1e9}.get(label[-1], 1)
    return float(label.rstrip("kMG")) * multiplier


def assert_round_steps(ticks: list[str], steps) -> None:
    """Ticks from a round step down to 0 in equal steps of one of `steps`."""
    values = [tick_value(t) for t in ticks]
    step = values[-2]
    assert values[-1] == 0 and step > 0 and steps(step), ticks
    assert values == [step * i for i in range(len(values) - 1, -1, -1)], ticks


def is_nice_decimal(step: float) -> bool:
    power = 10 ** (len(str(int(step))) - 1) if step >= 1 else 10 ** -len(str(step).split(".")[1])
    return any(abs(step - f * power) < 1e-9 * power for f in NICE_FACTORS)


def is_power_of_two(step: float) -> bool:
    return step == int(step) and int(step) & (int(step) - 1) == 0


def screenshot(driver, tmp_path: Path, name: str) -> None:
    """A PNG of the page, kept when MQSTORE_SCREENSHOTS names a directory."""
    path = tmp_path / f"console-{name}.png"
    assert driver.save_screenshot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    target = os.environ.get("MQSTORE_SCREENSHOTS")
    if target:
        shutil.copy(path, Path(target) / path.name)


def http_get(url: str, cookie: str | None = None) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(url, headers={"Cookie": cookie} if cookie else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


# ---------------------------------------------------------------------------------- access
def test_a_request_without_the_token_is_refused_for_pages_json_and_static_files(console):
    for path in ("/", "/api/overview", "/api/topics", "/api/lookup?by=key&topic=orders&key=order-42",
                 "/static/console.js", "/no-such-page"):
        status, _, body = http_get(console.base + path)
        assert status == 403, (path, status)
        assert b"order-42" not in body and b"READY" not in body
        status, _, _ = http_get(console.base + path + ("&" if "?" in path else "?") + "token=wrong")
        assert status == 403, (path, status)
        status, _, _ = http_get(console.base + path, cookie=console.cookie.replace(console.token, "wrong"))
        assert status == 403, (path, status)


def test_the_token_once_in_the_url_sets_an_httponly_strict_cookie_that_then_suffices(console):
    status, headers, body = http_get(f"{console.base}/?token={console.token}")
    assert status == 200 and b"mqstore console" in body
    cookie = headers["Set-Cookie"]
    assert cookie.startswith(f"{console.cookie};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    status, headers, body = http_get(f"{console.base}/api/overview",
                                     cookie=console.cookie)
    assert status == 200 and "history" in json.loads(body)


def test_a_non_loopback_listen_address_is_refused_without_allow_remote(store):
    for address in ("0.0.0.0:8460", "192.0.2.7:8460", "[::]:8460"):
        result = cli("console", "--store", str(store.root), "--listen", address, timeout=30)
        err = result.stderr.decode()
        assert result.returncode == 2, (address, result.returncode, err)
        assert "not a loopback address" in err and "--allow-remote" in err, err
        assert "Traceback" not in err and result.stdout == b""  # no URL, so no server ran


def test_a_malformed_listen_address_is_refused_naming_the_form(store):
    result = cli("console", "--store", str(store.root), "--listen", "localhost", timeout=30)
    assert result.returncode == 2 and "is not HOST:PORT" in result.stderr.decode()


def test_a_port_in_use_is_refused_naming_the_address(store):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        result = cli("console", "--store", str(store.root), "--listen", address, timeout=30)
    err = result.stderr.decode()
    assert result.returncode == 2 and f"cannot listen on {address}" in err, err


def test_a_directory_that_is_no_store_is_refused(tmp_path):
    result = cli("console", "--store", str(tmp_path / "nothing"), "--listen", "127.0.0.1:0", timeout=30)
    assert result.returncode == 2 and "no store here" in result.stderr.decode()
    assert not (tmp_path / "nothing").exists()


@pytest.mark.parametrize(("query", "field", "words"), [
    ("by=bogus", "by", "is not one of key, msg_id, offset"),
    ("by=key&topic=orders", "key", "is required"),
    ("by=key&topic=no/such&key=k", "topic", "may only hold"),
    ("by=msg_id&msg_id=zz", "msg_id", "is not 32 or 56 hex characters"),
    ("by=offset&topic=orders&queue_id=x&queue_offset=0", "queue_id", "is not an integer"),
    ("by=offset&topic=orders&queue_id=0&queue_offset=-1", "queue_offset", "must be >= 0"),
])
def test_a_bad_lookup_is_answered_400_naming_the_field(console, query, field, words):
    status, _, body = http_get(f"{console.base}/api/lookup?{query}",
                               cookie=console.cookie)
    answer = json.loads(body)
    assert status == 400 and answer["field"] == field and words in answer["error"], answer


def test_the_console_is_read_only_and_names_unknown_paths(console):
    cookie = console.cookie
    status, _, body = http_get(f"{console.base}/api/nothing", cookie=cookie)
    assert status == 404 and "no endpoint /api/nothing" in json.loads(body)["error"]
    status, _, body = http_get(f"{console.base}/api/lag?group=nobody", cookie=cookie)
    assert status == 400 and "has committed no offset" in json.loads(body)["error"]
    request = urllib.request.Request(f"{console.base}/api/overview", data=b"x", method="POST",
                                     headers={"Cookie": cookie})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 501


# ---------------------------------------------------------------------------------- pages
def test_overview_shows_the_running_store_with_live_numbers_that_change(browser, console, tmp_path):
    open_tab(browser, "overview")
    wait_for(lambda: text_of(browser, "state") == "READY", "the state READY")
    first = wait_for(lambda: text_of(browser, "appended-total").isdigit() and
                     int(text_of(browser, "appended-total")), "a message count")
    wait_for(lambda: int(text_of(browser, "appended-total")) > first, "the count to grow under load")
    wait_for(lambda: float(text_of(browser, "append-rate").rstrip("k") or 0) > 0, "a positive append rate")
    roles = {row["role"] for row in table_rows(browser, "processes-table")}
    assert {"supervisor", "dispatcher", "index_builder[0]", "index_builder[1]"} <= roles
    drawn = browser.execute_script("""
        const c = document.getElementById('chart-rates');
        const data = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let colored = 0;  // line pixels in the plot area (below the legend, right of the scale)
        for (let y = 24; y < c.height; y++) for (let x = 48; x < c.width; x++) {
            const i = (y * c.width + x) * 4;
            const [r, g, b] = [data[i], data[i + 1], data[i + 2]];
            if (data[i + 3] > 0 && Math.max(r, g, b) - Math.min(r, g, b) > 100) colored++;
        }
        return colored;""")
    assert drawn > 100, "the rate lines are drawn on the chart"
    screenshot(browser, tmp_path, "overview")


def test_overview_shows_sizes_durations_times_and_round_chart_ticks_in_human_units(browser, tmp_path):
    open_tab(browser, "overview")
    wait_for(lambda: text_of(browser, "state") == "READY", "the state READY")
    lag = wait_for(lambda: text_of(browser, "dispatch-lag") not in ("", UNKNOWN)
                   and text_of(browser, "dispatch-lag"), "the dispatch lag")
    assert re.match(r"^(\d+ B|\d+\.\d (KiB|MiB))(, (\d+ ms|\d+\.\d s))?$", lag), lag
    processes = table_rows(browser, "processes-table")
    assert_cells(processes, "uptime_s", DURATION)
    assert_cells(processes, "heartbeat_ms", DURATION)
    assert_cells(processes, "rss_bytes", BYTES)
    positions = table_rows(browser, "positions-table")
    assert_cells(positions, "lag_bytes", BYTES)
    assert_cells(positions, "lag_ms", DURATION)
    retention = {row["name"]: row["value"] for row in table_rows(browser, "retention-table")}
    assert not any("_" in name and name != "retention line (commit_pos)" for name in retention), retention
    for part in ("commitlog", "consume queues", "index"):  # allocated (used), as `du` and the data
        allocated, _, used = retention[f"{part} on disk"].removesuffix(" used)").partition(" (")
        assert BYTES.match(allocated) and BYTES.match(used), retention
    oldest, _, ago = retention["oldest retained message"].partition(" (")
    assert DATE.match(oldest) and DURATION.match(ago.removesuffix(" ago)")), retention
    assert retention["retention line (commit_pos)"].isdigit(), retention
    last_pass = retention["last pass"]
    assert last_pass == "none yet" or DATE.match(last_pass.split(" (")[0]), retention
    wait_for(lambda: tick_value(chart_ticks(browser, "chart-rates")[0]) > 0, "a rate scale above 0")
    assert_round_steps(chart_ticks(browser, "chart-rates"), is_nice_decimal)
    byte_ticks = chart_ticks(browser, "chart-lags")
    assert all(t == "0 B" or re.match(r"^\d+ (B|KiB|MiB|GiB)$", t) for t in byte_ticks), byte_ticks
    assert_round_steps(byte_ticks, is_power_of_two)
    assert DATE.match(text_of(browser, "updated").removeprefix("updated ")), text_of(browser, "updated")
    browser.execute_script("document.getElementById('retention-table').scrollIntoView()")
    screenshot(browser, tmp_path, "overview-retention")


def test_topics_page_lists_the_produced_topic_and_its_queues(browser, tmp_path):
    open_tab(browser, "topics")
    rows = wait_for(lambda: [r for r in table_rows(browser, "topics-table") if r.get("topic") == TOPIC],
                    "the topic's rows")
    assert sum(int(r["messages"]) for r in rows) >= 2
    assert {r["queue_id"] for r in rows} <= {"0", "1", "2", "3"}
    assert_cells(rows, "stored_bytes", BYTES)
    assert_cells(rows, "oldest_store_time_ms", DATE)
    assert_cells(rows, "newest_store_time_ms", DATE)
    screenshot(browser, tmp_path, "topics")


def test_groups_page_shows_the_committed_group_and_its_lag(browser, seeded, tmp_path):
    open_tab(browser, "groups")
    rows = wait_for(lambda: [r for r in table_rows(browser, "groups-table") if r.get("group") == GROUP],
                    "the group's row")
    assert TOPIC in rows[0]["topics"]
    lag = wait_for(lambda: [r for r in table_rows(browser, "lag-table")
                            if r.get("group") == GROUP and r["queue_id"] == str(seeded["queue_id"])],
                   "the group's lag row")
    assert int(lag[0]["committed_offset"]) == seeded["committed"]
    assert int(lag[0]["lag_messages"]) == int(lag[0]["max_offset"]) - seeded["committed"]
    assert_cells(rows, "last_commit_time_ms", DATE)
    lags = table_rows(browser, "lag-table")
    assert_cells(lags, "lag_ms", DURATION)
    assert_cells(lags, "last_commit_time_ms", DATE)
    screenshot(browser, tmp_path, "groups")


def look_up(driver, by: str, **fields: str) -> list:
    open_tab(driver, "lookup")
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element("id", "lookup-by")).select_by_value(by)
    for name, value in fields.items():
        box = driver.find_element("id", f"lookup-{name.replace('_', '-')}")
        box.clear()
        box.send_keys(value)
    driver.execute_script("document.getElementById('lookup-status').textContent = ''")
    driver.find_element("id", "lookup-go").click()
    wait_for(lambda: text_of(driver, "lookup-status") not in ("", "looking up…"), "the lookup answer")
    return driver.find_elements("css selector", "#lookup-results .message")


def test_lookup_by_key_finds_the_message_and_shows_body_and_properties(browser, tmp_path):
    cards = look_up(browser, "key", topic=TOPIC, key="order-42")
    assert text_of(browser, "lookup-status") == "1 message(s)"
    assert cards[0].find_element("css selector", "pre.body").text == "hello console"
    props = cards[0].find_element("css selector", "table.properties").text
    assert "region" in props and "eu" in props and "paid" in props
    fields = dict(line.split(" ", 1) for line in
                  cards[0].find_element("css selector", "table.fields").text.splitlines()[1:])
    assert DATE.match(fields["store_time"]) and DATE.match(fields["born_time"]), fields
    assert fields["body"] == "13 B", fields
    cards[0].find_element("xpath", ".//button[text()='hex']").click()
    assert cards[0].find_element("css selector", "pre.body").text == " ".join(
        f"{b:02x}" for b in b"hello console")
    screenshot(browser, tmp_path, "lookup")


def test_lookup_by_msg_id_and_by_queue_offset_find_the_same_message(browser, seeded):
    for by, fields in (("msg_id", {"msg_id": seeded["msg_id"]}),
                       ("offset", {"topic": TOPIC, "queue_id": str(seeded["queue_id"]),
                                   "queue_offset": str(seeded["queue_offset"])})):
        cards = look_up(browser, by, **fields)
        assert len(cards) == 1, by
        assert cards[0].find_element("css selector", "pre.body").text == "hello console"
        assert seeded["msg_id"] in cards[0].text


def test_a_lookup_of_a_missing_offset_says_what_the_queue_holds(browser, seeded):
    cards = look_up(browser, "offset", topic=TOPIC, queue_id=str(seeded["queue_id"]),
                    queue_offset="999999999")
    assert cards == []
    assert "holds offsets" in text_of(browser, "lookup-status")


def test_a_hostile_body_is_shown_as_text_and_never_runs(browser):
    cards = look_up(browser, "key", topic=TOPIC, key="hostile-1")
    assert cards[0].find_element("css selector", "pre.body").text == HOSTILE_BODY
    assert browser.execute_script("return window.pwned === undefined")
    assert browser.find_elements("css selector", "#lookup-results img, #lookup-results script") == []


def test_events_page_lists_the_start_from_the_store_log(browser, store, tmp_path):
    open_tab(browser, "events")
    rows = wait_for(lambda: table_rows(browser, "events-table"), "the events")
    kinds = {row["kind"] for row in rows}
    assert {"start", "recovery"} <= kinds, kinds
    assert str(store.root / "mqstore.log") in text_of(browser, "events-source")
    assert_cells(rows, "at_ms", DATE)
    screenshot(browser, tmp_path, "events")


# ---------------------------------------------------------------------------------- events
def restart_and_manual_pass(root):
    """(restart events, manual retention events) of the log once both are there, else None."""
    events = recent_events(root)
    restarts = [e for e in events if e.kind is EventKind.RESTART]
    manual = [e for e in events if e.kind is EventKind.RETENTION
              and e.message.startswith("retention (manual")]
    return (restarts, manual) if restarts and manual else None


def test_events_name_a_child_restart_and_a_retention_pass_from_the_log(tmp_path):
    with checked_store(tmp_path / "store") as running:
        old_pid = running.child_pid(Role.DISPATCHER)
        os.kill(old_pid, 9)
        running.wait_child_replaced(Role.DISPATCHER, old_pid)
        result = cli("clean", "--store", str(running.root))
        assert result.returncode == 0, result.stderr.decode()
        # a space_warn pass may come too when the host's disk is past disk_warn_ratio
        restarts, manual = wait_for(lambda: restart_and_manual_pass(running.root),
                                    "the restart and the manual retention events")
    assert any(f"dispatcher (pid {old_pid})" in e.message for e in restarts)
    assert manual
    newest_first = recent_events(running.root)
    assert newest_first[0].kind is EventKind.STOP  # the clean stop, after everything else
