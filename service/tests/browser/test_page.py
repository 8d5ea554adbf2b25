"""The web page of `forkscore serve`, in a real headless browser (Chromium through Selenium).

Writes the demo model, starts `forkscore serve` on it on a free loopback port, opens the page,
picks the `parallel_schema` preset, fills a context, clicks Score, waits for the probability
bars, checks the field names, the bars (one per choice, widths summing to 100% per field) and the
telemetry, saves a screenshot, compares with the autoregressive baseline ("Compare with
generation": live clocks for both requests, then the generation report — server times, speed-up,
validity, per-field agreement), checks a bad schema's typed error (and that the previous result is cleared), then stops the server with
SIGTERM (graceful: exit status 0).

Run (from the repository root, after `cargo build -p forkscore-pipeline`):

    python -m pytest -q service/tests/browser/test_page.py   # with selenium installed (CI: a venv)

Env: FORKSCORE_BIN (default target/debug/forkscore), FORKSCORE_SCREENSHOT (default
target/browser/web-page.png), CHROMIUM_BIN (default /usr/bin/chromium), CHROMEDRIVER_BIN
(default /usr/bin/chromedriver).
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select, WebDriverWait

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(os.environ.get("FORKSCORE_BIN", ROOT / "target" / "debug" / "forkscore"))
SHOT = Path(os.environ.get("FORKSCORE_SCREENSHOT", ROOT / "target" / "browser" / "web-page.png"))
CONTEXT = "Our production payment service is completely down for every customer, and no one can complete a purchase."
FIELDS = {
    "risk_level": ["low", "medium", "high", "critical"],
    "requires_review": ["false", "true"],
    "impact_scope": ["single_user", "team", "all_customers"],
}


def start_server(model_dir: Path) -> tuple[subprocess.Popen, str]:
    """`forkscore serve --port 0`; the address is read from its start-up line on stderr."""
    proc = subprocess.Popen(
        [str(BIN), "serve", "--model", str(model_dir), "--revision", "demo", "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    assert proc.stderr is not None
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise AssertionError(f"forkscore serve exited early with {proc.wait()}")
        m = re.search(r"serving on (http://127\.0\.0\.1:\d+/)", line)
        if m:
            return proc, m.group(1)
    proc.kill()
    raise AssertionError("forkscore serve did not print its address within 120 s")


def browser() -> webdriver.Chrome:
    opts = webdriver.ChromeOptions()
    opts.binary_location = os.environ.get("CHROMIUM_BIN", "/usr/bin/chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1000"):
        opts.add_argument(arg)
    service = Service(os.environ.get("CHROMEDRIVER_BIN", "/usr/bin/chromedriver"))
    return webdriver.Chrome(service=service, options=opts)


def test_page_scores_a_context_and_draws_probability_bars():
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "demo"
        subprocess.run([str(BIN), "demo-model", str(model)], check=True)
        server, url = start_server(model)
        driver = None
        try:
            driver = browser()
            driver.get(url)
            wait = WebDriverWait(driver, 60)
            # presets come from /v1/presets
            wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#preset option")) > 1)
            Select(driver.find_element(By.ID, "preset")).select_by_value("parallel_schema")
            assert '"risk_level"' in driver.find_element(By.ID, "schema").get_attribute("value")
            context = driver.find_element(By.ID, "context")
            context.clear()
            context.send_keys(CONTEXT)
            driver.find_element(By.ID, "score").click()
            wait.until(EC.presence_of_all_elements_located((By.CSS_SELECTOR, "#results .field .bar")))

            assert driver.find_element(By.ID, "error").get_attribute("hidden") is not None
            fields = driver.find_elements(By.CSS_SELECTOR, "#results .field")
            assert [f.get_attribute("data-field") for f in fields] == list(FIELDS)
            for f in fields:
                name = f.get_attribute("data-field")
                rows = f.find_elements(By.CSS_SELECTOR, ".choice")
                assert [r.get_attribute("data-choice") for r in rows] == FIELDS[name]
                widths = [
                    float(re.search(r"width:\s*([\d.]+)%", r.find_element(By.CSS_SELECTOR, ".bar").get_attribute("style")).group(1))
                    for r in rows
                ]
                assert abs(sum(widths) - 100.0) < 0.1, (name, widths)
                assert len(f.find_elements(By.CSS_SELECTOR, ".choice.chosen")) == 1, name
                pick = f.find_element(By.CSS_SELECTOR, ".pick").text
                assert pick in FIELDS[name], (name, pick)
            telemetry = driver.find_element(By.ID, "telemetry").text
            for label in ("mode", "parallel", "prefix tokens", "time total (ms)", "temperature"):
                assert label in telemetry, telemetry
            assert "object Object" not in telemetry, telemetry
            SHOT.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(SHOT))
            print(f"screenshot: {SHOT}")

            # forkscore vs generation: both live clocks stop, the report fills in
            driver.find_element(By.ID, "compare").click()
            wait.until(EC.presence_of_element_located((By.ID, "compare-table")))
            assert driver.find_element(By.ID, "error").get_attribute("hidden") is not None
            for clock in ("clock-forkscore", "clock-generation"):
                assert re.fullmatch(r"\d+\.\d\d s", driver.find_element(By.ID, clock).text), clock
            report = driver.find_element(By.ID, "compare-table").text
            for label in ("forkscore decision (server ms)", "generation (server ms)", "speed-up",
                          "generated tokens", "valid JSON answer", "fields agreeing"):
                assert label in report, report
            agreement = driver.find_elements(By.CSS_SELECTOR, "#agreement tr")
            assert [r.get_attribute("data-field") for r in agreement] == list(FIELDS)
            shot_compare = SHOT.with_name(SHOT.stem + "-compare" + SHOT.suffix)
            driver.set_window_size(1280, 1750)  # the comparison sits below the results
            driver.save_screenshot(str(shot_compare))
            print(f"screenshot: {shot_compare}")
            # a bad schema: the typed 4xx (kind, JSON path, rule) is shown, not a blank page
            schema = driver.find_element(By.ID, "schema")
            schema.clear()
            schema.send_keys('{"f": {"type": "enum", "choices": []}}')
            driver.find_element(By.ID, "score").click()
            wait.until(lambda d: d.find_element(By.ID, "error").get_attribute("hidden") is None)
            error = driver.find_element(By.ID, "error").text
            assert error.startswith("400 invalid_schema at schema.f.choices"), error
            # the previous request's result and telemetry are cleared, not left as the answer
            assert driver.find_elements(By.CSS_SELECTOR, "#results .field") == []
            assert "request failed" in driver.find_element(By.ID, "results").text
            assert driver.find_element(By.ID, "telemetry").text.strip() == "—"
        finally:
            if driver is not None:
                driver.quit()
            server.send_signal(signal.SIGTERM)
            try:
                code = server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                raise
        assert code == 0, f"forkscore serve exited with {code} after SIGTERM"


if __name__ == "__main__":
    test_page_scores_a_context_and_draws_probability_bars()
    print("ok", file=sys.stderr)
