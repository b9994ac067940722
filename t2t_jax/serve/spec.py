"""The OpenAPI 3 description of t2t-serve's routes (GET /spec), as a plain dict.

The request and answer shapes are LibreTranslate's (its /spec is Swagger 2, written in its
routes' docstrings): translatedText a string or a list as q was, alternatives, detectedLanguage
{confidence, language} for source 'auto', /detect a list of {confidence, language}, and every
refusal {"error": message}. tests/test_serve_spec.py validates the document and checks real
answers against its schemas.
"""

from typing import Any

OPENAPI_VERSION = "3.0.3"
JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"

# Refusals: status -> (component name, description).
ERRORS = {
  400: ("BadRequest", "Invalid request (a missing or wrong field, a text over the limits)"),
  403: ("Forbidden", "A key is missing or wrong (the server has keys), or the feature is off"),
  404: ("NotFound", "No such resource"),
  413: ("TooLarge", "The request body is over the server's size limit"),
  429: ("TooManyRequests", "Slow down: the client's (or key's) requests per minute are used up"),
  500: ("InternalError", "The translation failed"),
  503: ("Unavailable", "The model is loading, the queue is full or the request timed out"),
}


def _ref(name: str) -> dict[str, str]:
  return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
  return {"description": description, "content": {JSON: {"schema": schema}}}


def _refusals(*statuses: int) -> dict[str, Any]:
  return {str(s): {"$ref": f"#/components/responses/{ERRORS[s][0]}"} for s in statuses}


def _schemas(languages: list[str]) -> dict[str, Any]:
  texts = {"type": "array", "items": {"type": "string"}, "minItems": 1}
  api_key = {"type": "string", "description": "API key (needed when the server has keys)"}
  source = {
    "type": "string",
    "enum": [*languages, "auto"],
    "description": 'Source language code, or "auto" for auto detection',
  }
  target = {"type": "string", "enum": list(languages), "description": "Target language code"}
  text_format = {
    "type": "string",
    "enum": ["text", "html"],
    "default": "text",
    "description": "Format of the source text (html: 400 from a server that translates text)",
  }
  alternatives = {
    "type": "integer",
    "minimum": 0,
    "default": 0,
    "description": "How many alternative translations to give (at most alternativesLimit)",
  }
  detected = {
    "type": "object",
    "properties": {
      "confidence": {"type": "number", "minimum": 0, "maximum": 100, "example": 100},
      "language": {"type": "string", "description": "Language code"},
    },
    "required": ["confidence", "language"],
  }
  name_code = {
    "type": "object",
    "properties": {"code": {"type": "string"}, "name": {"type": "string"}},
    "required": ["code", "name"],
  }
  return {
    "Error": {
      "type": "object",
      "properties": {"error": {"type": "string", "description": "What was wrong"}},
      "required": ["error"],
    },
    "Language": {
      "type": "object",
      "properties": {
        "code": {"type": "string", "description": "Language code"},
        "name": {"type": "string", "description": "Language name (in English)"},
        "targets": {
          "type": "array",
          "items": {"type": "string"},
          "description": "Target language codes",
        },
      },
      "required": ["code", "name", "targets"],
    },
    "DetectedLanguage": detected,
    "TranslateRequest": {
      "type": "object",
      "properties": {
        "q": {"oneOf": [{"type": "string", "minLength": 1}, texts], "description": "Text(s)"},
        "source": source,
        "target": target,
        "format": text_format,
        "alternatives": alternatives,
        "api_key": api_key,
      },
      "required": ["q", "source", "target"],
    },
    "TranslateForm": {
      "type": "object",
      "properties": {
        "q": {"type": "string", "minLength": 1, "description": "Text to translate"},
        "source": source,
        "target": target,
        "format": text_format,
        "alternatives": alternatives,
        "api_key": api_key,
      },
      "required": ["q", "source", "target"],
    },
    "TranslateResponse": {
      "type": "object",
      "properties": {
        "translatedText": {
          "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
          "description": "The translation(s): a string for a string q, a list for a list",
        },
        "alternatives": {
          "anyOf": [  # not oneOf: [] is both
            {"type": "array", "items": {"type": "string"}},
            {"type": "array", "items": {"type": "array", "items": {"type": "string"}}},
          ],
          "description": "Alternative translations (a list per text for a list q)",
        },
        "detectedLanguage": {
          "oneOf": [_ref("DetectedLanguage"), {"type": "array", "items": _ref("DetectedLanguage")}],
          "description": 'For source "auto": the language found (one per text for a list q)',
        },
      },
      "required": ["translatedText"],
    },
    "DetectRequest": {
      "type": "object",
      "properties": {
        "q": {"type": "string", "minLength": 1, "description": "Text to detect"},
        "api_key": api_key,
      },
      "required": ["q"],
    },
    "Detections": {"type": "array", "items": _ref("DetectedLanguage")},
    "TranslateFileRequest": {
      "type": "object",
      "properties": {
        "file": {"type": "string", "format": "binary", "description": "File to translate"},
        "source": source,
        "target": target,
        "api_key": api_key,
      },
      "required": ["file", "source", "target"],
    },
    "TranslateFileResponse": {
      "type": "object",
      "properties": {
        "translatedFileUrl": {"type": "string", "description": "Where to download it"}
      },
      "required": ["translatedFileUrl"],
    },
    "FrontendSettings": {
      "type": "object",
      "properties": {
        "charLimit": {"type": "integer", "description": "Characters a text (-1: no limit)"},
        "frontendTimeout": {"type": "integer", "description": "The page's debounce (ms)"},
        "apiKeys": {"type": "boolean", "description": "Whether the server has keys"},
        "keyRequired": {"type": "boolean", "description": "Whether a key is required"},
        "suggestions": {"type": "boolean"},
        "filesTranslation": {"type": "boolean"},
        "supportedFilesFormat": {"type": "array", "items": {"type": "string"}},
        "alternativesLimit": {"type": "integer"},
        "attentionLines": {"type": "integer"},
        "language": {
          "type": "object",
          "properties": {"source": name_code, "target": name_code},
          "required": ["source", "target"],
        },
      },
      "required": ["charLimit", "apiKeys", "keyRequired", "language"],
    },
    "Health": {
      "type": "object",
      "properties": {
        "status": {"type": "string", "example": "ok"},
        "ready": {"type": "boolean", "description": "Whether the model is loaded"},
      },
      "required": ["status"],
    },
    "Ready": {
      "type": "object",
      "properties": {"ready": {"type": "boolean"}},
      "required": ["ready"],
    },
  }


def _responses() -> dict[str, Any]:
  out = {name: _json(_ref("Error"), description) for name, description in ERRORS.values()}
  out["TooManyRequests"]["headers"] = {
    "Retry-After": {
      "description": "Seconds until the client's window ends",
      "schema": {"type": "integer", "minimum": 1},
    }
  }
  return out


def _body(json_schema: str, form_schema: str | None = None) -> dict[str, Any]:
  form = _ref(form_schema or json_schema)
  content = {JSON: {"schema": _ref(json_schema)}, FORM: {"schema": form}}
  content[MULTIPART] = {"schema": form}
  return {"required": True, "content": content}


def openapi_spec(version: str, languages: list[str]) -> dict[str, Any]:
  """The OpenAPI document of a server whose model translates `languages` (source first):
  GET /spec's answer. `version` is t2t_jax's."""
  if not languages or not all(isinstance(code, str) and code for code in languages):
    raise ValueError(f"languages must be a non-empty list of codes, not {languages!r}")
  paths = {
    "/languages": {
      "get": {
        "tags": ["translate"],
        "summary": "Supported languages",
        "responses": {
          "200": _json({"type": "array", "items": _ref("Language")}, "The languages"),
          **_refusals(503),
        },
      }
    },
    "/translate": {
      "post": {
        "tags": ["translate"],
        "summary": "Translate text",
        "requestBody": _body("TranslateRequest", "TranslateForm"),
        "responses": {
          "200": _json(_ref("TranslateResponse"), "The translation"),
          **_refusals(400, 403, 413, 429, 500, 503),
        },
      }
    },
    "/detect": {
      "post": {
        "tags": ["translate"],
        "summary": "Detect the language of a text",
        "requestBody": _body("DetectRequest"),
        "responses": {
          "200": _json(_ref("Detections"), "The languages found, the likeliest first"),
          **_refusals(400, 403, 413, 429, 500, 503),
        },
      }
    },
    "/translate_file": {
      "post": {
        "tags": ["translate"],
        "summary": "Translate a file",
        "requestBody": {
          "required": True,
          "content": {MULTIPART: {"schema": _ref("TranslateFileRequest")}},
        },
        "responses": {
          "200": _json(_ref("TranslateFileResponse"), "Where the translated file is"),
          **_refusals(400, 403, 413, 429, 500, 503),
        },
      }
    },
    "/download_file/{id}": {
      "get": {
        "tags": ["translate"],
        "summary": "Download a translated file",
        "parameters": [
          {
            "name": "id",
            "in": "path",
            "required": True,
            "schema": {"type": "string"},
            "description": "The file's name in translatedFileUrl",
          }
        ],
        "responses": {
          "200": {
            "description": "The translated file",
            "content": {
              "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
          },
          **_refusals(400, 404),
        },
      }
    },
    "/frontend/settings": {
      "get": {
        "tags": ["misc"],
        "summary": "What the page reads first: limits, keys, the language pair",
        "responses": {"200": _json(_ref("FrontendSettings"), "The settings")},
      }
    },
    "/health": {
      "get": {
        "tags": ["misc"],
        "summary": "Liveness: answers while the model loads",
        "responses": {"200": _json(_ref("Health"), "The process serves HTTP")},
      }
    },
    "/ready": {
      "get": {
        "tags": ["misc"],
        "summary": "Readiness: 200 once the model is loaded and compiled",
        "responses": {"200": _json(_ref("Ready"), "Ready"), **_refusals(503)},
      }
    },
    "/metrics": {
      "get": {
        "tags": ["misc"],
        "summary": "Prometheus metrics (t2t-serve --metrics)",
        "responses": {
          "200": {
            "description": "Prometheus' text format",
            "content": {"text/plain": {"schema": {"type": "string"}}},
          },
          **_refusals(404),
        },
      }
    },
    "/spec": {
      "get": {
        "tags": ["misc"],
        "summary": "This document",
        "responses": {"200": _json({"type": "object"}, "The OpenAPI document")},
      }
    },
  }
  return {
    "openapi": OPENAPI_VERSION,
    "info": {
      "title": "t2t-serve",
      "version": version,
      "description": "A t2t_jax translation model behind LibreTranslate's API.",
    },
    "tags": [{"name": "translate"}, {"name": "misc"}],
    "paths": paths,
    "components": {"schemas": _schemas(list(languages)), "responses": _responses()},
  }
