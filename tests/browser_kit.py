"""What the browser tests share: Debian's Chromium driven by Playwright, a page with a screenshot helper, and a
superuser logged in through the real login form. Never run ``playwright install``: the system Chromium is used
(``apt-get install chromium``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

sync_api = pytest.importorskip("playwright.sync_api", reason="browser tests need the playwright package "
                               "(pip install playwright; the system Chromium is used, no `playwright install`)")

CHROMIUM = os.environ.get("WEFT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
DOCS_SCREENSHOTS = ROOT / "docs" / "screenshots"
UPDATE_DOCS = os.environ.get("WEFT_UPDATE_DOCS_SCREENSHOTS") == "1"
USERNAME, PASSWORD = "browser-admin", "browser-pw"
TIMEOUT_MS = 15_000

browser_marks = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),  # live_server's thread must see what the test writes
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK),
                       reason=f"browser tests need Chromium at {CHROMIUM} (apt-get install chromium)"),
]

expect = sync_api.expect
expect.set_options(timeout=TIMEOUT_MS)


@pytest.fixture(scope="module")
def chromium() -> Iterator[sync_api.Browser]:
    # Playwright's sync API keeps an asyncio loop running in this thread; Django then refuses ORM calls
    # ("async context") although the test code is plain synchronous code. Allowed for these modules only.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                yield browser
            finally:
                browser.close()


class Browser:
    """One page of a fresh browser context, with the dialogs it raised and a screenshot helper."""

    def __init__(self, page: sync_api.Page, base_url: str, name: str) -> None:
        self.page = page
        self.base_url = base_url
        self.name = name
        self.dialogs: list[str] = []
        page.on("dialog", self._on_dialog)

    def _on_dialog(self, dialog: sync_api.Dialog) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def goto(self, path: str) -> None:
        self.page.goto(self.base_url + path)

    def shot(self, step: str, *, full_page: bool = True, docs: bool = False) -> Path:
        """A screenshot under artifacts/; with ``docs``, under docs/screenshots/ when it is missing or
        WEFT_UPDATE_DOCS_SCREENSHOTS=1 asks for fresh ones."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        target = SCREENSHOTS / f"{self.name}-{step}.png"
        self.page.screenshot(path=str(target), full_page=full_page)
        documented = DOCS_SCREENSHOTS / f"{step}.png"
        if docs and (UPDATE_DOCS or not documented.exists()):
            DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(documented), full_page=full_page)
        return target

    def confirm(self, label: str) -> None:
        """On an operation's confirmation page, press "Yes, <label>"."""
        expect(self.page.locator("body.weft-confirmation")).to_be_visible()
        self.page.get_by_role("button", name=f"Yes, {label}").click()
        self.page.wait_for_load_state()

    def messages(self) -> str:
        """The page's messages, once it has loaded: a URL that changed says the new page began, not that the
        browser has parsed it (on a loaded machine the list was read while it was still empty)."""
        self.page.wait_for_load_state()
        return self.page.locator("ul.messagelist").inner_text()


def log_in(chromium: sync_api.Browser, base_url: str, name: str, username: str, password: str, *,
           width: int = 1280, height: int = 900) -> tuple[sync_api.BrowserContext, Browser]:
    """A fresh browser context logged in through the real login form."""
    context = chromium.new_context(viewport={"width": width, "height": height})
    context.set_default_timeout(TIMEOUT_MS)
    browser = Browser(context.new_page(), base_url.rstrip("/"), name)
    browser.goto("/admin/login/?next=/admin/")
    browser.page.fill("#id_username", username)
    browser.page.fill("#id_password", password)
    browser.page.get_by_role("button", name="Log in").click()
    expect(browser.page.locator("#user-tools")).to_contain_text(username)
    return context, browser


@pytest.fixture
def admin(chromium: sync_api.Browser, live_server: object, request: pytest.FixtureRequest) -> Iterator[Browser]:
    """A superuser logged in through the real login form, in a 1280-pixel-wide window."""
    get_user_model().objects.create_superuser(USERNAME, "browser@example.com", PASSWORD)
    context, browser = log_in(chromium, str(live_server), request.node.name.removeprefix("test_"), USERNAME, PASSWORD)
    try:
        yield browser
    finally:
        context.close()


def run_path(run_id: object, what: str = "change") -> str:
    return f"/admin/django_weft/workflow/{run_id}/{what}/"
