"""The dashboard in a real headless Chromium (Debian's chromium + chromium-driver, driven by
Selenium through /usr/bin/chromedriver: nothing is downloaded), against the real gateway that
tests/dashboard.rs started. Every check compares the page with what the API itself answers.

    python browser.py BASE_URL SERVER_KEY BROWSER_KEY SCREENSHOT_DIR

Exits non-zero (an AssertionError and its message) on the first failed check.
"""
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

BASE, SERVER_KEY, BROWSER_KEY, SHOTS = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
SHOTS.mkdir(parents=True, exist_ok=True)


def api(path, key=SERVER_KEY, method="GET", origin=None):
    """The API's own answer: (status, JSON body or None, headers)."""
    headers = {"Authorization": f"Bearer {key}"}
    if origin:
        headers["Origin"] = origin
    req = urllib.request.Request(BASE + path, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req) as r:
            body = r.read()
            return r.status, json.loads(body) if body else None, r.headers
    except urllib.error.HTTPError as e:
        body = e.read()
        return e.code, json.loads(body) if body else None, e.headers


def browser(width):
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", f"--window-size={width},1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    if width < 500:
        # A window is never narrower than 500 px: a phone's viewport is emulated instead.
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": width, "height": 812, "deviceScaleFactor": 1, "mobile": True})
    return driver


def wait(driver, condition, timeout=10):
    # A panel re-rendering between a find and a read leaves a stale element: look again.
    try:
        return WebDriverWait(driver, timeout, ignored_exceptions=(StaleElementReferenceException,)).until(condition)
    except TimeoutException:
        # What the page showed, for the failure's message.
        driver.save_screenshot(str(SHOTS / "failure.png"))
        print(driver.find_element(By.TAG_NAME, "main").text[:3000], file=sys.stderr)
        raise


def text_of(driver, css):
    return driver.find_element(By.CSS_SELECTOR, css).text


def console_errors(driver):
    """Console errors, the 401s the test provokes on purpose excepted."""
    return [e for e in driver.get_log("browser")
            if e["level"] == "SEVERE" and " 401 " not in e["message"] and " 403 " not in e["message"]]


def settled(driver):
    """Every panel's call has come back (no section is busy)."""
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "section[aria-busy='false']")
         and not d.find_elements(By.CSS_SELECTOR, "section[aria-busy='true']"))


def sign_in(driver, key):
    driver.get(BASE + "/dashboard")
    field = wait(driver, EC.visibility_of_element_located((By.ID, "key-input")))
    field.clear()
    field.send_keys(key)
    driver.find_element(By.ID, "sign-in").click()


def shot(driver, name):
    driver.save_screenshot(str(SHOTS / f"{name}.png"))


def section_shot(driver, panel, name):
    element = driver.find_element(By.ID, panel)
    driver.execute_script("arguments[0].scrollIntoView()", element)
    element.screenshot(str(SHOTS / f"{name}.png"))


def main():
    # The page's own headers: a strict policy, no framing.
    page = urllib.request.urlopen(BASE + "/dashboard")
    csp = page.headers["Content-Security-Policy"]
    assert csp and "default-src 'self'" in csp and "'unsafe-inline'" not in csp, csp
    assert page.headers["X-Frame-Options"] == "DENY"
    assert page.headers["Content-Type"].startswith("text/html")
    usage_before = api("/v1/usage")[1]["month_count"]

    driver = browser(1280)
    try:
        # A browser key: refused by the API, and the page says why.
        sign_in(driver, BROWSER_KEY)
        error = wait(driver, EC.visibility_of_element_located((By.ID, "sign-in-error")))
        wait(driver, lambda d: "browser key" in error.text.lower())
        assert driver.execute_script("return sessionStorage.getItem('drg.key')") is None
        shot(driver, "sign-in-browser-key")

        # The server key: the month as the API says it (after the page's own counted call to
        # top-domains: Refresh reloads the month without it).
        sign_in(driver, SERVER_KEY)
        wait(driver, lambda d: text_of(d, "#usage-text") != "")
        settled(driver)
        driver.find_element(By.ID, "refresh").click()
        settled(driver)
        usage = api("/v1/usage")[1]
        wait(driver, lambda d: text_of(d, "#usage-text") != "")
        want = f"{usage['month_count']} / {usage['monthly_limit']} calls"
        wait(driver, lambda d: want in text_of(d, "#usage-text"))
        bar = driver.find_element(By.CSS_SELECTOR, "#usage-bar [data-percent]")
        percent = int(bar.get_attribute("data-percent"))
        assert percent == usage["month_count"] * 100 // usage["monthly_limit"], percent
        level = "over" if percent >= 100 else "warn" if percent >= 80 else "ok"
        assert level in bar.get_attribute("class"), bar.get_attribute("class")
        # Kept in sessionStorage only.
        assert driver.execute_script("return sessionStorage.getItem('drg.key')") == SERVER_KEY
        assert driver.execute_script("return localStorage.length") == 0
        assert driver.get_cookies() == []
        assert SERVER_KEY not in driver.current_url
        wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#chart .bar-calls")) == 30
             and d.find_elements(By.CSS_SELECTOR, "#calls-table .call-row"))
        driver.execute_script("window.scrollTo(0, 0)")
        shot(driver, "dashboard-desktop")

        # The chart: the 30 days of /v1/stats, bar by bar, with hover values.
        stats = api("/v1/stats")[1]["chart"]
        wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#chart .bar-calls")) == 30)
        for series, field in (("bar-calls", "total_requests"), ("bar-blocked", "blocked_count")):
            shown = {r.get_attribute("data-day"): int(r.get_attribute("data-value"))
                     for r in driver.find_elements(By.CSS_SELECTOR, f"#chart .{series}")}
            assert shown == {d["date"]: d[field] for d in stats}, (series, shown)
        today = stats[-1]
        assert today["total_requests"] > 0
        bar = driver.find_element(By.CSS_SELECTOR, f"#chart .bar-calls[data-day='{today['date']}']")
        ActionChains(driver).move_to_element(bar).perform()
        tip = wait(driver, EC.visibility_of_element_located((By.ID, "chart-tip")))
        wait(driver, lambda d: str(today["total_requests"]) in tip.text)

        # Recent calls: the first page as /v1/logs has it, then the next by cursor.
        first = api("/v1/logs?limit=20")[1]
        rows = wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#calls-table .call-row"))
        assert len(rows) == len(first["items"]) == 20, len(rows)
        assert first["items"][0]["email_domain"] in rows[0].text
        assert first["next_cursor"]
        second = api(f"/v1/logs?limit=20&cursor={first['next_cursor']}")[1]
        # The pager is enabled once the page's call has settled (the rows show a moment before).
        settled(driver)
        wait(driver, EC.element_to_be_clickable((By.ID, "calls-next"))).click()
        wait(driver, lambda d: second["items"][0]["email_domain"] in
             d.find_elements(By.CSS_SELECTOR, "#calls-table .call-row")[0].text
             and len(d.find_elements(By.CSS_SELECTOR, "#calls-table .call-row")) == len(second["items"]))
        wait(driver, EC.element_to_be_clickable((By.ID, "calls-first"))).click()
        wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#calls-table .call-row")) == 20)

        # A lookup with its evidence in words.
        lookup = driver.find_element(By.ID, "lookup-input")
        lookup.send_keys("mailinator.com")
        driver.find_element(By.ID, "lookup-go").click()
        wait(driver, lambda d: "disposable" in text_of(d, "#lookup-result").lower())
        lines = wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#lookup-evidence .evidence-line"))
        assert any("list" in l.text.lower() for l in lines), [l.text for l in lines]
        # A young domain (the test's registry on loopback says: registered 3 days ago).
        lookup.clear()
        lookup.send_keys("young-shop.com")
        driver.find_element(By.ID, "lookup-go").click()
        age = wait(driver, lambda d: [l for l in d.find_elements(By.CSS_SELECTOR, "#lookup-evidence .evidence-line")
                                      if l.text.startswith("Registered ")])
        assert "3 days ago" in age[0].text and "score is raised" in age[0].text, age[0].text
        assert "40" in text_of(driver, "#lookup-result"), text_of(driver, "#lookup-result")

        # Verdict changes: the one the list refresh made, as /v1/changes has it.
        change = api("/v1/changes")[1]["changes"][0]
        rows = wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#changes-table .change-row"))
        assert len(rows) == 1, [r.text for r in rows]
        assert change["domain"] in rows[0].text and "Disposable" in rows[0].text, rows[0].text
        assert "Safe" in rows[0].text and change["rule"] in rows[0].text, rows[0].text

        # Top flagged domains, as the API ranks them.
        top = api("/v1/public/top-domains")[1]
        ranked = top["domains"]
        items = wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#top-list .top-item"))
        assert len(items) == len(ranked), (len(items), len(ranked))
        assert ranked[0]["domain"] in items[0].text, (ranked[0], items[0].text)

        for panel in ("panel-usage", "panel-chart", "panel-calls", "panel-changes", "panel-keys", "panel-lookup", "panel-top"):
            section_shot(driver, panel, f"{panel}-desktop")

        # A new browser key: its secret shown once, then revoked (the API refuses it from then on).
        site = "https://signup.example.com"
        driver.find_element(By.ID, "new-key-label").send_keys("browser test")
        driver.find_element(By.ID, "new-key-origins").send_keys(site)
        driver.find_element(By.ID, "new-key-create").click()
        secret_el = wait(driver, EC.visibility_of_element_located((By.ID, "new-key-secret")))
        secret = secret_el.text.strip()
        assert secret.startswith("drg_"), secret
        assert api("/v1/usage", key=secret, origin=site)[0] == 200, "the new key works from its site"
        assert api("/v1/usage", key=secret, origin="https://elsewhere.example")[0] == 403
        new_row = wait(driver, lambda d: [r for r in d.find_elements(By.CSS_SELECTOR, "#keys-table .key-row")
                                          if "browser test" in r.text])[0]
        new_id = new_row.get_attribute("data-key-id")
        assert new_id.startswith("key_"), new_id
        assert site in new_row.text, new_row.text
        assert secret not in driver.find_element(By.ID, "keys-table").text, "the list never shows a secret"
        new_row.find_element(By.CSS_SELECTOR, ".key-revoke").click()
        wait(driver, EC.alert_is_present()).accept()
        wait(driver, lambda d: not d.find_elements(By.CSS_SELECTOR, f"#keys-table .key-row[data-key-id='{new_id}']"))
        assert api("/v1/usage", key=secret, origin=site)[0] == 401, "a revoked key is refused"
        wait(driver, lambda d: not d.find_elements(By.ID, "new-key-secret")
             or secret not in d.find_element(By.ID, "new-key-secret").text)

        errors = console_errors(driver)
        assert not errors, errors

        # Sign-out clears the key.
        driver.find_element(By.ID, "sign-out").click()
        wait(driver, EC.visibility_of_element_located((By.ID, "key-input")))
        assert driver.execute_script("return sessionStorage.getItem('drg.key')") is None
    finally:
        driver.quit()

    # 375 px wide: still one readable column, no sideways scroll of the page.
    driver = browser(375)
    try:
        sign_in(driver, SERVER_KEY)
        wait(driver, lambda d: "calls" in text_of(d, "#usage-text"))
        wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#chart .bar-calls")) == 30)
        assert driver.execute_script("return window.innerWidth") == 375
        overflow = driver.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, f"the page scrolls sideways by {overflow} px at 375 px"
        shot(driver, "dashboard-mobile")
        driver.find_element(By.ID, "lookup-input").send_keys("throwaway.example")
        driver.find_element(By.ID, "lookup-go").click()
        wait(driver, lambda d: "disposable" in text_of(d, "#lookup-result").lower())
        for panel in ("panel-usage", "panel-chart", "panel-calls", "panel-changes", "panel-keys", "panel-lookup", "panel-top"):
            section_shot(driver, panel, f"{panel}-mobile")
        errors = console_errors(driver)
        assert not errors, errors
    finally:
        driver.quit()

    # The page's files cost the month nothing; its calls count as any call: one top-domains call
    # per opening (two here) and its two lookups; plus this script's own top-domains call (5).
    usage_after = api("/v1/usage")[1]["month_count"]
    print(json.dumps({"month_count_before": usage_before, "month_count_after": usage_after}))


if __name__ == "__main__":
    main()
