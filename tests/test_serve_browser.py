"""t2t-serve's page in a real browser: the distribution's Chromium driven by playwright
(`.ci/run` installs both; no browser is downloaded). Typing a sentence and pressing
Translate shows the translation and a heat map labelled with the pieces; the layer and
head pickers, the n-best and an inline error work from the keyboard.

The server is the app over the stand-in model (serve_support.FakeModel), so the test
checks the page, not a model. Skips, with the reason, where playwright or a Chromium
executable is missing.
"""

import os
import shutil

import pytest

from tests import serve_support as ss


def chromium_path() -> str:
  """$T2T_CHROMIUM, else the distribution's chromium on PATH."""
  for candidate in (os.environ.get("T2T_CHROMIUM"), "chromium", "chromium-browser"):
    found = candidate and shutil.which(candidate)
    if found:
      return found
  pytest.skip("no Chromium executable on PATH (apt-get install chromium, or set $T2T_CHROMIUM)")


@pytest.fixture(scope="module")
def page():
  sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install 't2t_jax[browser]')"
  )
  pytest.importorskip("uvicorn")
  executable = chromium_path()
  server = ss.in_process(ss.FakeModel(), frontend_timeout_ms=200)
  with server as port, sync_api.sync_playwright() as p:
    try:
      browser = p.chromium.launch(executable_path=executable)
    except sync_api.Error as e:
      pytest.skip(f"{executable} does not start under playwright: {str(e).splitlines()[0]}")
    tab = browser.new_page()
    tab.goto(f"http://127.0.0.1:{port}/")
    tab.wait_for_selector("#pair:not(:empty)")
    yield tab
    browser.close()


def test_typing_and_pressing_translate_shows_translation_and_heat_map(page):
  page.fill("#source", "")
  page.locator("#source").type("hello big world")
  page.click("#translate")
  page.wait_for_function("document.querySelector('#translation').textContent.length > 0")
  assert page.text_content("#translation") == "dlrow gib olleh"
  assert page.is_visible("#heatmap")
  columns = page.locator("#heatmap thead th").all_text_contents()[1:]
  rows = page.locator("#heatmap tbody th").all_text_contents()
  assert columns == ["hello", "big", "world", "</s>"]
  assert rows == ["dlrow", "gib", "olleh", "</s>"]
  assert page.locator("#heatmap tbody td").count() == 16
  assert "0.250" in page.locator("#heatmap tbody td").first.get_attribute("title")
  assert page.locator("#layer option").all_text_contents() == ["average", "1", "2", "3"]
  assert page.locator("#head option").all_text_contents() == ["average", "1", "2"]


def test_keyboard_only_nbest_and_pickers(page):
  page.focus("#source")
  page.keyboard.press("Control+A")
  page.keyboard.type("ab cd")
  page.focus("#nbest")
  page.select_option("#nbest", "2")
  page.focus("#source")
  page.keyboard.press("Control+Enter")
  # The best and its 2 alternatives, each with its score.
  page.wait_for_function("document.querySelectorAll('#alternatives li').length === 3")
  items = page.locator("#alternatives li").all_text_contents()
  assert items[0].startswith("dc ba") and "score" in items[0]
  assert items[1].startswith("dc ba ~1") and items[2].startswith("dc ba ~2")
  page.select_option("#layer", "1")
  page.select_option("#head", "0")
  assert page.locator("#heatmap tbody tr").count() == 3


def test_typing_alone_translates_after_a_pause(page):
  page.fill("#source", "")
  page.locator("#source").type("debounced words")
  page.wait_for_function("document.querySelector('#translation').textContent === 'sdrow decnuobed'")


def test_an_error_is_shown_inline(page):
  # Over the server's limit: the textarea's maxLength is lifted to let the request go.
  page.evaluate("document.querySelector('#source').maxLength = 100000")
  page.fill("#source", "x" * 6000)
  page.click("#translate")
  page.wait_for_selector("#error:not([hidden])")
  assert "exceeds text limit (5000)" in page.text_content("#error")
