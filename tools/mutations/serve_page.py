"""t2t-serve's page: the bounds of its attention answers (the line cap, the cut, the heads'
mean, shaping off the event loop, the note), the language picker (the pair sent, the targets
of the source, swap, the kept choice), settings refreshed once ready, the heat map's keys."""

from tools.mutations import Mutation

M = Mutation
APP = "t2t_jax/serve/app.py"
PAGE = "t2t_jax/serve/page.py"
JS = "t2t_jax/serve/static/page.js"
HTTP = ("tests/test_serve_page.py",)
BROWSER = ("tests/test_serve_browser.py",)
MUTATIONS = (
  M(
    "page_attention_cap_ignored",
    "every line of a page request gets a map: attention_lines bounds nothing",
    APP,
    "(len(todo) if cap == -1 else min(len(todo), max(0, cap)))",
    "(len(todo) if cap == -1 else len(todo))",
    HTTP,
  ),
  M(
    "page_note_missing",
    "lines without a map come back without the note that says why",
    APP,
    "note = page.lines_note(len(todo), mapped) if want_attention else None",
    "note = None",
    HTTP,
  ),
  M(
    "page_json_on_the_loop",
    "the page's answer is written as JSON on the event loop, which stalls every request",
    APP,
    'content = {"lines": answers, "attention_note": note}\n'
    "  body = await asyncio.get_running_loop().run_in_executor(None, page.json_body, content)",
    'content = {"lines": answers, "attention_note": note}\n  body = page.json_body(content)',
    HTTP,
  ),
  M(
    "page_map_uncut",
    "a long line's map is sent whole: its size grows with the square of the line",
    PAGE,
    "t, s = min(len(target), max_pieces), min(len(source), max_pieces)",
    "t, s = len(target), len(source)",
    HTTP,
  ),
  M(
    "page_first_head_for_the_mean",
    "a layer's map is its first head, not the mean of its heads",
    PAGE,
    "np.round(weights.mean(axis=1), 4)",
    "np.round(weights[:, 0], 4)",
    HTTP,
  ),
  M(
    "page_layer_unchecked",
    "a layer the model does not have is a 500 (an index error), not a 400",
    PAGE,
    "if not 0 <= layer < layers:",
    "if layer > layers:",
    HTTP,
  ),
  M(
    "page_target_not_sent",
    "the picker's target is not sent: the page's request is refused",
    JS,
    "withKey({ q, ...pair, alternatives",
    "withKey({ q, source: pair.source, alternatives",
    BROWSER,
  ),
  M(
    "page_targets_of_another_source",
    "the target picker lists the first source's targets whichever source is chosen",
    JS,
    'const targets = targetsOf($("source-lang").value);',
    "const targets = targetsOf(state.languages[0].code);",
    BROWSER,
  ),
  M(
    "page_swap_always_shown",
    "the swap button shows for a pair whose reverse no model serves",
    JS,
    '$("swap").hidden = !served({ source: target, target: source });',
    '$("swap").hidden = false;',
    BROWSER,
  ),
  M(
    "page_pair_not_stored",
    "the chosen pair is not kept in localStorage: a reload without the hash loses it",
    JS,
    "localStorage.setItem(PAIR_KEY, JSON.stringify({ source, target }));",
    'localStorage.setItem(PAIR_KEY, "null");',
    BROWSER,
  ),
  M(
    "page_settings_not_refreshed",
    "settings read while the model loads are kept: no alternatives once it is ready",
    JS,
    'settings = await getJSON("/frontend/settings"); // alternativesLimit is known once ready',
    "// alternativesLimit is known once ready",
    BROWSER,
  ),
  M(
    "page_arrow_right_moves_down",
    "ArrowRight in the heat map moves down a row instead of to the next source piece",
    JS,
    "ArrowRight: () => (s = Math.min(cols - 1, s + 1)),",
    "ArrowRight: () => (t = Math.min(rows - 1, t + 1)),",
    BROWSER,
  ),
)
