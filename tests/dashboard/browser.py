"""The dashboard in a real headless Chromium (Debian's chromium + chromium-driver, driven by
Selenium through /usr/bin/chromedriver: nothing is downloaded), against the real gateways that
tests/dashboard.rs started: BASE_URL with most parts on, SHIPPED_URL on the shipped defaults
(verdict changes off). Every check compares the page with what the API itself answers. One
browser runs it all: desktop, then the shipped gateway, then a phone's viewport.

    python browser.py BASE_URL SERVER_KEY BROWSER_KEY SCREENSHOT_DIR SHIPPED_URL

Exits non-zero (an AssertionError and its message) on the first failed check.
"""
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select, WebDriverWait

BASE, SERVER_KEY, BROWSER_KEY, SHOTS = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
SHIPPED = sys.argv[5]
SHOTS.mkdir(parents=True, exist_ok=True)

# The optional parts `features` of /v1/usage names: the panels each one shows and the routes
# behind them (which the page must never ask while the part is off).
PARTS = {
    "logs": (("panel-chart", "panel-calls"), ("/v1/logs", "/v1/stats")),
    "changes": (("panel-changes",), ("/v1/changes",)),
    "keys": (("panel-keys",), ("/v1/keys",)),
    "overrides": (("panel-overrides",), ("/v1/overrides",)),
    "reports": (("panel-reports",), ("/v1/reports",)),
    "webhooks": (("panel-webhooks",), ("/v1/webhooks",)),
    "audit": (("panel-audit",), ("/v1/audit",)),
}
PANELS = ("usage", "chart", "calls", "changes", "keys", "lookup", "top", "overrides", "reports")


def api(path, key=SERVER_KEY, method="GET", origin=None, base=BASE):
    """The API's own answer: (status, JSON body or None, headers)."""
    headers = {"Authorization": f"Bearer {key}"}
    if origin:
        headers["Origin"] = origin
    req = urllib.request.Request(base + path, method=method, headers=headers)
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
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def phone(driver, width):
    # A window is never narrower than 500 px: a phone's viewport is emulated instead.
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": 812, "deviceScaleFactor": 1, "mobile": True})


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


def console_errors(driver, provoked=(" 401 ", " 403 ")):
    """Console errors since the last look, those the test provokes on purpose excepted (by a
    part of their message: the 401s and 403s of a revoked and a browser key by default)."""
    return [e for e in driver.get_log("browser")
            if e["level"] == "SEVERE" and not any(p in e["message"] for p in provoked)]


def fetched(driver):
    """The paths the page asked for since it was loaded (the browser's own resource timing)."""
    return [urllib.parse.urlsplit(u).path for u in
            driver.execute_script("return performance.getEntriesByType('resource').map((e) => e.name)")]


def check_parts(driver, features):
    """Each optional part's panels are shown when it is on; when it is off they are hidden and
    its routes were never asked."""
    assert set(features) == set(PARTS), features
    paths = fetched(driver)
    for part, (panels, routes) in PARTS.items():
        for panel in panels:
            shown = driver.find_element(By.ID, panel).is_displayed()
            assert shown == features[part], (part, panel, shown)
        if not features[part]:
            asked = [p for p in paths if p.startswith(routes)]
            assert not asked, (part, asked)


def accept_confirm(driver):
    wait(driver, EC.alert_is_present()).accept()


def status_says(driver, element_id, words):
    wait(driver, lambda d: words in text_of(d, f"#{element_id}"))


def settled(driver):
    """Every panel's call has come back (no section is busy)."""
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "section[aria-busy='false']")
         and not d.find_elements(By.CSS_SELECTOR, "section[aria-busy='true']"))


def sign_in(driver, key, base=BASE):
    driver.get(base + "/dashboard")
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


def send_form(driver, button, typed, chosen):
    """Types `typed` ({field id: text}), picks `chosen` ({select id: value}), clicks `button`."""
    for field, value in typed.items():
        driver.find_element(By.ID, field).send_keys(value)
    for field, value in chosen.items():
        Select(driver.find_element(By.ID, field)).select_by_value(value)
    driver.find_element(By.ID, button).click()


def check_overrides(driver):
    """An override set from the panel: listed as the API lists it, and the gateway answers the
    project's lookups with it; a name the API refuses is said in the panel; removed (confirmed),
    the lists answer again."""
    domain = "site2.example.org"
    assert api(f"/v1/public/domain/{domain}")[1]["reason"] == "safe"
    send_form(driver, "override-set", {"override-domain": domain, "override-note": "ticket 4411"},
              {"override-verdict": "block"})
    status_says(driver, "overrides-status", f"{domain} now answers disposable")
    rows = wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#overrides-table .override-row"))
    listed = api("/v1/overrides")[1]["items"]
    assert [(o["domain"], o["verdict"], o["note"]) for o in listed] == [(domain, "block", "ticket 4411")], listed
    assert len(rows) == 1 and rows[0].get_attribute("data-domain") == domain
    for shown in ("Block", "ticket 4411", listed[0]["set_by"], listed[0]["set_at"][:19].replace("T", " ")):
        assert shown in rows[0].text, (shown, rows[0].text)
    record = api(f"/v1/public/domain/{domain}?explain=true")[1]
    assert (record["reason"], record["risk_score"], record["evidence"]["rule"]) == ("disposable", 100, "project_block"), record
    section_shot(driver, "panel-overrides", "panel-overrides-desktop")

    send_form(driver, "override-set", {"override-domain": "not_a_domain"}, {})
    wait(driver, lambda d: text_of(d, "#panel-overrides .panel-error") != "")
    assert api("/v1/overrides")[1]["items"] == listed

    rows[0].find_element(By.CSS_SELECTOR, ".override-remove").click()
    accept_confirm(driver)
    status_says(driver, "overrides-status", f"The override of {domain} was removed.")
    wait(driver, lambda d: not d.find_elements(By.CSS_SELECTOR, "#overrides-table .override-row"))
    assert not text_of(driver, "#panel-overrides .panel-error")
    assert api("/v1/overrides")[1]["items"] == []
    record = api(f"/v1/public/domain/{domain}?explain=true")[1]
    assert record["reason"] == "safe" and record["evidence"]["rule"] != "project_block", record


def check_reports(driver):
    """A report sent from the panel: listed, open, as the API lists it."""
    domain = "throwaway.example"
    send_form(driver, "report-send", {"report-domain": domain, "report-note": "a customer since 2019"},
              {"report-verdict": "safe"})
    status_says(driver, "reports-status", f"the operator will see that {domain} should be safe")
    rows = wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#reports-table .report-row"))
    listed = api("/v1/reports")[1]["items"]
    assert [(r["domain"], r["verdict"], r["status"]) for r in listed] == [(domain, "safe", "open")], listed
    assert len(rows) == 1 and rows[0].get_attribute("data-report-id") == listed[0]["id"]
    for shown in (domain, "Safe", "a customer since 2019", "Open", "not yet"):
        assert shown in rows[0].text, (shown, rows[0].text)
    section_shot(driver, "panel-reports", "panel-reports-desktop")


def key_row(driver, key_id):
    return wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, f"#keys-table .key-row[data-key-id='{key_id}']"))[0]


def revoke(driver, key_id):
    key_row(driver, key_id).find_element(By.CSS_SELECTOR, ".key-revoke").click()
    accept_confirm(driver)
    wait(driver, lambda d: not d.find_elements(By.CSS_SELECTOR, f"#keys-table .key-row[data-key-id='{key_id}']"))


def check_keys(driver):
    """A new browser key: its secret shown once, working from its site only; rotated from the
    panel (a successor's secret shown once, the old key's end of overlap in the list, both
    working meanwhile); then both revoked (confirmed), and refused from then on."""
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
    old_id = new_row.get_attribute("data-key-id")
    assert old_id.startswith("key_"), old_id
    assert site in new_row.text and "never" in new_row.text, new_row.text
    assert secret not in driver.find_element(By.ID, "keys-table").text, "the list never shows a secret"

    new_row.find_element(By.CSS_SELECTOR, ".key-rotate").click()
    accept_confirm(driver)
    wait(driver, lambda d: text_of(d, "#new-key-secret").strip() not in ("", secret))
    successor = text_of(driver, "#new-key-secret").strip()
    keys = {k["id"]: k for k in api("/v1/keys")[1]["items"]}
    old = keys[old_id]
    new_id = old["rotated_to"]
    assert new_id and keys[new_id]["label"] == "browser test" and keys[new_id]["origins"] == [site], keys
    assert new_id in text_of(driver, "#new-key-id"), text_of(driver, "#new-key-id")
    until = old["expires_at"][:19].replace("T", " ")
    assert f"It replaces key {old_id}, which keeps working until {until} UTC" in text_of(driver, "#new-key-previous")
    wait(driver, lambda d: until in key_row(d, old_id).text and f"rotated to {new_id}" in key_row(d, old_id).text)
    assert successor not in driver.find_element(By.ID, "keys-table").text
    assert api("/v1/usage", key=successor, origin=site)[0] == 200, "the successor works"
    assert api("/v1/usage", key=secret, origin=site)[0] == 200, "the old key works during the overlap"

    revoke(driver, old_id)
    status_says(driver, "keys-status", f"Key {old_id} was revoked.")
    wait(driver, lambda d: not d.find_element(By.ID, "new-key-secret").is_displayed())
    revoke(driver, new_id)
    for gone in (secret, successor):
        assert api("/v1/usage", key=gone, origin=site)[0] == 401, "a revoked key is refused"
    return [old_id, new_id]


def check_webhooks(driver, listed):
    """A webhook made from the panel (its secret shown once, listed as the API lists it, the
    secret never in the list), then removed (confirmed). `listed()`: the API's list."""
    url = "https://hooks.example.com/drg"
    assert listed() == []
    driver.find_element(By.ID, "webhook-url").send_keys(url)
    driver.find_element(By.ID, "webhook-event-quota").click()  # verdict changes only
    driver.find_element(By.ID, "webhook-create").click()
    secret = wait(driver, EC.visibility_of_element_located((By.ID, "webhook-secret"))).text.strip()
    assert secret, "the secret is shown"
    hooks = listed()
    assert [(h["url"], h["events"]) for h in hooks] == [(url, ["verdict.changed"])], hooks
    row = wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, f"#webhooks-table .webhook-row[data-webhook-id='{hooks[0]['id']}']"))[0]
    assert url in row.text and "verdict changes" in row.text and "quota" not in row.text, row.text
    assert secret not in driver.find_element(By.ID, "webhooks-table").text, "the list never shows a secret"
    row.find_element(By.CSS_SELECTOR, ".webhook-remove").click()
    accept_confirm(driver)
    status_says(driver, "webhooks-status", f"Webhook {hooks[0]['id']} was removed.")
    wait(driver, lambda d: not d.find_elements(By.CSS_SELECTOR, "#webhooks-table .webhook-row"))
    assert not driver.find_element(By.ID, "webhook-secret").is_displayed()
    assert listed() == []


def check_audit(driver, entries):
    """The audit trail's newest page as the API has it. `entries()`: the API's newest 20."""
    def same(d):
        want = entries()
        rows = d.find_elements(By.CSS_SELECTOR, "#audit-table .audit-row")
        return want and [r.get_attribute("data-action") for r in rows] == [e["action"] for e in want] and rows
    rows = wait(driver, same)
    newest = entries()[0]
    for shown in (newest["key_id"], newest["target"]):
        assert shown in rows[0].text, (shown, rows[0].text)


def check_shipped(driver):
    """A gateway on the shipped defaults: the parts that are off there (verdict changes) are
    neither shown nor asked, at sign-in or at Refresh, and nothing fails in the console."""
    driver.get_log("browser")  # what came before is checked already
    sign_in(driver, SERVER_KEY, base=SHIPPED)
    wait(driver, lambda d: "calls" in text_of(d, "#usage-text"))
    settled(driver)
    driver.find_element(By.ID, "refresh").click()
    settled(driver)
    features = api("/v1/usage", base=SHIPPED)[1]["features"]
    assert not features["changes"], features
    check_parts(driver, features)
    assert "/v1/usage" in fetched(driver)
    errors = console_errors(driver, provoked=())
    assert not errors, errors
    driver.find_element(By.ID, "sign-out").click()
    wait(driver, EC.visibility_of_element_located((By.ID, "key-input")))


def with_fakes(driver, parts, check):
    """Runs `check()` with `parts` answered by tests/dashboard/fakes.js inside the page (the
    gateway does not serve them), then takes the stand-in away."""
    script = (Path(__file__).parent / "fakes.js").read_text().replace("FAKE_PARTS", json.dumps(parts))
    added = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": script})
    try:
        driver.refresh()  # signed in again from the tab's session storage
        wait(driver, lambda d: all(d.find_element(By.ID, f"panel-{p}").is_displayed() for p in parts))
        settled(driver)
        check()
    finally:
        driver.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": added["identifier"]})


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

        for panel in ("usage", "chart", "calls", "changes", "keys", "lookup", "top"):
            section_shot(driver, f"panel-{panel}", f"panel-{panel}-desktop")

        # What is on here: its panels shown, and what is off neither shown nor asked.
        features = api("/v1/usage")[1]["features"]
        assert all(features[p] for p in ("logs", "changes", "keys", "overrides", "reports")), features
        check_parts(driver, features)

        check_overrides(driver)
        check_reports(driver)
        made = check_keys(driver)

        # Webhooks and the audit trail: against the gateway when it serves them, else against a
        # stand-in of their documented shapes inside the page.
        webhooks = lambda: api("/v1/webhooks")[1]["items"]
        audit = lambda: api("/v1/audit?limit=20")[1]["items"]
        if features["webhooks"]:
            check_webhooks(driver, webhooks)
            section_shot(driver, "panel-webhooks", "panel-webhooks-desktop")
        if features["audit"]:
            check_audit(driver, audit)
            section_shot(driver, "panel-audit", "panel-audit-desktop")
            actions = [(e["action"], e["target"]) for e in audit()]
            for done in [("override.set", "site2.example.org"), ("override.removed", "site2.example.org"),
                         ("key.created", made[0]), ("key.rotated", made[0]), ("key.revoked", made[1])]:
                assert done in actions, (done, actions)
        errors = console_errors(driver, provoked=(" 401 ", " 403 ", "/v1/overrides/not_a_domain "))
        assert not errors, errors
        faked = [p for p in ("webhooks", "audit") if not features[p]]
        if faked:
            def stand_ins():
                held = lambda part: lambda: driver.execute_script(f"return window.drgFake.{part}")
                if "webhooks" in faked:
                    check_webhooks(driver, held("webhooks"))
                if "audit" in faked:
                    check_audit(driver, held("audit"))
            with_fakes(driver, faked, stand_ins)
            for part in faked:
                section_shot(driver, f"panel-{part}", f"panel-{part}-desktop")
            errors = console_errors(driver)
            assert not errors, errors

        # Sign-out clears the key.
        driver.find_element(By.ID, "sign-out").click()
        wait(driver, EC.visibility_of_element_located((By.ID, "key-input")))
        assert driver.execute_script("return sessionStorage.getItem('drg.key')") is None

        check_shipped(driver)

        # 375 px wide: still one readable column, no sideways scroll of the page.
        phone(driver, 375)
        sign_in(driver, SERVER_KEY)
        wait(driver, lambda d: "calls" in text_of(d, "#usage-text"))
        wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#chart .bar-calls")) == 30)
        assert driver.execute_script("return window.innerWidth") == 375
        overflow = driver.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, f"the page scrolls sideways by {overflow} px at 375 px"
        driver.execute_script("window.scrollTo(0, 0)")
        shot(driver, "dashboard-mobile")
        driver.find_element(By.ID, "lookup-input").send_keys("throwaway.example")
        driver.find_element(By.ID, "lookup-go").click()
        wait(driver, lambda d: "disposable" in text_of(d, "#lookup-result").lower())
        settled(driver)
        for panel in PANELS:
            section_shot(driver, f"panel-{panel}", f"panel-{panel}-mobile")
        errors = console_errors(driver)
        assert not errors, errors
    finally:
        driver.quit()

    # The page's files cost the month nothing; its calls count as any call: one top-domains call
    # per opening (two here, and the stand-ins' reload when they ran) and its three lookups; plus
    # this script's own top-domains call and its three lookups around the override (9, or 10).
    usage_after = api("/v1/usage")[1]["month_count"]
    print(json.dumps({"month_count_before": usage_before, "month_count_after": usage_after,
                      "faked": faked}))


if __name__ == "__main__":
    main()
