"""t2t-serve's request handling and batching as pure functions (no HTTP, no model): the
fields as LibreTranslate reads them, the line split and put-back, the key check, and the
batching thread driven by a stand-in translate function.

Each rule is checked against an independent statement of it (a per-line loop, urllib's
own encoder, a set of keys) on generated inputs.
"""

import threading
import time
import urllib.parse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from t2t_jax.serve import api
from t2t_jax.serve.batching import Batcher, QueueFullError, padded_cost, split_results
from tests import support

PAIR = api.Pair("en", "de")
PAIRS = api.Pairs((PAIR,))
LIMITS = api.Limits(char_limit=100, batch_limit=4, alternatives_limit=3)

lines_text = st.text(alphabet=st.sampled_from("ab \n\t"), max_size=30)


def per_line(text: str, f) -> str:
  """The reference: every line by itself, its leading and trailing whitespace kept, a blank
  line kept as it was (these lines hold no sentence end: one sentence a line)."""
  out = []
  for line in text.split("\n"):
    core = line.strip()
    out.append(line.replace(core, f(core), 1) if core else line)
  return "\n".join(out)


def _segments(texts):
  segment = pytest.importorskip("t2t_jax.serve.segment")
  return segment, [segment.split_text(t, "en") for t in texts]


@settings(max_examples=200, deadline=None)
@given(st.lists(lines_text, min_size=1, max_size=5))
def test_put_back_keeps_each_texts_lines_and_blank_lines(texts):
  segment, found = _segments(texts)
  f = lambda line: line.upper().replace(" ", "_") + "!"
  results = [f(s) for one in found for s in one.sentences]
  best, alternatives = segment.put_back(found, results)
  assert best == [per_line(t, f) for t in texts]
  assert [b.count("\n") for b in best] == [t.count("\n") for t in texts]
  assert alternatives == [[] for _ in texts]


@settings(max_examples=100, deadline=None)
@given(lines_text)
def test_split_and_join_are_inverse(text):
  assert api.join_lines(api.split_lines(text)) == text
  assert len(api.split_lines(text)) == text.count("\n") + 1


class Hyp:
  def __init__(self, text):
    self.text = text


@settings(max_examples=100, deadline=None)
@given(st.lists(lines_text, min_size=1, max_size=3), st.integers(1, 3))
def test_alternatives_take_each_sentences_kth_hypothesis(texts, k):
  # Sentence i's hypotheses: "i:0", "i:1", ... (as many as its length allows, at least one).
  segment, found = _segments(texts)
  sentences = [s for one in found for s in one.sentences]
  results = [[Hyp(f"{i}:{r}") for r in range(1 + len(s) % 3)] for i, s in enumerate(sentences)]
  best, alternatives = segment.put_back(found, results, k)
  counter = iter(range(len(sentences)))
  for text, one, alts in zip(texts, best, alternatives):
    lines = text.split("\n")
    ids = [next(counter) if line.strip() else None for line in lines]

    def hyp(i, r, line):
      if i is None:
        return line  # a blank line, as it was
      core = line.strip()
      return line.replace(core, results[i][min(r, len(results[i]) - 1)].text, 1)

    assert one == "\n".join(hyp(i, 0, line) for i, line in zip(ids, lines))
    expected = []
    for r in range(1, k + 1):
      alt = "\n".join(hyp(i, r, line) for i, line in zip(ids, lines))
      if alt != one and alt not in expected:
        expected.append(alt)
    assert alts == expected


def test_put_back_refuses_a_wrong_count():
  segment, found = _segments(["a\n\n"])
  with pytest.raises(ValueError, match="2 results for 1 sentences"):
    segment.put_back(found, ["x", "y"])


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["q", "source", "api_key", "x"]), st.text(max_size=8)))
def test_urlencoded_fields_read_what_urllib_encodes(fields):
  assert api.urlencoded_fields(urllib.parse.urlencode(fields).encode(), "body") == fields


def test_urlencoded_first_value_wins_and_query_comes_before_form():
  assert api.urlencoded_fields(b"q=a&q=b&x=", "body") == {"q": "a", "x": ""}
  assert api.merged_values({"q": "query"}, {"q": "form", "source": "en"}) == {
    "q": "query",
    "source": "en",
  }


@pytest.mark.parametrize("raw", [b"q=%ff%fe", b"q=\xff"])
def test_urlencoded_refuses_bytes_that_are_not_utf8(raw):
  with pytest.raises(api.ApiError, match="not UTF-8") as e:
    api.urlencoded_fields(raw, "the form body")
  assert e.value.status == 400


@pytest.mark.parametrize(
  "body, message",
  [
    (b"{", "Invalid JSON format"),
    (b"[1]", "an object"),
    (b'"q"', "an object"),
    (b"\xff", "UTF-8"),
    (b"[" * 100000 + b"]" * 100000, "Invalid JSON format"),
  ],
)
def test_json_fields_refuse_what_is_not_one_object(body, message):
  with pytest.raises(api.ApiError, match=message):
    api.json_fields(body)


def test_json_content_types_as_flask_reads_them():
  assert api.is_json("application/json; charset=utf-8")
  assert api.is_json("application/merge-patch+json")
  assert not api.is_json("text/plain")
  assert api.is_form("application/x-www-form-urlencoded; charset=utf-8")


def fields(**kw):
  return dict(dict(q="a b", source="en", target="de"), **kw)


def test_a_string_q_is_one_text_and_a_list_stays_a_list():
  one = api.parse_translate(fields(), True, PAIRS, LIMITS)
  many = api.parse_translate(fields(q=["a", "", "b"]), True, PAIRS, LIMITS)
  assert (one.texts, one.is_list) == (("a b",), False)
  assert (many.texts, many.is_list) == (("a", "", "b"), True)
  answer = api.translate_answer(one, ["x"], [[]])
  assert answer == {"translatedText": "x"}
  answer = api.translate_answer(many, ["x", "", "y"], [[], [], []])
  assert answer == {"translatedText": ["x", "", "y"]}


@pytest.mark.parametrize(
  "given, status, message",
  [
    (dict(q=None), 400, "missing q parameter"),
    (dict(q=""), 400, "missing q parameter"),
    (dict(q=[]), 400, "missing q parameter"),
    (dict(q=3), 400, "q must be a string or a list of strings"),
    (dict(q=["a", 3]), 400, "q must be a string or a list of strings"),
    (dict(source=""), 400, "missing source parameter"),
    (dict(target=None), 400, "missing target parameter"),
    (dict(source="fr"), 400, "fr is not supported"),
    (dict(target="fr"), 400, "fr is not supported"),
    (dict(target=["de"]), 400, "target must be a language code"),
    (dict(format="xml"), 400, "xml format is not supported"),
    (dict(alternatives="many"), 400, "alternatives parameter is not a number"),
    (dict(alternatives=4), 400, "alternatives parameter must be <= 3"),
    (dict(alternatives=10000), 400, "alternatives parameter must be <= 3"),
    (dict(q="x" * 101), 400, r"request \(101\) exceeds text limit \(100\)"),
    (dict(q=["x" * 60, "y" * 101]), 400, r"request \(101\) exceeds text limit \(100\)"),
    (dict(q=["a"] * 5), 400, r"request \(5\) exceeds text limit \(4\)"),
  ],
)
def test_refusals_name_the_field(given, status, message):
  with pytest.raises(api.ApiError, match=message) as e:
    api.parse_translate(fields(**given), True, PAIRS, LIMITS)
  assert e.value.status == status


def test_libretranslate_defaults_and_readings():
  req = api.parse_translate(fields(alternatives="-2", format=""), False, PAIRS, LIMITS)
  assert req.alternatives == 0
  assert api.parse_translate(fields(alternatives="2"), False, PAIRS, LIMITS).alternatives == 2
  assert api.parse_translate(fields(q="x" * 100), True, PAIRS, LIMITS).texts == ("x" * 100,)
  each = api.parse_translate(fields(q=["x" * 60, "y" * 41]), True, PAIRS, LIMITS)  # per text
  assert each.texts == ("x" * 60, "y" * 41)
  no_limit = api.Limits(char_limit=-1, batch_limit=-1, alternatives_limit=-1)
  assert api.parse_translate(fields(q=["x"] * 999, alternatives=50), True, PAIRS, no_limit)
  auto = api.parse_translate(fields(source="auto"), True, PAIRS, LIMITS)
  detected = api.translate_answer(auto, ["x"], [[]], [("en", 100.0)])["detectedLanguage"]
  assert detected == {"confidence": 100.0, "language": "en"}


def test_form_bodies_have_their_line_ends_normalised_and_json_bodies_not():
  assert api.parse_translate(fields(q="a\r\nb\rc"), False, PAIRS, LIMITS).texts == ("a\nb\nc",)
  assert api.parse_translate(fields(q="a\r\nb"), True, PAIRS, LIMITS).texts == ("a\r\nb",)


def test_alternatives_appear_only_when_asked_for():
  req = api.parse_translate(fields(alternatives=2), True, PAIRS, LIMITS)
  answer = api.translate_answer(req, ["x"], [["y", "z"]])
  assert answer == {"translatedText": "x", "alternatives": ["y", "z"]}


@settings(max_examples=100, deadline=None)
@given(
  st.sets(st.text(alphabet="abc123", min_size=1, max_size=6), min_size=1, max_size=4),
  st.text(alphabet="abc123", max_size=6),
)
def test_key_check_accepts_exactly_the_listed_keys(keys, given_key):
  keys = frozenset(keys)
  api.check_key(given_key, None)  # no keys file: keys are ignored
  if given_key in keys:
    api.check_key(given_key, keys)
    return
  with pytest.raises(api.ApiError) as e:
    api.check_key(given_key, keys)
  assert e.value.status == (400 if not given_key else 403)  # LibreTranslate's
  assert ("get an API key" if not given_key else "Invalid API key") in e.value.message


def test_languages_list_the_pair():
  assert PAIR.languages() == [
    {"code": "en", "name": "English", "targets": ["de"]},
    {"code": "de", "name": "German", "targets": []},
  ]


THREE = api.Pairs((api.Pair("en", "de"), api.Pair("de", "en"), api.Pair("en", "fr")))


def test_languages_list_every_source_with_its_targets_as_libretranslate():
  assert THREE.languages() == [
    {"code": "en", "name": "English", "targets": ["de", "fr"]},
    {"code": "de", "name": "German", "targets": ["en"]},
    {"code": "fr", "name": "French", "targets": []},
  ]
  assert THREE.sources_into("en") == ["de"] and THREE.sources_into("de") == ["en"]
  assert THREE.sources_into("fr") == ["en"] and THREE.sources_into("es") == []


@pytest.mark.parametrize(
  "source, target, message",
  [
    ("es", "de", "es is not supported"),
    ("en", "es", "es is not supported"),
    ("de", "fr", "French (fr) is not available as a target language from German (de)"),
    ("fr", "en", "English (en) is not available as a target language from French (fr)"),
    ("\ud800" * 50, "de", "\ud800" * 40 + "... is not supported"),  # cut short
  ],
)
def test_a_pair_not_served_is_libretranslates_400(source, target, message):
  with pytest.raises(api.ApiError) as e:
    api.parse_translate(fields(source=source, target=target), True, THREE, LIMITS)
  assert e.value.status == 400 and message in e.value.message
  assert len(e.value.message) < 300


def test_each_pair_is_chosen_and_auto_needs_a_served_target():
  for pair in THREE.pairs:
    req = api.parse_translate(fields(source=pair.source, target=pair.target), True, THREE, LIMITS)
    assert (req.source, req.target, req.detect) == (pair.source, pair.target, False)
  auto = api.parse_translate(fields(source="auto", target="fr"), True, THREE, LIMITS)
  assert auto.detect and auto.target == "fr"
  with pytest.raises(api.ApiError, match="es is not supported"):
    api.parse_translate(fields(source="auto", target="es"), True, THREE, LIMITS)
  with pytest.raises(ValueError, match="two models for the pair en-de"):
    api.Pairs((api.Pair("en", "de"), api.Pair("en", "de")))


def test_lone_surrogates_in_texts_become_replacement_characters():
  req = api.parse_translate(fields(q=["a\ud800b", "\udfff"]), True, PAIRS, LIMITS)
  assert req.texts == ("a\ufffdb", "\ufffd")
  for text in req.texts:
    text.encode("utf-8")
  api.check_key("\ud800", None)
  with pytest.raises(api.ApiError, match="Invalid API key"):
    api.check_key("\ud800", frozenset({"k"}))


# --- batching -------------------------------------------------------------------------------


def test_split_results_and_padded_cost():
  assert split_results(list("abcdef"), [2, 0, 3, 1]) == [["a", "b"], [], ["c", "d", "e"], ["f"]]
  with pytest.raises(ValueError):
    split_results(list("abc"), [1, 1])
  assert padded_cost(["ab", "abcd", ""]) == 12


class Recorder:
  """A stand-in model: each line's answer is a function of the line alone; calls recorded."""

  def __init__(self, delay: float = 0.0) -> None:
    self.calls: list[list[str]] = []
    self.delay = delay

  def __call__(self, lines: list[str], nbest: int) -> list:
    self.calls.append(list(lines))
    time.sleep(self.delay)
    if nbest:
      return [[f"{line}/{r}" for r in range(nbest)] for line in lines]
    return [line[::-1] for line in lines]


def test_concurrent_requests_share_a_batch_and_each_gets_its_own_answer():
  model = Recorder(delay=0.05)
  batcher = Batcher(model, window_s=0.05)
  batcher.start()
  try:
    requests = [[f"r{i} line{j}" for j in range(i % 3 + 1)] for i in range(12)]
    futures = [batcher.submit(lines) for lines in requests]
    futures.append(batcher.submit(["r12 line0"], nbest=2))
    for lines, future in zip(requests, futures):
      assert future.result(5) == [line[::-1] for line in lines]
    assert futures[-1].result(5) == [["r12 line0/0", "r12 line0/1"]]
  finally:
    batcher.stop()
  assert len(model.calls) < len(futures)  # batched: fewer model calls than requests
  assert batcher.stats.requests == len(futures)


def test_concurrent_threads_get_their_own_answers():
  batcher = Batcher(Recorder(), window_s=0.01)
  batcher.start()
  errors = []

  def client(i: int) -> None:
    for k in range(20):
      lines = [f"{i}-{k}-{j}" for j in range((i + k) % 4)]
      if batcher.submit(lines).result(5) != [line[::-1] for line in lines]:
        errors.append((i, k))

  threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  batcher.stop()
  assert not errors


def test_a_cancelled_request_is_dropped_from_the_queue():
  model = Recorder(delay=0.2)
  batcher = Batcher(model, window_s=0.0)
  batcher.start()
  try:
    first = batcher.submit(["busy"])
    time.sleep(0.05)  # the model is translating "busy"
    gone = batcher.submit(["never"])
    assert gone.cancel()
    assert batcher.submit(["after"]).result(5) == ["retfa"]
    assert first.result(5) == ["ysub"]
  finally:
    batcher.stop()
  assert ["never"] not in model.calls and batcher.stats.dropped == 1


def test_a_full_queue_refuses_and_stop_finishes_what_is_queued():
  model = Recorder(delay=0.2)
  batcher = Batcher(model, window_s=0.0, max_queue_lines=3)
  batcher.start()
  first = batcher.submit(["a"])
  time.sleep(0.05)
  queued = batcher.submit(["b", "c", "d"])
  with pytest.raises(QueueFullError, match="at most 3"):
    batcher.submit(["e"])
  batcher.stop()
  assert first.result(0) == ["a"] and queued.result(0) == ["b", "c", "d"]
  with pytest.raises(QueueFullError, match="shutting down"):
    batcher.submit(["f"])


def test_a_batch_respects_its_padded_size_cap():
  model = Recorder()
  batcher = Batcher(model, window_s=0.05, max_batch_chars=40)
  futures = [batcher.submit(["x" * 10]) for _ in range(6)]
  batcher.start()
  for f in futures:
    f.result(5)
  batcher.stop()
  assert [len(c) for c in model.calls] == [4, 2]


class Overlap:
  """A stand-in model that records how many of its calls ran at once, at most."""

  def __init__(self, delay: float) -> None:
    self.delay = delay
    self.lock = threading.Lock()
    self.now = self.most = 0
    self.calls = 0

  def __call__(self, lines: list[str], nbest: int) -> list:
    with self.lock:
      self.now += 1
      self.calls += 1
      self.most = max(self.most, self.now)
    time.sleep(self.delay)
    with self.lock:
      self.now -= 1
    return [line[::-1] for line in lines]


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_workers_run_that_many_batches_at_once_and_each_request_gets_its_answer(workers):
  model = Overlap(delay=0.1)
  batcher = Batcher(model, window_s=0.0, max_batch_chars=4, workers=workers)
  lines = [f"l{i:02d}" for i in range(6)]
  futures = [batcher.submit([line]) for line in lines]  # one line per batch
  batcher.start()
  try:
    assert [f.result(5) for f in futures] == [[line[::-1]] for line in lines]
  finally:
    batcher.stop()
  assert model.calls == 6 and model.most == workers
  assert batcher.stats.batches == 6


def test_a_call_runs_alone_beside_no_batch_and_the_next_waits_for_it():
  model = Overlap(delay=0.05)
  seen = []

  def call():
    seen.append(model.now)  # batches running while the call runs
    time.sleep(0.1)
    seen.append(model.now)
    return "done"

  batcher = Batcher(model, window_s=0.0, max_batch_chars=4, workers=2)
  before = [batcher.submit([f"a{i}"]) for i in range(3)]
  loaded = batcher.call(call)
  after = [batcher.submit([f"b{i}"]) for i in range(3)]
  batcher.start()
  try:
    assert loaded.result(5) == "done"
    assert [f.result(5) for f in before + after] == [[f"{i}{c}"] for c in "ab" for i in range(3)]
  finally:
    batcher.stop()
  assert seen == [0, 0] and model.most == 2


def test_workers_must_be_at_least_one():
  with pytest.raises(ValueError, match="workers=0"):
    Batcher(Recorder(), workers=0)


def test_a_model_error_is_the_answer_of_its_batch_only():
  def model(lines, nbest):
    if "bad" in lines:
      raise RuntimeError("broken")
    return lines

  batcher = Batcher(model, window_s=0.0)
  batcher.start()
  with pytest.raises(RuntimeError, match="broken"):
    batcher.submit(["bad"]).result(5)
  assert batcher.submit(["good"]).result(5) == ["good"]
  batcher.stop()


def test_only_the_worker_calls_decoding_and_the_pure_modules_need_no_server_library():
  import ast
  import pathlib

  import t2t_jax.serve

  root = pathlib.Path(t2t_jax.serve.__file__).parent
  for path in sorted(root.glob("*.py")):
    tree = support.parse_source(path)
    modules = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    modules += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    model_side = [m for m in modules if m.startswith(("t2t_jax.translate", "t2t_jax.decoding"))]
    assert not model_side or path.name == "worker.py", (path.name, model_side)
    server_side = [m for m in modules if m.split(".")[0] in ("starlette", "uvicorn")]
    assert not server_side or path.name == "app.py", (path.name, server_side)
