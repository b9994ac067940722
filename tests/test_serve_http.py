"""t2t-serve's HTTP side over a stand-in model (tests/serve_support.FakeModel), the app on
uvicorn in a thread: LibreTranslate's bodies (JSON, form, multipart, query), the answers'
shape, every refusal as JSON with its status, CORS, readiness, keys, a client that
disconnects, time-outs and a full queue, each followed by a correct translation.

The real model behind the real command: tests/test_serve.py.
"""

import os
import random
import re
import socket
import threading
import time
import urllib.parse

import pytest

from tests import serve_support as ss
from tests.serve_support import FakeModel, call, translate


@pytest.fixture(scope="module")
def port():
  pytest.importorskip("starlette")
  pytest.importorskip("uvicorn")
  with ss.in_process(FakeModel(), limits=_limits(), metrics=True) as port:
    yield port


def _limits(**kw):
  from t2t_jax.serve.api import Limits

  return Limits(**dict(dict(char_limit=2000, batch_limit=8, alternatives_limit=3), **kw))


def still_serving(port: int) -> None:
  answer = translate(port, q="still serving")
  assert (answer.status, answer.json) == (200, {"translatedText": "gnivres llits"})


def test_json_form_multipart_and_query_bodies_give_one_answer(port):
  expected = {"translatedText": "dlrow olleh"}
  fields = dict(q="hello world", source="en", target="de")
  assert translate(port, q="hello world").json == expected
  form = urllib.parse.urlencode(fields)
  assert (
    call(port, "POST", "/translate", form, "application/x-www-form-urlencoded").json == expected
  )
  assert call(port, "POST", "/translate?" + form).json == expected
  boundary = "xYzZY"
  parts = "".join(
    f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
    for k, v in fields.items()
  )
  multipart = f"{parts}--{boundary}--\r\n"
  answer = call(port, "POST", "/translate", multipart, f"multipart/form-data; boundary={boundary}")
  assert answer.json == expected
  # The query's fields come first, as werkzeug's request.values gives them.
  both = call(port, "POST", "/translate?q=from+query", form, "application/x-www-form-urlencoded")
  assert both.json == {"translatedText": "yreuq morf"}


def test_list_q_is_answered_by_a_list_with_its_blank_lines_kept(port):
  q = ["one two", "", "a\n\nb c\n", "  "]
  answer = translate(port, q=q)
  assert answer.status == 200
  # blank lines and whitespace come back as they were sent
  assert answer.json == {"translatedText": ["owt eno", "", "a\n\nc b\n", "  "]}


def test_alternatives_as_libretranslate_answers_them(port):
  one = translate(port, q="ab cd", alternatives=2).json
  assert one == {"translatedText": "dc ba", "alternatives": ["dc ba ~1", "dc ba ~2"]}
  many = translate(port, q=["ab", "x\ny"], alternatives="1").json
  assert many == {"translatedText": ["ba", "x\ny"], "alternatives": [["ba ~1"], ["x ~1\ny ~1"]]}


def test_languages_settings_health_and_page(port):
  assert call(port, "GET", "/languages").json[0] == {
    "code": "en",
    "name": "English",
    "targets": ["de"],
  }
  settings = call(port, "GET", "/frontend/settings").json
  assert settings["charLimit"] == 2000 and settings["language"]["target"]["code"] == "de"
  assert call(port, "GET", "/health").json == {"status": "ok", "ready": True}
  page = call(port, "GET", "/")
  assert page.status == 200 and b'<script src="/static/page.js">' in page.body
  assert b"http" not in page.body.replace(b"http-equiv", b"")  # nothing fetched from elsewhere
  assert call(port, "GET", "/static/page.js").headers["content-type"].startswith("text/javascript")


BAD_INPUT = [
  # name, (body, content type) or a path, status, message
  ("not JSON", ("{'q': 1", "application/json"), 400, "Invalid JSON format"),
  ("JSON not an object", ("[1, 2]", "application/json"), 400, "an object was expected"),
  ("JSON bytes not UTF-8", (b'{"q": "\xff"}', "application/json"), 400, "not UTF-8"),
  (
    "form bytes not UTF-8",
    (b"q=%ff&source=en&target=de", "application/x-www-form-urlencoded"),
    400,
    "not UTF-8",
  ),
  (
    "missing q",
    ('{"source": "en", "target": "de"}', "application/json"),
    400,
    "missing q parameter",
  ),
  (
    "empty q",
    ('{"q": "", "source": "en", "target": "de"}', "application/json"),
    400,
    "missing q parameter",
  ),
  (
    "unknown source",
    ('{"q": "a", "source": "xx", "target": "de"}', "application/json"),
    400,
    "xx is not supported",
  ),
  (
    "unknown target",
    ('{"q": "a", "source": "en", "target": "xx"}', "application/json"),
    400,
    "xx is not supported",
  ),
  (
    "another format",
    ('{"q": "a", "source": "en", "target": "de", "format": "xml"}', "application/json"),
    400,
    "xml format is not supported",
  ),
  (
    "alternatives=10000",
    ('{"q": "a", "source": "en", "target": "de", "alternatives": 10000}', "application/json"),
    400,
    "must be <= 3",
  ),
  (
    "over the character limit",
    ('{"q": "%s", "source": "en", "target": "de"}' % ("x" * 2001), "application/json"),
    400,
    "exceeds text limit (2000)",
  ),
  (
    "list over the batch limit",
    (
      '{"q": ["a","a","a","a","a","a","a","a","a"], "source": "en", "target": "de"}',
      "application/json",
    ),
    400,
    "exceeds text limit (8)",
  ),
  (
    "body over the byte limit",
    ("q=" + "x" * 200000, "application/x-www-form-urlencoded"),
    413,
    "bytes",
  ),
  ("unknown path", "/nowhere", 404, "Not Found"),
]


@pytest.mark.parametrize("name, sent, status, message", BAD_INPUT, ids=[b[0] for b in BAD_INPUT])
def test_bad_input_is_a_json_4xx_and_the_server_goes_on(port, name, sent, status, message):
  if isinstance(sent, str):
    answer = call(port, "GET", sent)
  else:
    answer = call(port, "POST", "/translate", sent[0], sent[1])
  assert answer.status == status, answer.body
  assert message in answer.json["error"]
  assert answer.headers["access-control-allow-origin"] == "*"
  still_serving(port)


def test_hundreds_of_lines_in_one_request(port):
  lines = [f"l{i}" if i % 7 else "" for i in range(400)]
  answer = translate(port, q="\n".join(lines))
  assert answer.status == 200
  assert answer.json["translatedText"].split("\n") == [FakeModel().answer(line) for line in lines]


def test_cors_headers_and_preflight(port):
  preflight = call(port, "OPTIONS", "/translate", headers={"Origin": "https://x.example"})
  assert preflight.status == 204
  assert preflight.headers["access-control-allow-methods"] == "GET, POST"
  assert "Content-Type" in preflight.headers["access-control-allow-headers"]
  for answer in (call(port, "GET", "/languages"), translate(port, q="")):
    assert answer.headers["access-control-allow-origin"] == "*"


def test_wrong_method_is_json(port):
  answer = call(port, "GET", "/translate")
  assert answer.status == 405 and "Method Not Allowed" in answer.json["error"]


def test_page_endpoint_gives_pieces_nbest_and_attention(port):
  answer = call(port, "POST", "/api/translate", dict(q="ab cd\n\nef", alternatives=1))
  lines = answer.json["lines"]
  assert [line["translation"] for line in lines] == ["dc ba", "", "fe"]
  assert lines[0]["nbest"][1] == {"text": "dc ba ~1", "score": -0.5, "log_prob": -1.0}
  att = lines[0]["attention"]
  assert att["source_tokens"] == ["ab", "cd", "</s>"] and att["target_tokens"] == [
    "dc",
    "ba",
    "</s>",
  ]
  assert lines[1]["attention"] is None
  assert call(port, "POST", "/api/translate", dict(q=["x"])).status == 400


def test_metrics(port):
  translate(port, q="counted")
  text = call(port, "GET", "/metrics").body.decode()
  assert "t2t_serve_queue_lines" in text and "t2t_serve_batches" in text
  assert 't2t_serve_request_seconds_count{endpoint="translate",status="200"}' in text


class _Compiling(FakeModel):
  """A stand-in that compiles a program for each new number of lines it translates, and
  one (1 line) in load(). Its constant is new in each process, so that no persistent
  compilation cache holds the programs."""

  def __init__(self, **kw) -> None:
    import jax

    super().__init__(**kw)
    salt = random.random()
    self._program = jax.jit(lambda x: x * salt)

  def load(self) -> None:
    super().load()
    self._compile(1)

  def _compile(self, n: int) -> None:
    import numpy as np

    self._program(np.zeros(n, np.float32))

  def translate(self, lines, nbest=0):
    self._compile(len(lines))
    return super().translate(lines, nbest)


def test_metrics_count_the_compilations_after_ready():
  """t2t_serve_compilations_after_ready: none for a shape compiled in load(), one for a
  batch of a shape met for the first time."""
  pytest.importorskip("uvicorn")
  with ss.in_process(_Compiling(), metrics=True, window_s=0.01) as port:
    value = lambda name: float(
      re.search(rf"^{name} (\S+)$", call(port, "GET", "/metrics").body.decode(), re.M)[1]
    )
    assert value("t2t_serve_compilations") >= 1
    translate(port, q="one line")
    assert value("t2t_serve_compilations_after_ready") == 0
    translate(port, q=["three", "new", "lines"])
    assert value("t2t_serve_compilations_after_ready") == 1


def test_keys_required_when_a_keys_file_is_given():
  pytest.importorskip("uvicorn")
  with ss.in_process(FakeModel(), keys=frozenset({"k1", "k2"})) as port:
    assert translate(port, q="a").status == 400
    assert translate(port, q="a").json["error"] == (
      "Please contact the server operator to get an API key"
    )
    assert translate(port, q="a", api_key="k3").json == {"error": "Invalid API key"}
    assert translate(port, q="ab", api_key="k2").json == {"translatedText": "ba"}
    form = "q=ab&source=en&target=de&api_key=k1"
    assert call(port, "POST", "/translate", form, "application/x-www-form-urlencoded").status == 200
    assert call(port, "POST", "/translate?" + form).status == 200
    assert call(port, "POST", "/api/translate", dict(q="ab")).status == 400
    assert call(port, "GET", "/frontend/settings").json["keyRequired"] is True


def test_not_ready_until_loaded_but_alive():
  pytest.importorskip("uvicorn")
  model = FakeModel(loaded=False)
  with ss.in_process(model) as port:
    assert call(port, "GET", "/health").json == {"status": "ok", "ready": False}
    for answer in (
      call(port, "GET", "/languages"),
      translate(port, q="a"),
      call(port, "GET", "/ready"),
    ):
      assert answer.status == 503 and "loading" in answer.json["error"]
    model.release.set()
    ss.wait_for(port, "/ready", timeout=10)
    assert translate(port, q="ab").json == {"translatedText": "ba"}


def _send_and_drop(port: int, body: bytes) -> None:
  raw = (
    b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
  )
  with socket.create_connection(("127.0.0.1", port)) as s:
    s.sendall(raw)
    time.sleep(0.2)


def test_a_disconnected_clients_queued_work_is_dropped():
  pytest.importorskip("uvicorn")
  model = FakeModel(delay=1.0)
  with ss.in_process(model, window_s=0.0) as port:
    busy = threading.Thread(target=translate, args=(port,), kwargs=dict(q="busy"))
    busy.start()
    time.sleep(0.3)  # the model is translating "busy"
    _send_and_drop(port, b'{"q": "gone away", "source": "en", "target": "de"}')
    busy.join()
    assert translate(port, q="after").json == {"translatedText": "retfa"}
  assert ["gone away"] not in model.calls


def test_timeout_and_full_queue_answer_503_json():
  pytest.importorskip("uvicorn")
  model = FakeModel()
  with ss.in_process(model, window_s=0.0, request_timeout_s=0.5, max_queue_lines=2) as port:
    model.gate.clear()
    held = threading.Thread(target=translate, args=(port,), kwargs=dict(q="held"))
    held.start()
    while not model.calls:
      time.sleep(0.01)
    queued = threading.Thread(target=translate, args=(port,), kwargs=dict(q="a\nb"))
    queued.start()
    time.sleep(0.2)
    full = translate(port, q="c")
    assert full.status == 503 and "the queue holds 2 lines" in full.json["error"]
    held.join()
    queued.join()
    late = translate(port, q="late")
    assert late.status == 503 and "timed out after 0.5s" in late.json["error"]
    model.gate.set()
    still_serving(port)


def test_the_load_benchmark_counts_what_the_server_did():
  pytest.importorskip("uvicorn")
  from t2t_jax.bench import serve as bench

  model = FakeModel(delay=0.02)
  with ss.in_process(model, metrics=True, window_s=0.01) as port:
    row = bench.load_run(port, ["ab cd", "ef"], clients=8, requests=40, pair=("en", "de"))
  assert row["clients"] == 8 and row["requests"] == 40
  assert sum(map(len, model.calls)) == 40  # every request reached the model once
  assert 1 < row["requests_per_batch"] <= 8  # 8 clients in a closed loop share batches
  assert 0 < row["p50_ms"] <= row["p95_ms"]


class _SlowOn(FakeModel):
  """A stand-in whose batches holding a line with 'slow' take `slow_s`."""

  def __init__(self, slow_s: float, **kw) -> None:
    super().__init__(**kw)
    self.slow_s = slow_s

  def translate(self, lines, nbest=0):
    if any("slow" in line for line in lines):
      time.sleep(self.slow_s)
    return super().translate(lines, nbest)


def test_the_two_pair_load_benchmark_reports_the_ratio_tail_latency_and_memory():
  pytest.importorskip("uvicorn")
  from t2t_jax.bench import serve as bench

  models = [_SlowOn(0.2, delay=0.02, pair=p) for p in ("en-de", "de-en")]
  # 50 sentences, one slow: each 50-request row has one slow request, its p99 and not p95.
  sentences = ["slow one"] + [f"w{i} x" for i in range(49)]
  readings = iter([100.0, 101.0, 102.0])
  with ss.in_process(models, metrics=True, window_s=0.01) as port:
    out = bench.load_over_pairs(
      port,
      sentences,
      [("en", "de"), ("de", "en")],
      clients=(1, 16),
      requests=50,
      rss=lambda: next(readings),
      memory_requests=300,
      first=20,
    )
  assert out["pairs"] == ["en-de", "de-en"]
  assert (out["rss_mib_first"], out["rss_mib_before"], out["rss_mib_many"]) == (100, 101, 102)
  assert out["requests_first"] == 20 and out["requests_many"] == 300
  # Every request alternated: each pair's model translated half of them, one line each.
  assert [sum(map(len, m.calls)) for m in models] == [150, 150]
  one, sixteen = out["load"]
  assert (one["clients"], sixteen["clients"]) == (1, 16)
  for row in (one, sixteen, out["sustained"]):
    assert 0 < row["p50_ms"] <= row["p95_ms"] <= row["p99_ms"]
  assert one["p99_ms"] > 150 > one["p95_ms"]  # the slow request alone, at 1 client
  assert out["sustained"]["requests"] == 300 - 20 - (8 + 50) - 2 * 50
  # 16 clients share batches in both models; one client waits for each answer alone.
  assert out["load_ratio_16_to_1"] > 2
  assert out["load_ratio_16_to_1"] == sixteen["requests_per_s"] / one["requests_per_s"]
  direct = dict(one_call_each_per_s=1.0, one_call_each_ms=1.0, all_in_one_call_per_s=1.0)
  printed = bench.table(
    dict(out, workdir="W", sentences="S", requests=50, direct=direct, unbatched=out["load"])
    | dict(batching_gain_16=[1.5], rss_mib_after=103.0, requests_total=300.0)
  )
  assert "p99 ms" in printed and "2 pairs (en-de, de-en)" in printed
  assert f"at 1 client: {out['load_ratio_16_to_1']:.2f}x" in printed
  assert "100 MiB after the first 20 requests" in printed and "102 MiB after 300" in printed


def test_the_memory_reading_is_the_processes_resident_set():
  from t2t_jax.bench import serve as bench

  assert 1 < bench.rss_mib(os.getpid()) < 1 << 20
  assert bench.nearest_rank(list(range(1, 101)), 0.99) == 100
  assert bench.nearest_rank(list(range(1, 101)), 0.95) == 96


def test_a_client_gone_in_the_middle_of_its_body_is_no_error(port, caplog):
  head = b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
  with socket.create_connection(("127.0.0.1", port)) as s:
    s.sendall(head + b'Content-Length: 1000\r\n\r\n{"q": "half')
    time.sleep(0.2)
  still_serving(port)
  assert not [r for r in caplog.records if r.name == "t2t_jax.serve"]  # no internal error


def test_the_server_parses_http_with_httptools_where_installed(monkeypatch):
  """The serve extra installs httptools, and the server uses it (C, against h11's Python:
  the tiny model's 16 clients got about 1.5x the requests/s); without it, h11."""
  import sys

  pytest.importorskip("starlette", reason="the serve extra is not installed")
  pytest.importorskip("httptools", reason="the serve extra is not installed")
  from t2t_jax.serve import app

  assert app.http_implementation() == "httptools"
  monkeypatch.setitem(sys.modules, "httptools", None)  # as if not installed
  assert app.http_implementation() == "h11"
