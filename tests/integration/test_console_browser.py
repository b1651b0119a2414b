"""The console in a real browser: a broker ``namesrv simulate`` registers shows up, then turns expired when it goes silent.

Kafka, Redis, one node and the Spark job as processes (:class:`tests.support.system.System`),
the console as ``make run`` starts it (:class:`infra.apps.ConsoleService`), the simulator as the
README shows it (``namesrv simulate ... --silent 1 --silent-after S``, the brokers' own timeout
short), and Debian's headless Chromium driven by selenium. The test reads only the page's DOM,
polled with a deadline: the rows, their ``data-state`` and the open alerts, as a person would see
them. With ``CONSOLE_SCREENSHOT=path`` it saves what the page shows once the broker expired
(``docs/console.png`` is made that way).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.apps import ConsoleService
from infra.processes import free_port
from tests.support.backends import ProcessInfra
from tests.support.system import REPO, System, Timing
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(900)

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
BROKER_TIMEOUT_MS = 4_000
#: long enough for the registrations to reach the page through Spark on a loaded 2-core machine
SILENT_AFTER_S = 40
SILENT_GROUP = "broker-2"  # the simulator silences the last groups


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[System, ConsoleService]]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip("Debian's chromium and chromedriver are not installed (infra/install.sh installs them)")
    run_dir = tmp_path_factory.mktemp("console")
    system = System(ProcessInfra(run_dir), run_dir, timing=Timing(broker_timeout_ms=BROKER_TIMEOUT_MS), nodes=1)
    system.start()
    console = ConsoleService(port=free_port(), run_dir=run_dir / "console", redis_url=system.redis_url)
    try:
        console.start()
        yield system, console
    finally:
        console.stop()
        system.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def rows(driver) -> dict[str, dict[str, str]]:
    """Broker rows on the page: address -> group, state and the countdown cell's text, read in one
    script call (the page re-renders its tables on every event; see :func:`open_alerts`)."""
    return driver.execute_script(
        "return Object.fromEntries(Array.from(document.querySelectorAll('#brokers tr.broker'), tr => ["
        "tr.dataset.addr, {group: tr.dataset.group, state: tr.dataset.state,"
        " countdown: tr.querySelectorAll('td')[7].innerText.trim()}]))"
    )


def node_rows(driver) -> list[dict[str, str]]:
    """The nodes table: each row's ``data-node`` and its text, read in one script call."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#nodes tr.node'), tr => ({node: tr.dataset.node, text: tr.innerText}))"
    )


def open_alerts(driver) -> list[str]:
    """The open-alerts table's cell texts, read in one script call: the page re-renders the table on
    every event, so reading cells one WebDriver call at a time can meet a cell that is already gone."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#open-alerts td'), td => td.innerText.trim())"
    )


def test_a_simulated_broker_appears_then_turns_expired_when_it_goes_silent(stack, browser, tmp_path: Path):
    from selenium.webdriver.common.by import By

    system, console = stack
    browser.get(console.url)
    wait_until(lambda: browser.find_element(By.ID, "link").text == "live", 20, "the page's event stream")
    sim = subprocess.Popen(
        [sys.executable, "-m", "namesrv", "simulate", "-n", system.namesrv_addr, "--brokers", "3", "--topics", "4",
         "--slaves-per-group", "1", "--heartbeat-interval", "1", "--heartbeat-timeout-ms", str(BROKER_TIMEOUT_MS),
         "--silent", "1", "--silent-after", str(SILENT_AFTER_S), "--addr-base", "127.0.0.1:44000",
         "--summary-interval", "3600"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=(tmp_path / "simulate.log").open("wb"),
    )  # fmt: skip
    try:
        seen = wait_until(
            lambda: (r := rows(browser)) and len(r) == 6 and all(v["state"] == "alive" for v in r.values()) and r,
            SILENT_AFTER_S - 5,
            "six alive brokers (three groups, master and slave) on the page",
            interval=0.2,
            state=lambda: rows(browser),
        )
        silent = {addr for addr, v in seen.items() if v["group"] == SILENT_GROUP}
        assert len(silent) == 2, seen
        assert all(v["countdown"] for v in seen.values()), seen  # the page counts each deadline down

        def expired() -> bool:
            r = rows(browser)
            return (
                bool(r)
                and all(r[a]["state"] == "expired" for a in silent)
                and all(v["state"] == "alive" for a, v in r.items() if a not in silent)
            )

        wait_until(expired, SILENT_AFTER_S + 60, f"{SILENT_GROUP} expired, the rest alive", 0.2,
                   state=lambda: rows(browser))  # fmt: skip
        alerts = lambda: open_alerts(browser)  # noqa: E731
        wait_until(lambda: "BROKER_EXPIRED" in alerts(), 30, "BROKER_EXPIRED among the open alerts", 0.2, state=alerts)
        nodes = node_rows(browser)
        assert [n["node"] for n in nodes] == ["node-1"] and "ticking" in nodes[0]["text"], nodes
        assert "off (monitor decides)" in nodes[0]["text"], nodes  # the node's TICKs say its own scan is off
        shot = os.environ.get("CONSOLE_SCREENSHOT")
        if shot:
            browser.find_element(By.ID, "topic").send_keys("T1")
            browser.find_element(By.CSS_SELECTOR, "#search button").click()
            wait_until(lambda: browser.find_element(By.ID, "route").text, 10, "the route of T1")
            height = browser.execute_script("return document.documentElement.scrollHeight")
            browser.set_window_size(1400, min(int(height) + 120, 4000))
            browser.execute_script("window.scrollTo(0, 0)")
            browser.save_screenshot(str(tmp_path / "console.png"))
            shutil.copyfile(tmp_path / "console.png", shot)
    finally:
        sim.terminate()
        sim.wait(20)
