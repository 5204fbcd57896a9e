"""The dashboard page (issue 16) in a real headless browser.

Debian's chromium is driven by Selenium through the system chromedriver (no browser download);
the tests skip where either, or Selenium, is missing. Each test serves its own tables with
``rp.Server(..., dashboard_address="127.0.0.1:0")`` and a token, opens the page, enters the token
in the page's form and reads what the page shows through the ids, classes and data attributes
python/reprise/dashboard/ gives its elements. Every wait is bounded (WebDriverWait), and the
browser quits after each test, its profile in the test's tmp_path and its shared memory in /tmp
(--disable-dev-shm-usage): nothing is left in /dev/shm.

A screenshot of the page with a writer running is saved to $REPRISE_TEST_ARTIFACTS (else the
test's tmp_path) as dashboard-live.png."""

import os
import shutil
import threading
import time

import numpy as np
import pytest

import reprise as rp

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install '.[test]')")
from selenium.common.exceptions import NoAlertPresentException, TimeoutException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Debian's chromium and chromedriver on PATH (apt-get install chromium chromium-driver)")

TOKEN = "dashboard-test-token"
WAIT_S = 20.0  # longest any one thing may take to show on the page
EVIL = "<img src=x onerror=alert(1)>"


# --- fixtures -------------------------------------------------------------------------------------


@pytest.fixture
def browser(tmp_path):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1200", f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        driver.set_page_load_timeout(WAIT_S)
        driver.set_script_timeout(WAIT_S)
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def serve(make_store):
    """``serve(names, token=TOKEN)`` -> a server of one table per name (max_size 500) over one
    store, with its dashboard on a free loopback port; stopped at teardown (before the store
    is closed)."""
    servers = []

    def start(names, token=TOKEN):
        store = make_store(capacity=4096, block_steps=16)
        tables = [rp.Table(name, store, max_size=500) for name in names]
        server = rp.Server(tables, address="127.0.0.1:0", token=token, dashboard_address="127.0.0.1:0")
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def artifacts(tmp_path):
    path = os.environ.get("REPRISE_TEST_ARTIFACTS") or str(tmp_path)
    os.makedirs(path, exist_ok=True)
    return path


# --- helpers --------------------------------------------------------------------------------------


def wait_for(driver, predicate, what, timeout=WAIT_S):
    """Waits until ``predicate(driver)`` is truthy and returns it; fails naming ``what`` and
    what the page shows."""
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(predicate)
    except TimeoutException:
        pytest.fail(f"the page did not show {what} within {timeout} s; status: {status(driver)!r}, "
                    f"error: {error_text(driver)!r}, tables: {table_rows(driver)!r}")


def status(driver):
    return driver.execute_script("const s = document.getElementById('status');"
                                 "return s && `${s.dataset.state}: ${s.textContent}`")


def error_text(driver):
    box = driver.find_element(By.ID, "error")
    return box.text if box.is_displayed() else None


def open_page(driver, server, token=TOKEN, query=""):
    """Opens the dashboard, answers its token form with ``token``."""
    driver.get(f"http://{server.dashboard_address}/{query}")
    form = wait_for(driver, lambda d: d.find_element(By.ID, "token-form").is_displayed(), "the token form")
    assert form
    field = driver.find_element(By.ID, "token-input")
    field.clear()
    field.send_keys(token)
    driver.find_element(By.ID, "token-submit").click()


def table_rows(driver):
    """{table name: {field: shown text}} for the rows of the tables section, in the page's order."""
    return dict(driver.execute_script("""
        return [...document.querySelectorAll('#table-rows tr')].map((tr) => [tr.dataset.table,
            Object.fromEntries([...tr.querySelectorAll('td[data-field]')].map((td) => [td.dataset.field, td.textContent]))]);
    """))


def number(text):
    """A number the page shows ("1,234", "12.5"); None for "—"."""
    text = text.replace(",", "").strip()
    return None if text in ("", "—") else float(text)


class Writer:
    """Writes 50 one-step items and samples 8 every 20 ms in ``table`` through a local client,
    on a thread, until stopped."""

    def __init__(self, server, table):
        self.client = rp.Client(server.local_address)
        self.table = table
        self.stop_event = threading.Event()
        self.error = None
        self.thread = threading.Thread(target=self.run, name="dashboard-writer", daemon=True)
        self.thread.start()

    def run(self):
        try:
            with self.client.writer(self.table) as w:
                x = 0
                while not self.stop_event.is_set():
                    w.extend({"x": np.arange(x, x + 50, dtype=np.int64)})
                    w.create_items(self.table, num_steps=1, priorities=np.linspace(0.1, 4.0, 50))
                    w.end_episode()
                    w.flush(timeout=5.0)
                    self.client.sample(self.table, 8, timeout=5.0)
                    x += 50
                    time.sleep(0.02)
        except BaseException as e:  # noqa: BLE001 - raised by stop()
            self.error = e

    def stop(self):
        self.stop_event.set()
        self.thread.join(10.0)
        assert not self.thread.is_alive(), "the writer thread did not stop within 10 s"
        self.client.close()
        if self.error is not None:
            raise self.error


# --- tests ----------------------------------------------------------------------------------------


def test_page_with_token_shows_every_table_with_the_numbers_of_info(browser, serve):
    server = serve(["replay", "params", "demos"])
    replay, params, _ = server.tables
    replay.insert({"x": np.arange(120, dtype=np.int64).reshape(-1, 1)}, 1.0)
    params.insert({"x": np.arange(7, dtype=np.int64).reshape(-1, 1)}, 1.0)
    replay.sample(10)

    open_page(browser, server)
    fields = ("size", "max_size", "num_inserts", "num_samples")
    expected = {t.name: {f: t.info()[f] for f in fields} for t in server.tables}

    def shown(driver):
        return {name: {f: number(cells[f]) for f in fields} for name, cells in table_rows(driver).items()}

    wait_for(browser, lambda d: shown(d) == expected, "a row per table with the numbers of table.info()")
    assert list(table_rows(browser)) == ["replay", "params", "demos"]  # server order
    assert error_text(browser) is None
    assert browser.find_element(By.ID, "token-form").is_displayed() is False
    assert browser.find_element(By.ID, "status").get_attribute("data-state") == "live"
    assert browser.find_element(By.ID, "detail").get_attribute("data-table") == "replay"


def test_rate_chart_and_numbers_move_while_a_writer_runs(browser, serve, artifacts):
    server = serve(["replay"])
    open_page(browser, server)
    wait_for(browser, lambda d: table_rows(d).get("replay"), "the replay row")
    assert number(table_rows(browser)["replay"]["size"]) == 0

    chart = browser.find_element(By.ID, "rate-chart")
    writer = Writer(server, "replay")
    try:
        wait_for(browser, lambda d: (number(table_rows(d)["replay"]["insert_rate"]) or 0) > 0,
                 "an insert rate above 0")
        wait_for(browser, lambda d: int(chart.get_attribute("data-inserts") or 0) > 0,
                 "inserts in the rate chart")
        first = chart.get_attribute("data-last-time")
        wait_for(browser, lambda d: chart.get_attribute("data-last-time") != first,
                 "the rate chart moving on to a later second")
        wait_for(browser, lambda d: number(table_rows(d)["replay"]["size"]) > 0, "the table's size going up")
        assert chart.find_elements(By.TAG_NAME, "canvas"), "uPlot drew no canvas"
        wait_for(browser, lambda d: (number(table_rows(d)["replay"]["sample_rate"]) or 0) > 0,
                 "a sample rate above 0")
        for histogram in ("priority-histogram", "age-inserts-histogram", "age-seconds-histogram",
                          "times-sampled-histogram"):
            wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f"#{histogram} .bar"), histogram)
        client = wait_for(browser, lambda d: d.execute_script("""
            for (const tr of document.querySelectorAll('#client-rows tr')) {
                const kind = tr.querySelector('[data-field="kind"]').textContent;
                const inserts = tr.querySelector('[data-field="inserts"]').textContent;
                if (kind === 'local' && parseInt(inserts.replace(/,/g, '')) > 0) return tr.textContent;
            }"""), "the writer's client with its inserts")
        assert "local" in client
        path = os.path.join(artifacts, "dashboard-live.png")
        assert browser.save_screenshot(path)
    finally:
        writer.stop()
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_missing_or_wrong_token_shows_an_error_and_asks_again(browser, serve):
    server = serve(["replay"])
    browser.get(f"http://{server.dashboard_address}/")
    shown = wait_for(browser, lambda d: error_text(d), "an error for the missing token")
    assert "wrong or missing token" in shown.lower()
    field = browser.find_element(By.ID, "token-input")
    field.send_keys("not-the-token")
    browser.find_element(By.ID, "token-submit").click()
    shown = wait_for(browser, lambda d: "refused" in (error_text(d) or "") and error_text(d),
                     "an error for the wrong token")
    assert "wrong or missing token" in shown.lower()
    wait_for(browser, lambda d: d.find_element(By.ID, "token-form").is_displayed(), "the token form again")
    assert not browser.find_element(By.ID, "view").is_displayed()
    assert table_rows(browser) == {}

    field = browser.find_element(By.ID, "token-input")
    field.send_keys(TOKEN)
    browser.find_element(By.ID, "token-submit").click()
    wait_for(browser, lambda d: "replay" in table_rows(d), "the tables once the right token is given")
    assert error_text(browser) is None

    browser.refresh()  # the token is kept for the tab (sessionStorage): not asked again
    wait_for(browser, lambda d: "replay" in table_rows(d), "the tables after a reload")
    assert not browser.find_element(By.ID, "token-form").is_displayed()


def test_dashboard_link_opens_the_page_without_asking_and_leaves_no_token_in_the_address(browser, serve):
    server = serve(["replay"])
    assert server.dashboard_link.endswith(f"/#token={TOKEN}")
    browser.get(server.dashboard_link)
    wait_for(browser, lambda d: "replay" in table_rows(d), "the tables, the token taken from the link")
    assert not browser.find_element(By.ID, "token-form").is_displayed()
    assert error_text(browser) is None
    assert browser.current_url == server.dashboard_url   # the fragment is gone from the address bar


def test_page_without_a_server_token_needs_none_on_loopback(browser, serve):
    server = serve(["replay"], token=None)
    browser.get(f"http://{server.dashboard_address}/")
    wait_for(browser, lambda d: "replay" in table_rows(d), "the tables without asking for a token")
    assert not browser.find_element(By.ID, "token-form").is_displayed()
    assert error_text(browser) is None


def test_page_polls_when_asked_not_to_stream(browser, serve):
    server = serve(["replay"])
    server.tables[0].insert({"x": np.arange(3, dtype=np.int64).reshape(-1, 1)}, 1.0)
    open_page(browser, server, query="?transport=poll")
    wait_for(browser, lambda d: number(table_rows(d).get("replay", {}).get("size", "—") or "—") == 3,
             "the replay row from /api/snapshot")
    assert browser.find_element(By.ID, "status").get_attribute("data-state") == "polling"


def test_table_named_like_html_renders_as_text(browser, serve):
    server = serve([EVIL, "plain"])
    open_page(browser, server)
    rows = wait_for(browser, lambda d: EVIL in table_rows(d) and table_rows(d),
                    "the row of the table named like an img element")
    assert rows[EVIL]["name"] == EVIL
    assert browser.find_element(By.ID, "detail-name").text == EVIL
    assert browser.find_elements(By.TAG_NAME, "img") == []
    assert browser.find_elements(By.CSS_SELECTOR, "#table-rows script, #table-rows img") == []
    time.sleep(0.5)  # an onerror handler, had an img been made, fires as its load fails
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 - raises when no alert is open
