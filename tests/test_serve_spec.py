"""t2t-serve's OpenAPI document (GET /spec): a valid OpenAPI 3 document of exactly the routes
listed here, whose schemas accept the answers t2t_jax.serve.api really builds and
LibreTranslate's shapes, and refuse wrong ones."""

import copy
import json

import pytest
from openapi_schema_validator import OAS30Validator
from openapi_spec_validator import validate

from t2t_jax.serve import api
from t2t_jax.serve.spec import openapi_spec

PAIRS = api.Pairs((api.Pair("en", "de"),))
LIMITS = api.Limits(char_limit=100, batch_limit=4, alternatives_limit=3)
SPEC = openapi_spec("9.9.9", ["en", "de"])

# (method, path) of every route the document describes; the server's routes are compared
# against this list (the page's own routes, /, /static/{name} and /api/translate, are not
# part of the API).
ROUTES = [
  ("get", "/languages"),
  ("post", "/translate"),
  ("post", "/detect"),
  ("post", "/translate_file"),
  ("get", "/download_file/{id}"),
  ("get", "/frontend/settings"),
  ("get", "/health"),
  ("get", "/ready"),
  ("get", "/metrics"),
  ("get", "/spec"),
]


def inlined(node, spec=SPEC):
  """`node` with every local $ref replaced by what it names."""
  if isinstance(node, dict):
    if "$ref" in node:
      *_, kind, name = node["$ref"].split("/")
      return inlined(spec["components"][kind][name], spec)
    return {k: inlined(v, spec) for k, v in node.items()}
  if isinstance(node, list):
    return [inlined(v, spec) for v in node]
  return node


def answer_schema(method: str, path: str, status: int = 200) -> dict:
  response = inlined(SPEC["paths"][path][method]["responses"][str(status)])
  return next(iter(response["content"].values()))["schema"]


def body_schema(path: str, content_type: str = "application/json") -> dict:
  return inlined(SPEC["paths"][path]["post"]["requestBody"]["content"][content_type]["schema"])


def valid(schema: dict, instance) -> bool:
  return OAS30Validator(schema).is_valid(instance)


def test_the_document_is_valid_openapi_3():
  validate(SPEC)
  assert SPEC["openapi"].startswith("3.")
  assert SPEC["info"]["version"] == "9.9.9"
  assert json.loads(json.dumps(SPEC)) == SPEC  # plain JSON: GET /spec sends it as it is


def test_the_document_describes_exactly_the_listed_routes():
  described = [(m, p) for p, ops in SPEC["paths"].items() for m in ops]
  assert sorted(described) == sorted(ROUTES)


def test_every_refusal_is_an_error_object_and_429_says_when_to_retry():
  statuses = set()
  for path, ops in SPEC["paths"].items():
    for method, op in ops.items():
      for status in op["responses"]:
        statuses.add(int(status))
        if int(status) >= 400:
          assert answer_schema(method, path, int(status)) == inlined(
            {"$ref": "#/components/schemas/Error"}
          )
  assert {400, 403, 404, 413, 429, 500, 503} <= statuses
  too_many = inlined(SPEC["paths"]["/translate"]["post"]["responses"]["429"])
  assert too_many["headers"]["Retry-After"]["schema"]["type"] == "integer"
  error = answer_schema("post", "/translate", 429)
  assert valid(error, {"error": "Slowdown: 30 per 1 minute"})
  assert not valid(error, {"message": "Slowdown: 30 per 1 minute"})
  assert not valid(error, {"error": 429})


def _answer(fields: dict, best: list[str], alternatives: list[list[str]]) -> dict:
  request = api.parse_translate(fields, True, PAIRS, LIMITS)
  return api.translate_answer(request, best, alternatives, [("en", 100.0)] * len(best))


@pytest.mark.parametrize(
  "fields, best, alternatives",
  [
    ({"q": "Hello", "source": "en", "target": "de"}, ["Hallo"], [[]]),
    ({"q": "Hello", "source": "auto", "target": "de"}, ["Hallo"], [[]]),
    ({"q": "Hi", "source": "en", "target": "de", "alternatives": 2}, ["Hallo"], [["Hi", "Tag"]]),
    ({"q": ["a", "b"], "source": "en", "target": "de"}, ["A", "B"], [[], []]),
    ({"q": "Hi", "source": "en", "target": "de", "alternatives": 2}, ["Hallo"], [[]]),
    (
      {"q": ["a", "b"], "source": "en", "target": "de", "alternatives": 3},
      ["A", "B"],
      [[], ["B2"]],
    ),
    (
      {"q": ["a", "b"], "source": "auto", "target": "de", "alternatives": 1},
      ["A", "B"],
      [["A2"], ["B2"]],
    ),
  ],
)
def test_the_translate_answers_the_server_builds_fit_the_schema(fields, best, alternatives):
  answer = _answer(fields, best, alternatives)
  assert valid(answer_schema("post", "/translate"), answer), answer
  assert valid(body_schema("/translate"), fields)


def test_the_translate_schema_refuses_wrong_answers_and_requests():
  schema = answer_schema("post", "/translate")
  assert valid(
    schema,
    {
      "translatedText": "Hallo",
      "alternatives": [],
      "detectedLanguage": {"confidence": 100, "language": "en"},
    },
  )  # LibreTranslate's shape
  for wrong in (
    {},
    {"translatedText": 3},
    {"translatedText": ["a", 1]},
    {"translatedText": "a", "alternatives": "b"},
    {"translatedText": "a", "detectedLanguage": {"language": "en"}},
    {"translatedText": "a", "detectedLanguage": {"confidence": 101, "language": "en"}},
  ):
    assert not valid(schema, wrong), wrong
  request = body_schema("/translate")
  for wrong in (
    {"source": "en", "target": "de"},
    {"q": "a", "source": "fr", "target": "de"},
    {"q": "a", "source": "en", "target": "auto"},
    {"q": [], "source": "en", "target": "de"},
    {"q": "a", "source": "en", "target": "de", "format": "pdf"},
    {"q": "a", "source": "en", "target": "de", "alternatives": -1},
  ):
    assert not valid(request, wrong), wrong
  form = body_schema("/translate", "application/x-www-form-urlencoded")
  assert valid(form, {"q": "a", "source": "auto", "target": "de", "api_key": "k"})


def test_the_other_answers_fit_their_schemas():
  assert valid(answer_schema("get", "/languages"), PAIRS.languages())
  assert not valid(answer_schema("get", "/languages"), [{"code": "en"}])
  detections = answer_schema("post", "/detect")
  assert valid(detections, [{"confidence": 100.0, "language": "en"}])
  assert not valid(detections, {"confidence": 100.0, "language": "en"})
  assert valid(body_schema("/detect"), {"q": "Hello", "api_key": "k"})
  assert not valid(body_schema("/detect"), {"api_key": "k"})
  files = body_schema("/translate_file", "multipart/form-data")
  assert set(files["required"]) == {"file", "source", "target"}
  assert valid(answer_schema("post", "/translate_file"), {"translatedFileUrl": "http://x/f"})
  assert valid(answer_schema("get", "/health"), {"status": "ok", "ready": False})
  assert valid(answer_schema("get", "/ready"), {"ready": True})
  settings = {
    "charLimit": 5000,
    "frontendTimeout": 500,
    "apiKeys": False,
    "keyRequired": False,
    "suggestions": False,
    "filesTranslation": False,
    "supportedFilesFormat": [],
    "alternativesLimit": 3,
    "attentionLines": 16,
    "language": {
      "source": {"code": "en", "name": "English"},
      "target": {"code": "de", "name": "German"},
    },
  }
  assert valid(answer_schema("get", "/frontend/settings"), settings)
  assert not valid(answer_schema("get", "/frontend/settings"), {**settings, "charLimit": "5k"})


def test_the_languages_given_are_the_codes_offered():
  spec = openapi_spec("1", ["en", "fr", "de"])
  source = inlined(spec["components"]["schemas"]["TranslateRequest"], spec)["properties"]
  assert source["source"]["enum"] == ["en", "fr", "de", "auto"]
  assert source["target"]["enum"] == ["en", "fr", "de"]
  assert copy.deepcopy(spec) == openapi_spec("1", ["en", "fr", "de"])
  for wrong in ([], [""], None, ["en", 3]):
    with pytest.raises(ValueError, match="languages"):
      openapi_spec("1", wrong)
