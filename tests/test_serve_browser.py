"""t2t-serve's page in a real browser: the distribution's Chromium driven by playwright
(`.ci/run` installs both; no browser is downloaded). Typing a sentence and pressing
Translate shows the translation and a heat map labelled with the pieces; the layer and
head pickers, the n-best and an inline error work from the keyboard; the language picker
lists the served pairs, picks the model and survives a reload; a text of 20 lines has maps
for the first 16 and says so; a page opened while the model loads fills in once it is
ready; the heat map's cells are read from the keyboard.

The server is the app over stand-in models (serve_support.FakeModel, one per pair, each
marking its answers), so the test checks the page, not a model: one server and one browser
for the module. Skips, with the reason, where playwright or a Chromium executable is
missing.
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


MODELS = (("en-de", ""), ("de-en", "deen:"), ("en-fr", "enfr:"))


@pytest.fixture(scope="module")
def browser():
  sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install 't2t_jax[browser]')"
  )
  pytest.importorskip("uvicorn")
  executable = chromium_path()
  with sync_api.sync_playwright() as p:
    try:
      browser = p.chromium.launch(executable_path=executable)
    except sync_api.Error as e:
      pytest.skip(f"{executable} does not start under playwright: {str(e).splitlines()[0]}")
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def port(browser):
  models = [ss.FakeModel(pair=pair, mark=mark) for pair, mark in MODELS]
  with ss.in_process(models, frontend_timeout_ms=200) as port:
    yield port


def open_page(browser, port):
  """A tab of its own (its own localStorage), the page ready."""
  tab = browser.new_context().new_page()
  tab.goto(f"http://127.0.0.1:{port}/")
  tab.wait_for_selector("#pair:not(:empty)")
  return tab


@pytest.fixture(scope="module")
def page(browser, port):
  tab = open_page(browser, port)
  yield tab
  tab.context.close()


def translated(page, expected: str) -> None:
  page.wait_for_function(
    "expected => document.querySelector('#translation').textContent === expected", arg=expected
  )


def options(page, selector: str) -> list[str]:
  return page.locator(f"{selector} option").all_text_contents()


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


def test_the_picker_lists_the_pairs_picks_the_model_and_survives_a_reload(browser, port):
  tab = open_page(browser, port)
  try:
    assert options(tab, "#source-lang") == ["English (en)", "German (de)"]
    assert options(tab, "#target-lang") == ["German (de)", "French (fr)"]
    assert tab.is_visible("#swap")  # de-en is served
    tab.fill("#source", "ab cd")
    tab.click("#translate")
    translated(tab, "dc ba")
    tab.select_option("#target-lang", "fr")
    translated(tab, "enfr:dc ba")
    assert tab.is_hidden("#swap")  # no fr-en model
    tab.select_option("#source-lang", "de")  # German's one target
    assert options(tab, "#target-lang") == ["English (en)"]
    translated(tab, "deen:dc ba")
    assert "source=de&target=en" in tab.url
    assert tab.text_content("#pair") == "German (de) \u2192 English (en)"
    tab.reload()
    tab.wait_for_selector("#pair:not(:empty)")
    assert (tab.input_value("#source-lang"), tab.input_value("#target-lang")) == ("de", "en")
    tab.goto(tab.url.split("#")[0])  # no hash: localStorage keeps the pair
    tab.wait_for_selector("#pair:not(:empty)")
    assert (tab.input_value("#source-lang"), tab.input_value("#target-lang")) == ("de", "en")
    tab.fill("#source", "ab cd")
    tab.click("#translate")
    translated(tab, "deen:dc ba")
    tab.click("#swap")  # the translation becomes the text, into English's model
    assert (tab.input_value("#source-lang"), tab.input_value("#target-lang")) == ("en", "de")
    assert tab.input_value("#source") == "deen:dc ba"
    translated(tab, "ab cd:need")
  finally:
    tab.context.close()


def test_twenty_lines_translate_with_maps_for_the_first_sixteen(page):
  lines = [f"w{i} x" for i in range(20)]
  page.fill("#source", "\n".join(lines))
  page.click("#translate")
  translated(page, "\n".join(ss.FakeModel().answer(line) for line in lines))
  page.select_option("#layer", "avg")
  assert page.is_visible("#attention-note")
  assert "attention shown for the first 16 lines" in page.text_content("#attention-note")
  assert page.locator("#line option").count() == 20
  assert page.locator("#heatmap thead th").all_text_contents()[1:] == ["w0", "x", "</s>"]
  page.select_option("#line", "17")  # past the 16: its map is fetched when chosen
  column = "document.querySelector('#heatmap thead th:nth-child(2)').textContent"
  page.wait_for_function(f"{column} === 'w17'")
  assert page.locator("#heatmap tbody th").all_text_contents() == ["x", "71w", "</s>"]
  page.select_option("#layer", "2")
  page.select_option("#head", "1")  # one layer's heads, fetched for the line
  page.wait_for_function("document.querySelectorAll('#heatmap tbody td').length === 9")
  assert page.is_hidden("#error")


def test_a_heat_map_cell_is_read_from_the_keyboard(page):
  page.fill("#source", "hello big world")
  page.click("#translate")
  translated(page, "dlrow gib olleh")
  page.select_option("#layer", "0")
  page.focus("#head")
  page.keyboard.press("Tab")  # into the map: one cell in the Tab order
  focused = "document.activeElement.getAttribute('aria-label')"
  assert page.evaluate(focused) == "target dlrow, source hello: weight 0.250"
  assert page.text_content("#cell-value") == "target dlrow, source hello: weight 0.250"
  page.keyboard.press("ArrowRight")
  page.keyboard.press("ArrowDown")
  assert page.text_content("#cell-value") == "target gib, source big: weight 0.250"
  page.keyboard.press("End")
  assert page.evaluate(focused) == "target gib, source </s>: weight 0.250"
  assert page.locator("#heatmap td[tabindex='0']").count() == 1
  page.keyboard.press("Shift+Tab")
  assert page.evaluate("document.activeElement.id") == "head"


def test_a_page_opened_while_the_model_loads_fills_in_once_it_is_ready(browser):
  model = ss.FakeModel(loaded=False)
  with ss.in_process([model, ss.FakeModel(pair="de-en")], frontend_timeout_ms=200) as port:
    tab = browser.new_context().new_page()
    try:
      tab.goto(f"http://127.0.0.1:{port}/")
      tab.wait_for_function("document.querySelector('#status').textContent.includes('loading')")
      assert tab.text_content("#pair") == "" and options(tab, "#source-lang") == []
      assert tab.is_disabled("#translate")
      tab.fill("#source", "early words")  # typed while loading: translated once ready
      model.release.set()
      tab.wait_for_selector("#pair:not(:empty)")
      assert tab.text_content("#pair") == "English (en) \u2192 German (de)"
      assert options(tab, "#source-lang") == ["English (en)", "German (de)"]
      assert options(tab, "#nbest") == ["none", "1", "2", "3"]
      translated(tab, "sdrow ylrae")
      assert tab.text_content("#status") == ""
    finally:
      tab.context.close()
