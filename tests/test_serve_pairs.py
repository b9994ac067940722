"""Several models in one server: a request's source and target pick the model, /languages
lists every pair as LibreTranslate does, a line one model cannot take fails only its own
request, and a server failure is a counted 500 with an id and CORS headers."""

import concurrent.futures
import re

import pytest

from tests import serve_support as ss
from tests.serve_support import FakeModel, call, translate

# The serve extra: the app and its sentence splitter.
for _name in ("starlette", "uvicorn", "sentencex"):
  pytest.importorskip(_name)


def _models(**kw):
  return [
    FakeModel(pair="en-de", mark="ende:", **kw),
    FakeModel(pair="de-en", mark="deen:"),
    FakeModel(pair="en-fr", mark="enfr:"),
  ]


@pytest.fixture(scope="module")
def port():
  pytest.importorskip("starlette")
  pytest.importorskip("uvicorn")
  with ss.in_process(_models(fail_on="BAD"), metrics=True, window_s=0.2) as port:
    yield port


def test_languages_list_each_source_with_its_targets(port):
  assert call(port, "GET", "/languages").json == [
    {"code": "en", "name": "English", "targets": ["de", "fr"]},
    {"code": "de", "name": "German", "targets": ["en"]},
    {"code": "fr", "name": "French", "targets": []},
  ]


@pytest.mark.parametrize(
  "source, target, mark", [("en", "de", "ende:"), ("de", "en", "deen:"), ("en", "fr", "enfr:")]
)
def test_source_and_target_pick_the_model(port, source, target, mark):
  answer = translate(port, q=["ab cd", "", "ef"], source=source, target=target)
  assert answer.status == 200, answer.body
  assert answer.json["translatedText"] == [f"{mark}dc ba", "", f"{mark}fe"]


def test_a_pair_not_served_and_auto(port):
  refused = translate(port, q="x", source="de", target="fr")
  assert refused.status == 400
  assert refused.json["error"] == (
    "French (fr) is not available as a target language from German (de)"
  )
  assert translate(port, q="x", source="es", target="de").json["error"] == "es is not supported"
  auto = translate(port, q=["ab", "cd"], source="auto", target="fr")  # en is fr's one source
  assert auto.json["translatedText"] == ["enfr:ba", "enfr:dc"]
  assert auto.json["detectedLanguage"] == [{"confidence": 100.0, "language": "en"}] * 2


def test_the_page_picks_the_pair_and_defaults_to_the_first(port):
  def page(**fields):
    return call(port, "POST", "/api/translate", dict(dict(q="ab", attention=False), **fields))

  assert page().json["lines"][0]["translation"] == "ende:ba"
  assert page(source="de", target="en").json["lines"][0]["translation"] == "deen:ba"
  assert page(source="de", target="fr").status == 400
  settings = call(port, "GET", "/frontend/settings").json
  assert settings["language"]["source"]["code"] == "en" and settings["ready"] is True


def test_a_line_the_model_cannot_take_fails_only_its_own_request(port):
  """Sent together (the batching window holds them in one batch): the request with the bad
  line gets a 500 with an id, the others their translations."""
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    bad = pool.submit(translate, port, q=["ok", "a BAD line"])
    good = [pool.submit(translate, port, q=f"w{i} x") for i in range(3)]
    answers = [f.result() for f in good]
    failed = bad.result()
  assert [a.json["translatedText"] for a in answers] == [f"ende:x {i}w" for i in range(3)]
  assert failed.status == 500
  assert re.fullmatch(r"internal error [0-9a-f]{12}", failed.json["error"])
  assert "BAD" not in failed.body.decode()  # the exception's text stays in the log
  assert failed.headers["access-control-allow-origin"] == "*"
  metrics = call(port, "GET", "/metrics").body.decode()
  assert re.search(r'endpoint="translate",status="500"\} [1-9]', metrics)
  assert re.search(r't2t_serve_model_bytes\{pair="de-en"\} 0\.0', metrics)


def test_served_translate_isolated_answers_the_good_lines():
  from t2t_jax.serve import app

  served = app.Served(FakeModel(fail_on="BAD"), app.ServerSettings())
  found = served.translate_isolated(["ab", "BAD", "cd"], 0)
  assert found[0] == "ba" and found[2] == "dc" and isinstance(found[1], app.BadLine)
  with pytest.raises(RuntimeError):
    served.translate_isolated(["BAD"], 0)


def test_auto_detects_among_the_sources_of_the_target_and_detect_answers_libretranslates():
  pytest.importorskip("py3langid")
  models = [FakeModel(pair="en-fr", mark="enfr:"), FakeModel(pair="de-fr", mark="defr:")]
  english, german = "The house is very big and old.", "Das Haus ist sehr groß und alt."
  with ss.in_process(models) as port:
    auto = translate(port, q=[english, german], source="auto", target="fr")
    assert [t.split(":")[0] for t in auto.json["translatedText"]] == ["enfr", "defr"]
    detected = auto.json["detectedLanguage"]
    assert [d["language"] for d in detected] == ["en", "de"]
    assert all(50 < d["confidence"] <= 100 for d in detected)
    found = call(port, "POST", "/detect", dict(q=german)).json
    assert found[0]["language"] == "de" and found[0]["confidence"] > 50
    assert {d["language"] for d in found} <= {"en", "de"}
    assert call(port, "POST", "/detect", dict(q="")).status == 400


def test_a_libretranslate_client_uses_a_two_pair_server():
  """libretranslatepy, LibreTranslate's own Python client, as docs/serving.md shows it."""
  client_lib = pytest.importorskip("libretranslatepy")
  pytest.importorskip("py3langid")
  models = [FakeModel(pair="en-de", mark="ende:"), FakeModel(pair="de-en", mark="deen:")]
  with ss.in_process(models) as port:
    lt = client_lib.LibreTranslateAPI(f"http://127.0.0.1:{port}")
    assert lt.translate("ab cd", "en", "de") == "ende:dc ba"
    assert lt.translate("ab cd", "de", "en") == "deen:dc ba"
    assert [(x["code"], x["targets"]) for x in lt.languages()] == [("en", ["de"]), ("de", ["en"])]
    assert lt.detect("Das Haus ist sehr groß und alt.")[0]["language"] == "de"


def test_html_and_files_through_the_server(port):
  """format=html keeps tags and attributes; a .srt upload comes back with its timings under
  /download_file; an unknown id is a 404, a file over the limit a 413."""
  pytest.importorskip("bs4")
  html = '<p class="x">ab cd <b title="t">ef</b></p><code>no</code>'
  answer = translate(port, q=html, format="html")
  assert answer.json["translatedText"] == (
    '<p class="x">ende:dc ba <b title="t">ende:fe</b></p><code>no</code>'
  )
  srt = b"1\n00:00:01,000 --> 00:00:02,000\nab cd\n\n2\n00:00:03,000 --> 00:00:04,500\nef\n"
  body, content_type = _multipart(dict(source="en", target="de"), "talk.srt", srt)
  uploaded = call(port, "POST", "/translate_file", body, content_type)
  assert uploaded.status == 200, uploaded.body
  url = uploaded.json["translatedFileUrl"]
  assert re.fullmatch(rf"http://127\.0\.0\.1:{port}/download_file/\S+\.srt", url)
  got = call(port, "GET", url.split(str(port), 1)[1])
  assert got.status == 200 and "talk_de.srt" in got.headers["content-disposition"]
  assert got.body.decode().split("\n")[:3] == ["1", "00:00:01,000 --> 00:00:02,000", "ende:dc ba"]
  assert call(port, "GET", "/download_file/../../etc/passwd").status == 404
  assert call(port, "GET", "/download_file/nosuchid.txt").status == 404
  big, content_type = _multipart(dict(source="en", target="de"), "a.txt", b"x " * 40000)
  assert call(port, "POST", "/translate_file", big, content_type).status == 413
  odd, content_type = _multipart(dict(source="en", target="de"), "a.pdf", b"%PDF")
  refused = call(port, "POST", "/translate_file", odd, content_type)
  assert refused.status == 400 and "file format not supported" in refused.json["error"]


def _multipart(fields, filename, data):
  parts = [
    b'--xyz\r\nContent-Disposition: form-data; name="%s"\r\n\r\n%s\r\n' % (k.encode(), v.encode())
    for k, v in fields.items()
  ]
  parts.append(
    b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="%s"\r\n'
    b"Content-Type: application/octet-stream\r\n\r\n%s\r\n" % (filename.encode(), data)
  )
  return b"".join(parts) + b"--xyz--\r\n", "multipart/form-data; boundary=xyz"


def test_a_sentence_over_the_source_budget_is_cut_never_truncated():
  model = FakeModel(max_tokens=3)
  with ss.in_process(model, metrics=True) as port:
    answer = translate(port, q="a b c d e f gh. Short one.")
    assert answer.json["translatedText"] == "c b a f e d .hg .eno trohS"
    assert ["a b c", "d e f", "gh.", "Short one."] in model.calls
    metrics = call(port, "GET", "/metrics").body.decode()
    assert re.search(r"^t2t_serve_split_sentences 1\.0$", metrics, re.M)


def test_spec_describes_the_routes_the_app_serves(port):
  """GET /spec's paths and methods are the app's routes (the page's own left out)."""
  from t2t_jax.serve import app

  served = app.Server(FakeModel(), app.ServerSettings(files=False))
  page = {"/", "/static/{name}", "/api/translate", "/api/attention"}
  routes = {
    (re.sub(r"\{\w+\}", "{}", r.path), m.lower())
    for r in app.create_app(served).routes
    if r.path not in page
    for m in r.methods - {"HEAD"}
  }
  spec = call(port, "GET", "/spec").json
  described = {(re.sub(r"\{\w+\}", "{}", p), m) for p, item in spec["paths"].items() for m in item}
  assert described == routes
  assert spec["info"]["version"] and "en" in str(spec)
