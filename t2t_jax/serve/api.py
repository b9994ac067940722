"""LibreTranslate's request fields as pure functions: body and query parsing, the checks and
their messages, line splitting, the answer's shape. No HTTP library and no model here, so
that every rule is testable on its own (tests/test_serve_api.py).

Field handling follows LibreTranslate's libretranslate/app.py: a JSON body (Content-Type
application/json or +json) gives every field and must be an object; otherwise the fields are
the query string's and the form body's, the query's first (werkzeug's `request.values`),
first value of a repeated name wins; `q`, `source` and `target` are required and non-empty;
`source` and `target` pick one of the served pairs (`Pairs`), `source` may be 'auto';
`format` is 'text' or 'html' (the visible text translated, tags and attributes kept);
`alternatives` is an integer, negative read as 0, capped; form bodies have their line ends
normalised to LF.
"""

import dataclasses
import hmac
import json
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# English names of the codes a model's config may carry; others are shown as the code.
LANGUAGE_NAMES = {
  "ar": "Arabic",
  "cs": "Czech",
  "de": "German",
  "en": "English",
  "es": "Spanish",
  "fi": "Finnish",
  "fr": "French",
  "hi": "Hindi",
  "it": "Italian",
  "ja": "Japanese",
  "ro": "Romanian",
  "ru": "Russian",
  "tr": "Turkish",
  "zh": "Chinese",
}


class ApiError(Exception):
  """A request answered with `status` and {"error": message} (and `headers`)."""

  def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
    super().__init__(message)
    self.status = status
    self.message = message
    self.headers = dict(headers or {})


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one request may ask for (-1: no limit), LibreTranslate's names. Every default is
  finite: an unbounded `alternatives` or text size lets one request hold the model."""

  char_limit: int = 5000  # characters in each text of a request (LibreTranslate's rule)
  batch_limit: int = 128  # texts in a list `q`
  alternatives_limit: int = 3  # n-best alternatives (also at most the beam size - 1)
  attention_lines: int = 16  # lines of one page request that get an attention map


@dataclasses.dataclass(frozen=True)
class Pair:
  """One served model's language pair."""

  source: str
  target: str

  def __str__(self) -> str:
    return f"{self.source}-{self.target}"

  def languages(self) -> list[dict[str, Any]]:
    """GET /languages of a server of this pair alone."""
    return Pairs((self,)).languages()


@dataclasses.dataclass(frozen=True)
class Pairs:
  """The pairs a server translates, one model each, in the order they were given."""

  pairs: tuple[Pair, ...]

  def __post_init__(self) -> None:
    if not self.pairs:
      raise ValueError("a server needs at least one language pair")
    twice = sorted({str(p) for p in self.pairs if self.pairs.count(p) > 1})
    if twice:
      raise ValueError(f"two models for the pair {', '.join(twice)}: one model a pair")

  def codes(self) -> list[str]:
    """Every language code a pair names, sources first, each once, in order."""
    out: list[str] = []
    for code in [p.source for p in self.pairs] + [p.target for p in self.pairs]:
      if code not in out:
        out.append(code)
    return out

  def sources_into(self, target: str) -> list[str]:
    """The source languages of the pairs translating into `target`, in order."""
    return [p.source for p in self.pairs if p.target == target]

  def languages(self) -> list[dict[str, Any]]:
    """GET /languages, LibreTranslate's: every language with the codes it translates to
    (a language that is only a target lists none)."""
    return [
      dict(
        code=code,
        name=language_name(code),
        targets=[p.target for p in self.pairs if p.source == code],
      )
      for code in self.codes()
    ]

  def choose(self, source: str, target: str) -> Pair:
    """The pair of (source, target), refused as LibreTranslate refuses: a language no pair
    names is 'not supported'; two languages without a model between them are 'not
    available'."""
    codes = self.codes()
    for code in (source, target):
      if code not in codes:
        raise ApiError(400, f"{_quoted(code)} is not supported")
    if Pair(source, target) not in self.pairs:
      raise ApiError(
        400,
        f"{language_name(target)} ({target}) is not available as a target language from "
        f"{language_name(source)} ({source})",
      )
    return Pair(source, target)


def _quoted(text: str) -> str:
  """A client's text inside an answer, at most 40 characters (the answer escapes what UTF-8
  cannot carry: app._error)."""
  return text if len(text) <= 40 else text[:40] + "..."


def language_name(code: str) -> str:
  return LANGUAGE_NAMES.get(code, code)


@dataclasses.dataclass(frozen=True)
class TranslateRequest:
  """A checked POST /translate: `texts` are the texts of `q` (one when q was a string)."""

  texts: tuple[str, ...]
  is_list: bool
  alternatives: int
  source: str  # a served source language, or 'auto'
  target: str
  format: str = "text"  # or 'html': the visible text translated, tags and attributes kept

  @property
  def detect(self) -> bool:
    """Source 'auto': each text's language is detected and the answer says which."""
    return self.source == "auto"


def is_json(content_type: str) -> bool:
  """Whether a Content-Type is JSON as Flask's `request.is_json` reads it."""
  mime = content_type.split(";", 1)[0].strip().lower()
  return mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json"))


def is_form(content_type: str) -> bool:
  return content_type.split(";", 1)[0].strip().lower() == "application/x-www-form-urlencoded"


def decode_utf8(raw: bytes, what: str) -> str:
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ApiError(
      400, f"Invalid request: {what} is not UTF-8 ({e.reason} at byte {e.start})"
    ) from None


def json_fields(body: bytes) -> dict[str, Any]:
  """The fields of a JSON body, which must be one object."""
  text = decode_utf8(body, "the JSON body")
  try:
    value = json.loads(text)
  except ValueError as e:
    raise ApiError(400, f"Invalid JSON format: {e}") from None
  except RecursionError:
    raise ApiError(400, "Invalid JSON format: nested too deeply") from None
  if not isinstance(value, dict):
    raise ApiError(400, f"Invalid JSON format: an object was expected, not {type(value).__name__}")
  return value


def urlencoded_fields(raw: bytes, what: str) -> dict[str, str]:
  """name -> first value of a query string or form body; bytes that are not UTF-8 (after
  percent-decoding) are refused naming `what`."""
  text = decode_utf8(raw, what)
  try:
    pairs = urllib.parse.parse_qsl(text, keep_blank_values=True, errors="strict")
  except UnicodeDecodeError as e:
    raise ApiError(400, f"Invalid request: {what} is not UTF-8 ({e.reason})") from None
  out: dict[str, str] = {}
  for name, value in pairs:
    out.setdefault(name, value)
  return out


def merged_values(*sources: Mapping[str, str]) -> dict[str, str]:
  """werkzeug's `request.values`: the first source holding a name gives its value."""
  out: dict[str, str] = {}
  for source in sources:
    for name, value in source.items():
      out.setdefault(name, value)
  return out


def normalise_line_ends(text: str) -> str:
  """LibreTranslate's form-body rule: CRLF and CR become LF (RFC 2046 4.1.1), so that the
  character limit counts the same text however the client sent it."""
  return text.replace("\r\n", "\n").replace("\r", "\n")


def alternatives_count(value: Any, limit: int) -> int:
  """`alternatives` as LibreTranslate reads it: int(), negative as 0, at most `limit`."""
  if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
    raise ApiError(400, "Invalid request: alternatives parameter is not a number")
  try:
    count = max(0, int(value))
  except (TypeError, ValueError):
    raise ApiError(400, "Invalid request: alternatives parameter is not a number") from None
  if limit != -1 and count > limit:
    raise ApiError(400, f"Invalid request: alternatives parameter must be <= {limit}")
  return count


def texts_of(q: Any, limits: Limits) -> tuple[tuple[str, ...], bool]:
  """(texts, is_list) of `q`: a non-empty string, or a non-empty list of strings within
  batch_limit; each within char_limit characters (LibreTranslate counts each text)."""
  if q is None or q == "" or q == []:
    raise ApiError(400, "Invalid request: missing q parameter")
  is_list = isinstance(q, list)
  texts = q if is_list else [q]
  if not all(isinstance(t, str) for t in texts):
    raise ApiError(400, "Invalid request: q must be a string or a list of strings")
  texts = [without_surrogates(t) for t in texts]
  if is_list and limits.batch_limit != -1 and len(texts) > limits.batch_limit:
    raise ApiError(
      400,
      f"Invalid request: request ({len(texts)}) exceeds text limit ({limits.batch_limit})",
    )
  for text in texts:
    if limits.char_limit != -1 and len(text) > limits.char_limit:
      raise ApiError(
        400, f"Invalid request: request ({len(text)}) exceeds text limit ({limits.char_limit})"
      )
  return tuple(texts), is_list


def without_surrogates(text: str) -> str:
  """A JSON string may hold lone surrogates ("\\ud800"), which no tokenizer or UTF-8 answer
  can carry: each becomes U+FFFD, as a UTF-8 decoder reads a broken sequence."""
  return _SURROGATE.sub("\ufffd", text)


_SURROGATE = re.compile("[\ud800-\udfff]")


AUTO = "auto"  # the source code that asks for detection


def check_languages(source: Any, target: Any, pairs: Pairs) -> tuple[str, str]:
  """(source, target) of a request: codes naming a served pair, or source 'auto' with a
  target some pair translates into."""
  for name, value in (("source", source), ("target", target)):
    if not isinstance(value, str):
      raise ApiError(400, f"Invalid request: {name} must be a language code")
  if source != AUTO:
    pairs.choose(source, target)
  elif not pairs.sources_into(target):
    raise ApiError(400, f"{_quoted(target)} is not supported")
  return source, target


def parse_translate(
  fields: Mapping[str, Any], from_json: bool, pairs: Pairs, limits: Limits
) -> TranslateRequest:
  """A POST /translate's fields checked in LibreTranslate's order (q, source, target,
  alternatives, limits, languages, format)."""
  q = fields.get("q")
  if not q:
    raise ApiError(400, "Invalid request: missing q parameter")
  for name in ("source", "target"):
    if not fields.get(name):
      raise ApiError(400, f"Invalid request: missing {name} parameter")
  alternatives = alternatives_count(fields.get("alternatives", 0), limits.alternatives_limit)
  if not from_json and isinstance(q, str):
    q = normalise_line_ends(q)
  texts, is_list = texts_of(q, limits)
  source, target = check_languages(fields.get("source"), fields.get("target"), pairs)
  text_format = fields.get("format") or "text"
  if text_format not in ("text", "html"):
    name = _quoted(text_format) if isinstance(text_format, str) else "that"
    raise ApiError(400, f"{name} format is not supported")
  return TranslateRequest(texts, is_list, alternatives, source, target, text_format)


def check_key(given: Any, keys: frozenset[str] | None) -> None:
  """Without a keys file keys are ignored; with one, every request needs a listed key
  (compared in constant time). LibreTranslate's statuses: a listed key missing is 400, a
  key that is not listed 403."""
  if keys is None:
    return
  if not given:
    raise ApiError(400, "Please contact the server operator to get an API key")
  if not isinstance(given, str) or not any(
    hmac.compare_digest(given.encode("utf-8", "surrogatepass"), k.encode()) for k in keys
  ):
    raise ApiError(403, "Invalid API key")


def split_lines(text: str) -> list[str]:
  """A text's lines, translated one by one: join_lines(split_lines(t)) == t's line count,
  an empty (or blank) line is never sent to the model and comes back empty."""
  return text.split("\n")


def join_lines(lines: Sequence[str]) -> str:
  return "\n".join(lines)


def translatable(line: str) -> bool:
  """Whether a line goes to the model (a blank line is answered by an empty one)."""
  return bool(line.strip())


def unique_alternatives(best: str, others: Sequence[str]) -> list[str]:
  """LibreTranslate's filter_unique: the alternatives in order, each once, the translation
  itself left out."""
  out: list[str] = []
  for text in others:
    if text != best and text not in out:
      out.append(text)
  return out


def assemble(
  found: list[Any], alternatives: int, join: Callable[[list[str]], str] = None
) -> tuple[str, list[str]]:
  """A text's translation from its parts' results (None: a blank line, answered empty),
  put together by `join` (default: as lines), and its alternatives: the k-th uses each
  part's k-th hypothesis (its best when it has fewer)."""
  join = join or join_lines
  if not alternatives:
    return join([r or "" for r in found]), []

  def pick(hyps: Any, k: int) -> str:
    return "" if hyps is None else hyps[min(k, len(hyps) - 1)].text

  best = join([pick(h, 0) for h in found])
  others = [join([pick(h, k) for h in found]) for k in range(1, alternatives + 1)]
  return best, unique_alternatives(best, others)


def translate_answer(
  request: TranslateRequest,
  best: Sequence[str],
  alternatives: Sequence[Sequence[str]],
  detected: Sequence[tuple[str, float]] = (),
) -> dict[str, Any]:
  """The JSON of a POST /translate: translatedText (a string or a list, as q was), with
  `alternatives` when asked for, and for source 'auto' detectedLanguage, each text's
  (language, confidence in percent)."""
  answer: dict[str, Any] = {"translatedText": list(best) if request.is_list else best[0]}
  if request.detect:
    found = [{"confidence": float(c), "language": code} for code, c in detected]
    answer["detectedLanguage"] = found if request.is_list else found[0]
  if request.alternatives:
    alts = [list(a) for a in alternatives]
    answer["alternatives"] = alts if request.is_list else alts[0]
  return answer
