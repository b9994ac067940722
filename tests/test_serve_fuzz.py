"""No 500 from anything a client sends: arbitrary JSON, forms, multipart and raw bytes
(lone surrogates, NULs, huge numbers, deep nesting) at every route are answered 200 or a
4xx whose body is a JSON error, and the server goes on answering."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import serve_support as ss
from tests.serve_support import FakeModel, call

POSTS = ("/translate", "/api/translate", "/api/attention", "/detect", "/translate_file")
GETS = ("/languages", "/frontend/settings", "/health", "/ready", "/metrics", "/spec", "/")
FIELDS = (
  "q",
  "source",
  "target",
  "format",
  "alternatives",
  "api_key",
  "attention",
  "file",
  "translation",
  "layer",
)
CONTENT_TYPES = (
  "application/json",
  "application/x-www-form-urlencoded",
  "multipart/form-data; boundary=xyz",
  "multipart/form-data",
  "text/plain",
  "application/ld+json; charset=latin-1",
  "",
)

# Strings a client can send in JSON: lone surrogates, NULs, other planes.
texts = st.text(st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=40)
scalars = st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats() | texts
values = st.recursive(
  scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=3)
)
likely = st.sampled_from(["en", "de", "fr", "auto", "text", "html", "", "1", "-1", "a b c"])
field_values = likely | values


@pytest.fixture(scope="module")
def port():
  pytest.importorskip("starlette")
  pytest.importorskip("uvicorn")
  models = [FakeModel(pair="en-de"), FakeModel(pair="de-en")]
  with ss.in_process(models, metrics=True) as port:
    yield port


def _check(answer: ss.Answer, what: str) -> None:
  assert answer.status < 500, f"{what}: {answer.status} {answer.body[:300]!r}"
  if answer.status >= 400 and answer.status != 499:
    body = json.loads(answer.body)
    assert isinstance(body, dict) and isinstance(body.get("error"), str), what


def _json_body(fields: dict) -> bytes:
  # json.dumps writes a lone surrogate as the escape "\ud800", as a client's JSON would.
  return json.dumps(fields, allow_nan=True).encode()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
  path=st.sampled_from(POSTS),
  fields=st.dictionaries(st.sampled_from(FIELDS), field_values, max_size=6),
  extra=st.dictionaries(texts, values, max_size=2),
)
def test_any_json_object_or_value_at_every_post_route(port, path, fields, extra):
  for body in (_json_body({**extra, **fields}), _json_body(list(fields.values()))):
    _check(call(port, "POST", path, body, "application/json"), f"{path} {body[:200]!r}")


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
  path=st.sampled_from(POSTS + GETS),
  body=st.binary(max_size=300),
  content_type=st.sampled_from(CONTENT_TYPES),
  query=st.binary(max_size=60),
)
def test_any_bytes_with_any_content_type_and_query(port, path, body, content_type, query):
  import urllib.parse

  target = path + "?" + urllib.parse.quote_from_bytes(query, safe="=&%")
  method = "POST" if path in POSTS else "GET"
  answer = call(port, method, target, body if method == "POST" else None, content_type)
  _check(answer, f"{method} {target} {content_type} {body[:100]!r}")


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(
  path=st.sampled_from(POSTS),
  fields=st.dictionaries(st.sampled_from(FIELDS), texts | likely, max_size=6),
  as_multipart=st.booleans(),
)
def test_any_form_or_multipart_fields(port, path, fields, as_multipart):
  if as_multipart:
    parts = [
      b'--xyz\r\nContent-Disposition: form-data; name="%s"\r\n\r\n%s\r\n'
      % (name.encode(), value.encode("utf-8", "surrogatepass"))
      for name, value in fields.items()
    ]
    body, content_type = b"".join(parts) + b"--xyz--\r\n", "multipart/form-data; boundary=xyz"
  else:
    import urllib.parse

    pairs = [(k, v.encode("utf-8", "surrogatepass")) for k, v in fields.items()]
    body = urllib.parse.urlencode(pairs).encode()
    content_type = "application/x-www-form-urlencoded"
  _check(call(port, "POST", path, body, content_type), f"{path} {body[:200]!r}")


def test_deep_nesting_huge_numbers_and_the_server_goes_on(port):
  deep = b'{"q": ' + b"[" * 100000 + b"]" * 100000 + b"}"
  huge = b'{"q": "a", "source": "en", "target": "de", "alternatives": 1' + b"0" * 5000 + b"}"
  for body in (deep, huge, b'{"q": "\\ud800", "source": "\\ud800", "target": "\\udfff"}'):
    _check(call(port, "POST", "/translate", body, "application/json"), repr(body[:60]))
  ok = ss.translate(port, q="still here")
  assert ok.status == 200 and ok.json["translatedText"] == "ereh llits"
