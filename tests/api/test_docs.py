"""The interactive API documentation at /api/docs: served from packaged assets, so it works offline."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from live_api import LiveServer, assert_error
from playwright.sync_api import Browser, Page, Route, expect, sync_playwright

from fleet_api.auth import is_loopback
from fleet_kernel.config import Settings

TOKEN = "s3cret-token-for-tests-0123456789abcdef"  # token_settings' token
CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


def test_docs_redirects_and_assets_are_local(client: httpx.Client) -> None:
    redirect = client.get("/docs")
    assert redirect.status_code == 307 and redirect.headers["location"] == "/api/docs"
    page = client.get("/api/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assets = re.findall(r"""(?:src|href)=['"]([^'"]+)['"]""", page.text)
    assert assets and all(url.startswith("/api/docs/") for url in assets), assets
    for url in assets:
        assert client.get(url).status_code == 200, url
    assert_error(client.get("/api/docs/static/no-such-file.js"), 404, "not_found")


def test_docs_need_no_token_but_the_api_does(token_settings: Settings) -> None:
    with LiveServer(token_settings) as live, httpx.Client(base_url=live.url) as client:
        for path in ("/docs", "/api/docs", "/api/docs/static/swagger-ui-bundle.js", "/api/openapi.json"):
            assert client.get(path).status_code in (200, 307), path
        assert_error(client.get("/api/sessions"), 401, "unauthorized")
        assert_error(client.get("/api/docs-not-really"), 401, "unauthorized")


# ---------------------------------------------------------------------- in a browser, with no network


@pytest.fixture
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (apt-get install chromium)")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


def offline_page(browser: Browser, blocked: list[str]) -> Page:
    """A page whose requests reach only this machine; every other request fails and is noted in ``blocked``."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})

    def only_loopback(route: Route) -> None:
        url = route.request.url
        parts = urlsplit(url)
        if parts.scheme in ("data", "blob") or (parts.hostname and is_loopback(parts.hostname)):
            route.continue_()
        else:
            blocked.append(url)
            route.abort("internetdisconnected")

    page.route("**/*", only_loopback)
    return page


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.parametrize("with_token", [False, True], ids=["loopback", "token"])
def test_docs_render_offline(browser: Browser, settings: Settings, token_settings: Settings, with_token: bool) -> None:
    with LiveServer(token_settings if with_token else settings) as live:
        blocked: list[str] = []
        page = offline_page(browser, blocked)
        page.goto(f"{live.url}/docs")
        assert page.url == f"{live.url}/api/docs"
        sessions = page.locator('.opblock-summary-path[data-path="/api/sessions"]').first
        expect(sessions).to_be_visible(timeout=30_000)
        expect(page.locator(".opblock").first).to_be_visible()
        expect(page.get_by_text("Fleet API", exact=False).first).to_be_visible()
        if with_token:  # Authorize with the token, then "Try it out" lists the sessions
            page.locator(".btn.authorize").first.click()
            page.locator(".auth-container input").first.fill(TOKEN)
            page.locator(".auth-btn-wrapper .btn.authorize").first.click()
            page.locator(".btn-done").first.click()
            listing = page.locator("#operations-sessions-list_sessions_api_sessions_get")
            listing.locator(".opblock-summary").first.click()
            listing.get_by_role("button", name="Try it out").click()
            listing.get_by_role("button", name="Execute").click()
            expect(listing.locator(".live-responses-table tr.response .response-col_status")).to_have_text("200")
        assert blocked == [], f"the docs page reached beyond this machine: {blocked}"
