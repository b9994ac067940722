"""The HTTP side of t2t-serve: a Starlette (ASGI) app speaking LibreTranslate's API, the
page at `/` and its JSON endpoint, over the batching threads (serve.batching).

Handlers parse and check at the edge (serve.api), queue lines for the batching threads and
await the answer without blocking the event loop; a request whose client goes away or whose
time runs out is dropped from the queue. The model loads and compiles in a batching thread
after the server listens: /health answers at once, /ready, /languages and /translate say
503 until the model is ready.
"""

import asyncio
import contextlib
import dataclasses
import functools
import importlib.resources
import logging
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from t2t_jax.serve import api, segment
from t2t_jax.serve.batching import Batcher, QueueFullError

log = logging.getLogger("t2t_jax.serve")

# LibreTranslate's CORS headers, on every answer: browser tools call the API directly.
CORS_HEADERS = {
  "Access-Control-Allow-Origin": "*",
  "Access-Control-Allow-Headers": "Authorization, Content-Type",
  "Access-Control-Expose-Headers": "Authorization",
  "Access-Control-Allow-Methods": "GET, POST",
  "Access-Control-Allow-Credentials": "true",
  "Access-Control-Max-Age": str(60 * 60 * 24 * 20),
}
STATIC_FILES = {"page.js": "text/javascript", "page.css": "text/css", "index.html": "text/html"}


@dataclasses.dataclass(frozen=True)
class ServerSettings:
  """The HTTP side's choices (t2t-serve's flags)."""

  limits: api.Limits = api.Limits()
  keys: frozenset[str] | None = None  # None: keys are ignored
  key_limits: Mapping[str, Any] | None = None  # key -> limits.KeyLimits (the keys file's)
  req_limit: int = -1  # requests a client a minute (-1: no limit), LibreTranslate's
  request_timeout_s: float = 60.0
  window_s: float = 0.005
  max_batch_chars: int = 32768
  max_queue_lines: int = 4096
  frontend_timeout_ms: int = 500  # the page's debounce, as LibreTranslate's frontendTimeout
  metrics: bool = False
  files: bool = True  # POST /translate_file and GET /download_file
  file_limit_bytes: int = 65536  # an upload's size at most (413 beyond)
  files_expiry_s: float = 30 * 60  # translated files are deleted this long after (LibreTranslate's)

  @property
  def max_body_bytes(self) -> int:
    """Room for batch_limit texts of char_limit characters of 4 UTF-8 bytes, JSON escapes
    and the other fields."""
    chars = self.limits.char_limit if self.limits.char_limit != -1 else 1 << 20
    texts = self.limits.batch_limit if self.limits.batch_limit != -1 else 1 << 10
    return 6 * min(chars * max(1, texts), 1 << 24) + 65536


class ClientGoneError(Exception):
  """The client disconnected before its answer was ready."""


class Served:
  """One model behind the server and the batching threads that run its batches."""

  def __init__(self, model: Any, settings: ServerSettings) -> None:
    self.model = model
    self.batcher = Batcher(
      self.translate_isolated,
      window_s=settings.window_s,
      max_batch_chars=settings.max_batch_chars,
      max_queue_lines=settings.max_queue_lines,
      workers=getattr(model, "batch_threads", 1),
    )

  @property
  def pair(self) -> api.Pair:
    return self.model.pair

  def translate_isolated(self, lines: list[str], nbest: int) -> list[Any]:
    """The model's translations of a batch; when the batch fails, each line alone, so that
    a line the model cannot take fails only its own request (`BadLine` in its place)."""
    try:
      return self.model.translate(lines, nbest)
    except Exception:
      if len(lines) == 1:
        raise
    found = []
    for line in lines:
      try:
        found.append(self.model.translate([line], nbest)[0])
      except Exception as e:
        log.warning("t2t-serve: a line of %d characters failed alone: %s", len(line), e)
        found.append(BadLine(type(e).__name__))
    return found


@dataclasses.dataclass(frozen=True)
class BadLine:
  """A line that failed on its own: its request is answered 500 (counted), the other
  requests of its batch get their translations."""

  error: str


class Server:
  """The app's state: the models (objects with load(), pair, beam_size, translate(lines,
  nbest), attention(source, target) and optionally batch_threads, the batches it may run at
  once), the batching threads of each, and readiness."""

  def __init__(self, models: Any, settings: ServerSettings = ServerSettings()) -> None:
    models = list(models) if isinstance(models, (list, tuple)) else [models]
    self.settings = settings
    self.pairs = api.Pairs(tuple(m.pair for m in models))
    self.served = {m.pair: Served(m, settings) for m in models}
    self.ready = threading.Event()
    self.failed: str | None = None
    self._loading = len(models)
    self._lock = threading.Lock()
    self.waiting = 0  # requests awaiting a model
    from t2t_jax import compilation  # jax: with the models, not with the app's module

    self.compilations = compilation.process_counter()  # XLA compilations of this process
    self.compiled_at_ready = 0
    self.limits = settings.limits
    self.rate = _rate_limiter(settings)
    self.metrics = _Metrics(self) if settings.metrics else None
    self.on_failure: Callable[[str], None] = lambda message: None
    self._detectors: dict[tuple[str, ...], Any] = {}
    self.split_sentences = 0  # sentences over a model's source length, cut into pieces
    self.files = _file_store(settings)

  @property
  def first(self) -> Served:
    """The first pair's model: the page's and /frontend/settings' default."""
    return self.served[self.pairs.pairs[0]]

  @property
  def model(self) -> Any:
    return self.first.model

  def start(self) -> None:
    """Starts each model's thread; its first work is loading and compiling the model."""
    for served in self.served.values():
      served.batcher.start()
      loaded = functools.partial(self._loaded, served)
      served.batcher.call(served.model.load).add_done_callback(loaded)

  def stop(self) -> None:
    for served in self.served.values():
      served.batcher.stop()
    if self.files is not None:
      self.files.close()

  def _loaded(self, served: Served, future: Future) -> None:
    if future.exception() is not None:
      self.failed = f"{served.pair}: {future.exception()}"
      self.on_failure(self.failed)
      return
    with self._lock:
      self._loading -= 1
      if self._loading:
        return
    cap = min(s.model.beam_size for s in self.served.values()) - 1
    if self.limits.alternatives_limit == -1 or self.limits.alternatives_limit > cap:
      self.limits = dataclasses.replace(self.limits, alternatives_limit=cap)
    self.compiled_at_ready = self.compilations.count
    self.ready.set()

  def check_ready(self) -> None:
    if self.failed is not None:
      raise api.ApiError(503, f"the model could not be loaded: {self.failed}")
    if not self.ready.is_set():
      raise api.ApiError(503, "the model is loading; try again shortly")

  def batcher(self, pair: api.Pair) -> Batcher:
    return self.served[pair].batcher

  def segments(self, texts: Sequence[str], pairs: Sequence[api.Pair]) -> list[Any]:
    """Each text as sentences (serve.segment) with its source language's rules, a sentence
    over its model's source budget cut into pieces that fit, never truncated; the cuts are
    logged and counted (t2t_serve_split_sentences)."""
    found = []
    for text, pair in zip(texts, pairs):
      model = self.served[pair].model
      budget = getattr(model, "max_tokens", None)
      count = getattr(model, "count_tokens", None) if budget else None
      found.append(segment.split_text(text, pair.source, count, budget))
    cut = sum(one.split for one in found)
    if cut:
      with self._lock:
        self.split_sentences += cut
      log.info("t2t-serve: %d sentences over the model's source length cut into pieces", cut)
    return found

  def translate_texts(self, texts: list[str], pair: api.Pair) -> list[str]:
    """Plain texts through the pair's model, sentence by sentence, from a thread other than
    the event loop (file and HTML translation): waits at most --request_timeout."""
    segments = self.segments(texts, [pair] * len(texts))
    sentences = [s for one in segments for s in one.sentences]
    future = self.submit(lambda: self.batcher(pair).submit(sentences, 0))
    found = future.result(timeout=self.settings.request_timeout_s)
    if any(isinstance(r, BadLine) for r in found):
      raise InternalError("the model failed on a sentence")
    return segment.put_back(segments, found, 0, pair.target)[0]

  def translate_html(self, texts: Sequence[str], pairs: Sequence[api.Pair]) -> list[str]:
    """format=html: each text's visible text translated, its tags and attributes kept."""
    from t2t_jax.serve import formats

    return [
      formats.translate_html(text, functools.partial(self.translate_texts, pair=pair))
      for text, pair in zip(texts, pairs)
    ]

  def detector(self, languages: list[str]) -> Any:
    """The language detector restricted to `languages` (serve.detect), built once each."""
    from t2t_jax.serve import detect

    key = tuple(languages)
    with self._lock:
      if key not in self._detectors:
        self._detectors[key] = detect.Detector(key)
      return self._detectors[key]

  def detect(self, text: str, target: str) -> tuple[str, float]:
    """(language, confidence in percent) of a text among the served sources translating
    into `target` (certain when there is one)."""
    from t2t_jax.serve import detect

    code, confidence = self.detector(self.pairs.sources_into(target)).best(text)
    return code, detect.percent(confidence)

  async def run(self, request: Request, future: Future) -> Any:
    """The future's result, awaited without blocking the loop; dropped from the queue when
    the client disconnects or the request's time runs out."""
    waiter = asyncio.wrap_future(future)
    gone = asyncio.ensure_future(_disconnected(request))
    self.waiting += 1
    try:
      done, _ = await asyncio.wait(
        {waiter, gone}, timeout=self.settings.request_timeout_s, return_when="FIRST_COMPLETED"
      )
    finally:
      gone.cancel()
      self.waiting -= 1
    if waiter in done:
      return waiter.result()
    waiter.cancel()  # also cancels the queued work, unless it is running already
    if gone in done:
      raise ClientGoneError()
    raise api.ApiError(
      503, f"translation timed out after {self.settings.request_timeout_s:g}s; try again"
    )

  def submit(self, submit: Callable[[], Future]) -> Future:
    try:
      return submit()
    except QueueFullError as e:
      raise api.ApiError(503, f"the server is busy ({e}); try again shortly") from None

  async def translate_lines(
    self, request: Request, lines: list[str], pairs: list[api.Pair], nbest: int
  ) -> list[Any]:
    """Each line's result through its pair's model, in order: one batch per pair, queued
    together; a line that failed on its own fails the request."""
    by_pair: dict[api.Pair, list[int]] = {}
    for i, pair in enumerate(pairs):
      by_pair.setdefault(pair, []).append(i)
    futures = {
      pair: self.submit(
        lambda pair=pair, ids=ids: self.batcher(pair).submit([lines[i] for i in ids], nbest)
      )
      for pair, ids in by_pair.items()
    }
    found: list[Any] = [None] * len(lines)
    for pair, ids in by_pair.items():
      for i, result in zip(ids, await self.run(request, futures[pair])):
        if isinstance(result, BadLine):
          raise InternalError(f"the model failed on a line ({result.error})")
        found[i] = result
    return found


def _file_store(settings: ServerSettings) -> Any:
  """The private store of translated files (serve.files), None when files are off."""
  from t2t_jax.serve import files

  if not settings.files:
    return None
  return files.FileStore(None, settings.files_expiry_s, settings.file_limit_bytes)


def _rate_limiter(settings: ServerSettings) -> Any:
  """The per-client (and per-key) request limiter, None when nothing is limited."""
  from t2t_jax.serve import limits

  per_key = limits.req_limits_of(settings.key_limits or {})
  if settings.req_limit == -1 and not per_key:
    return None
  return limits.RateLimiter(settings.req_limit, per_key=per_key)


def admit(request: Request, server: "Server", fields: Mapping[str, Any]) -> api.Limits:
  """LibreTranslate's order: the client's request limit (429, before any key check, so that
  keys cannot be guessed at speed), then the key; the request's limits, with its key's own
  character limit."""
  from t2t_jax.serve import limits

  key = fields.get("api_key")
  if server.rate is not None:
    q = fields.get("q")
    cost = len(q) if isinstance(q, list) and q else 1
    client = request.client.host if request.client else "unknown"
    try:
      server.rate.hit(client, key, cost=cost)
    except limits.RateLimited as e:
      raise api.ApiError(429, e.message, {"Retry-After": e.retry_after_header}) from None
  api.check_key(key, server.settings.keys)
  char_limit = limits.char_limit_of(key, server.settings.key_limits, server.limits.char_limit)
  return dataclasses.replace(server.limits, char_limit=char_limit)


class InternalError(Exception):
  """The server's own failure: answered 500 with an id that its log line carries."""


async def _disconnected(request: Request) -> None:
  """Returns when the client has gone (the body is read already: the next message is the
  disconnect)."""
  while True:
    message = await request.receive()
    if message["type"] == "http.disconnect":
      return


async def read_fields(request: Request, limit: int) -> tuple[dict[str, Any], bool]:
  """(fields, from_json) of a request as LibreTranslate reads them: a JSON body's object, or
  the query string's fields with a form body's after them."""
  body = await _body(request, limit)
  content_type = request.headers.get("content-type", "")
  if api.is_json(content_type):
    return api.json_fields(body), True
  query = api.urlencoded_fields(request.scope.get("query_string", b""), "the query string")
  if api.is_form(content_type):
    return api.merged_values(query, api.urlencoded_fields(body, "the form body")), False
  if content_type.lower().startswith("multipart/form-data"):
    form = await _form(request, body)
    fields = {name: value for name, value in form.multi_items() if isinstance(value, str)}
    return api.merged_values(query, fields), False
  return query, False


async def _body(request: Request, limit: int) -> bytes:
  """The request's body, refused (413) beyond `limit` bytes before it is all read."""
  length = request.headers.get("content-length", "")
  if length.isdigit() and int(length) > limit:
    raise api.ApiError(413, f"Invalid request: the body has {length} bytes (at most {limit})")
  chunks, size = [], 0
  try:
    async for chunk in request.stream():
      size += len(chunk)
      if size > limit:
        raise api.ApiError(413, f"Invalid request: the body is over {limit} bytes")
      chunks.append(chunk)
  except ClientDisconnect:
    raise ClientGoneError() from None
  return b"".join(chunks)


async def _form(request: Request, body: bytes) -> Any:
  """A multipart body's form (strings and uploads), parse errors answered 400."""
  sent = False

  async def replay() -> dict:
    nonlocal sent
    if sent:
      return {"type": "http.disconnect"}
    sent = True
    return {"type": "http.request", "body": body, "more_body": False}

  try:
    return await Request(request.scope, replay).form()
  except Exception as e:  # python-multipart's parse errors have no common base
    raise api.ApiError(400, f"Invalid request: the multipart body cannot be read ({e})") from None


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
  """{"error": message}; what UTF-8 cannot carry (a lone surrogate a message quotes from a
  request) is written as its escape, so that no answer fails to encode."""
  message = message.encode("utf-8", "backslashreplace").decode("utf-8")
  return JSONResponse({"error": message}, status_code=status, headers=headers)


def _handled(fn: Callable) -> Callable:
  """An endpoint whose ApiError is its JSON answer, whose gone client ends it quietly, and
  whose own failure is a counted 500 naming an id its log line carries (never the
  exception's text, which may hold what a client sent)."""

  async def endpoint(request: Request) -> Response:
    started = time.monotonic()
    try:
      response = await fn(request)
    except api.ApiError as e:
      response = _error(e.status, e.message, e.headers)
    except ClientGoneError:
      response = Response(status_code=499)
    except Exception as e:
      response = _internal(request, e)
    server: Server = request.app.state.server
    if server.metrics is not None:
      server.metrics.observe(fn.__name__, response.status_code, time.monotonic() - started)
    return response

  return endpoint


def _internal(request: Request, e: Exception) -> Response:
  incident = secrets.token_hex(6)
  log.error(
    "t2t-serve: internal error %s: %s %s", incident, request.method, request.url.path, exc_info=e
  )
  return _error(500, f"internal error {incident}")


async def detect_language(request: Request) -> Response:
  """POST /detect: LibreTranslate's, [{"confidence", "language"}] among the served source
  languages, most likely first (a list q is detected as one text)."""
  from t2t_jax.serve import detect

  server: Server = request.app.state.server
  server.check_ready()
  fields, from_json = await read_fields(request, server.settings.max_body_bytes)
  limits = admit(request, server, fields)
  q = fields.get("q")
  if not q:
    raise api.ApiError(400, "Invalid request: missing q parameter")
  texts, _ = api.texts_of(q, limits)
  detector = server.detector(list(dict.fromkeys(p.source for p in server.pairs.pairs)))
  loop = asyncio.get_running_loop()
  found = await loop.run_in_executor(None, detector.detect, "\n".join(texts))
  return JSONResponse(detect.as_libretranslate(found))


async def _upload(request: Request, limit: int) -> tuple[dict[str, str], Any]:
  """(fields, the `file` upload or None) of a multipart/form-data body within `limit`."""
  if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
    raise api.ApiError(400, "Invalid request: send the file as multipart/form-data")
  body = await _body(request, limit)
  form = await _form(request, body)
  fields = {name: value for name, value in form.multi_items() if isinstance(value, str)}
  upload = form.get("file")
  return fields, None if isinstance(upload, str) else upload


async def translate_file(request: Request) -> Response:
  """POST /translate_file: LibreTranslate's, a .txt, .html or .srt upload translated and
  kept for GET /download_file (serve.files)."""
  from t2t_jax.serve import files, formats

  server: Server = request.app.state.server
  if server.files is None:
    raise api.ApiError(403, "Files translation are disabled on this server.")
  server.check_ready()
  fields, upload = await _upload(request, server.files.max_bytes + 65536)
  admit(request, server, fields)
  if upload is None:
    raise api.ApiError(400, "Invalid request: missing file parameter")
  for name in ("source", "target"):
    if not fields.get(name):
      raise api.ApiError(400, f"Invalid request: missing {name} parameter")
  if not upload.filename:
    raise api.ApiError(400, "Invalid request: empty file")
  try:
    extension = formats.extension_of(upload.filename)
  except ValueError as e:
    raise api.ApiError(400, f"Invalid request: {e}") from None
  data = await upload.read()
  try:
    server.files.check_size(len(data))
  except files.FileTooLargeError as e:
    raise api.ApiError(413, str(e)) from None
  source, target = api.check_languages(fields["source"], fields["target"], server.pairs)
  loop = asyncio.get_running_loop()
  if source == api.AUTO:
    sample = data[:4000].decode("utf-8", "replace")
    source, _ = await loop.run_in_executor(None, server.detect, sample, target)
  pair = api.Pair(source, target)
  translate = functools.partial(server.translate_texts, pair=pair)
  try:
    out, _ = await loop.run_in_executor(
      None, formats.translate_file, data, upload.filename, translate
    )
  except ValueError as e:
    raise api.ApiError(400, f"Invalid request: {e}") from None
  file_id = server.files.put(out, extension, files.translated_name(upload.filename, target))
  return JSONResponse({"translatedFileUrl": f"{request.base_url}download_file/{file_id}"})


async def download_file(request: Request) -> Response:
  """GET /download_file/ID: a file POST /translate_file translated, until it expires."""
  from t2t_jax.serve import files

  server: Server = request.app.state.server
  if server.files is None:
    raise api.ApiError(403, "Files translation are disabled on this server.")
  try:
    data, name, media_type = server.files.get(request.path_params["file_id"])
  except KeyError:
    raise api.ApiError(404, "Not Found: no such file (or it has expired)") from None
  headers = {"Content-Disposition": files.content_disposition(name)}
  return Response(data, media_type=media_type, headers=headers)


async def _pairs_of(server: Server, req: api.TranslateRequest) -> list[tuple[str, float]]:
  """Each text's (source, confidence): the request's source, or the detected one."""
  if not req.detect:
    return [(req.source, 100.0)] * len(req.texts)
  loop = asyncio.get_running_loop()
  return [await loop.run_in_executor(None, server.detect, text, req.target) for text in req.texts]


async def translate(request: Request) -> Response:
  """POST /translate: LibreTranslate's."""
  server: Server = request.app.state.server
  server.check_ready()
  fields, from_json = await read_fields(request, server.settings.max_body_bytes)
  limits = admit(request, server, fields)
  req = api.parse_translate(fields, from_json, server.pairs, limits)
  nbest = req.alternatives + 1 if req.alternatives else 0
  detected = await _pairs_of(server, req)
  pairs = [api.Pair(source, req.target) for source, _ in detected]
  loop = asyncio.get_running_loop()
  if req.format == "html":
    best = await loop.run_in_executor(None, server.translate_html, req.texts, pairs)
    return JSONResponse(api.translate_answer(req, best, [[] for _ in best], detected))
  segments = await loop.run_in_executor(None, server.segments, req.texts, pairs)
  sentences = [s for one in segments for s in one.sentences]
  sentence_pairs = [p for p, one in zip(pairs, segments) for _ in one.sentences]
  found = await server.translate_lines(request, sentences, sentence_pairs, nbest)
  best, alternatives = segment.put_back(segments, found, req.alternatives, req.target)
  return JSONResponse(api.translate_answer(req, best, alternatives, detected))


def _page_pair(server: Server, fields: dict[str, Any]) -> api.Pair:
  """The page's pair: the fields' source and target, else the first served pair."""
  source, target = fields.get("source"), fields.get("target")
  if source is None and target is None:
    return server.pairs.pairs[0]
  if not isinstance(source, str) or not isinstance(target, str):
    raise api.ApiError(400, "Invalid request: source and target must be language codes")
  return server.pairs.choose(source, target)


async def page_translate(request: Request) -> Response:
  """POST /api/translate, the page's: per line its translation, n-best with scores, and
  for the first `attention_lines` lines the encoder-decoder attention of the translation
  shown, each layer's mean over its heads cut to serve.page's size (null for the other
  lines, which `attention_note` says); docs/serving.md."""
  from t2t_jax.serve import page

  server: Server = request.app.state.server
  server.check_ready()
  fields, _ = await read_fields(request, server.settings.max_body_bytes)
  limits = admit(request, server, fields)
  pair = _page_pair(server, fields)
  q = fields.get("q")
  if not isinstance(q, str):
    raise api.ApiError(400, "Invalid request: q must be a string")
  texts, _ = api.texts_of(q, limits)
  nbest = api.alternatives_count(fields.get("alternatives", 0), limits.alternatives_limit)
  lines = api.split_lines(texts[0])
  todo = [line for line in lines if api.translatable(line)]
  want_attention = fields.get("attention", True) is not False
  cap = server.limits.attention_lines
  mapped = (len(todo) if cap == -1 else min(len(todo), max(0, cap))) if want_attention else 0
  found = await server.translate_lines(request, todo, [pair] * len(todo), nbest + 1)
  attention: list[Any] = [None] * len(todo)
  if mapped:
    model = server.served[pair].model
    pairs = [(line, hyps[0].text) for line, hyps in zip(todo[:mapped], found)]
    # in the model's thread: the model's attention and its cut to the page's size
    job = lambda: [page.line_attention(model.attention(s, t)) for s, t in pairs]
    batcher = server.batcher(pair)
    attention[:mapped] = await server.run(request, server.submit(lambda: batcher.call(job)))
  answers, it = [], iter(zip(found, attention))
  for line in lines:
    hyps, att = next(it) if api.translatable(line) else ([], None)
    answers.append(
      dict(
        source=line,
        translation=hyps[0].text if hyps else "",
        nbest=[dict(text=h.text, score=h.score, log_prob=h.log_prob) for h in hyps],
        attention=att,
      )
    )
  note = page.lines_note(len(todo), mapped) if want_attention else None
  content = {"lines": answers, "attention_note": note}
  body = await asyncio.get_running_loop().run_in_executor(None, page.json_body, content)
  return Response(body, media_type="application/json")


async def page_attention(request: Request) -> Response:
  """POST /api/attention, the page's: the map of one line (`q`) and its translation
  (`translation`, teacher-forced) as /api/translate gives it, with `layer` also that
  layer's heads (`layer_heads`); `source` and `target` pick the pair."""
  from t2t_jax.serve import page

  server: Server = request.app.state.server
  server.check_ready()
  fields, _ = await read_fields(request, server.settings.max_body_bytes)
  limits = admit(request, server, fields)
  pair = _page_pair(server, fields)
  q, translation, layer = fields.get("q"), fields.get("translation"), fields.get("layer")
  if not isinstance(q, str) or not isinstance(translation, str):
    raise api.ApiError(400, "Invalid request: q and translation must be strings")
  if "\n" in q or "\n" in translation or not api.translatable(q):
    raise api.ApiError(400, "Invalid request: q must be one non-blank line, translation one line")
  if layer is not None and (type(layer) is not int or layer < 0):
    raise api.ApiError(400, "Invalid request: layer must be a layer number (0 is the first)")
  (source,), _ = api.texts_of(q, limits)
  target = api.without_surrogates(translation)
  if limits.char_limit != -1 and len(target) > limits.char_limit:
    raise api.ApiError(
      400, f"Invalid request: translation ({len(target)}) exceeds text limit ({limits.char_limit})"
    )
  model = server.served[pair].model
  job = lambda: page.line_attention(model.attention(source, target), layer=layer)
  batcher = server.batcher(pair)
  found = await server.run(request, server.submit(lambda: batcher.call(job)))
  body = await asyncio.get_running_loop().run_in_executor(None, page.json_body, found)
  return Response(body, media_type="application/json")


async def languages(request: Request) -> Response:
  server: Server = request.app.state.server
  server.check_ready()
  return JSONResponse(server.pairs.languages())


async def frontend_settings(request: Request) -> Response:
  """LibreTranslate's /frontend/settings (what its page and some clients read first): the
  first pair is the default."""
  from t2t_jax.serve import formats

  server: Server = request.app.state.server
  pair = server.pairs.pairs[0]
  keys = server.settings.keys is not None
  return JSONResponse(
    dict(
      charLimit=server.limits.char_limit,
      frontendTimeout=server.settings.frontend_timeout_ms,
      apiKeys=keys,
      keyRequired=keys,
      suggestions=False,
      filesTranslation=server.files is not None,
      supportedFilesFormat=sorted(formats.FORMATS) if server.files is not None else [],
      alternativesLimit=server.limits.alternatives_limit if server.ready.is_set() else 0,
      attentionLines=server.limits.attention_lines,
      ready=server.ready.is_set(),
      language=dict(
        source=dict(code=pair.source, name=api.language_name(pair.source)),
        target=dict(code=pair.target, name=api.language_name(pair.target)),
      ),
    )
  )


async def spec(request: Request) -> Response:
  """GET /spec: the OpenAPI description of the routes (LibreTranslate's /spec)."""
  from t2t_jax import __version__
  from t2t_jax.serve.spec import openapi_spec

  server: Server = request.app.state.server
  return JSONResponse(openapi_spec(__version__, server.pairs.codes()))


async def health(request: Request) -> Response:
  """Liveness: answers as soon as the process serves HTTP, model loaded or not."""
  server: Server = request.app.state.server
  return JSONResponse(dict(status="ok", ready=server.ready.is_set()))


async def ready(request: Request) -> Response:
  server: Server = request.app.state.server
  server.check_ready()
  return JSONResponse(dict(ready=True))


async def metrics(request: Request) -> Response:
  server: Server = request.app.state.server
  if server.metrics is None:
    raise api.ApiError(404, "metrics are off (t2t-serve --metrics)")
  return server.metrics.response()


async def static(request: Request) -> Response:
  name = request.path_params.get("name", "index.html")
  if name not in STATIC_FILES:
    raise api.ApiError(404, f"Not Found: /static/{name}")
  data = importlib.resources.files("t2t_jax.serve").joinpath("static", name).read_bytes()
  return Response(data, media_type=STATIC_FILES[name], headers={"Cache-Control": "no-cache"})


class _Cors:
  """ASGI middleware: LibreTranslate's CORS headers on every answer; OPTIONS (a browser's
  preflight) answered 204 at once."""

  def __init__(self, app: Any) -> None:
    self.app = app

  async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
      return await self.app(scope, receive, send)
    extra = [(k.lower().encode(), v.encode()) for k, v in CORS_HEADERS.items()]
    if scope["method"] == "OPTIONS":
      await send({"type": "http.response.start", "status": 204, "headers": extra})
      return await send({"type": "http.response.body", "body": b""})

    async def with_headers(message: dict) -> None:
      if message["type"] == "http.response.start":
        message = dict(message, headers=list(message.get("headers", [])) + extra)
      await send(message)

    await self.app(scope, receive, with_headers)


async def _http_error(request: Request, e: Exception) -> Response:
  assert isinstance(e, HTTPException)
  return _error(e.status_code, f"{e.detail}: {request.method} {request.url.path}")


async def _internal_error(request: Request, e: Exception) -> Response:
  return _internal(request, e)


def create_app(server: Server) -> Starlette:
  """The ASGI app over `server` (started by the app's lifespan, stopped after the last
  request in flight has its answer)."""
  routes = [
    Route("/", _handled(static), methods=["GET"]),
    Route("/static/{name}", _handled(static), methods=["GET"]),
    Route("/translate", _handled(translate), methods=["POST"]),
    Route("/languages", _handled(languages), methods=["GET"]),
    Route("/detect", _handled(detect_language), methods=["POST"]),
    Route("/translate_file", _handled(translate_file), methods=["POST"]),
    Route("/download_file/{file_id}", _handled(download_file), methods=["GET"]),
    Route("/frontend/settings", _handled(frontend_settings), methods=["GET"]),
    Route("/api/translate", _handled(page_translate), methods=["POST"]),
    Route("/api/attention", _handled(page_attention), methods=["POST"]),
    Route("/health", _handled(health), methods=["GET"]),
    Route("/spec", _handled(spec), methods=["GET"]),
    Route("/ready", _handled(ready), methods=["GET"]),
    Route("/metrics", _handled(metrics), methods=["GET"]),
  ]

  @contextlib.asynccontextmanager
  async def lifespan(app: Starlette) -> Any:
    server.start()
    yield
    await asyncio.get_running_loop().run_in_executor(None, server.stop)

  app = Starlette(
    routes=routes,
    lifespan=lifespan,
    exception_handlers={HTTPException: _http_error, Exception: _internal_error},
  )
  app.state.server = server
  app.add_middleware(_Cors)
  return app


class _Metrics:
  """Prometheus metrics in the app's own registry (none of the process's global state):
  queue depth, batch sizes, request latency by path and status."""

  def __init__(self, server: Server) -> None:
    import prometheus_client as prom

    self.prom = prom
    self.registry = prom.CollectorRegistry()
    self.latency = prom.Histogram(
      "t2t_serve_request_seconds",
      "request latency",
      ["endpoint", "status"],
      registry=self.registry,
    )
    depth = prom.Gauge(
      "t2t_serve_queue_lines", "lines waiting for the model", registry=self.registry
    )
    depth.set_function(lambda: sum(s.batcher.depth for s in server.served.values()))
    waiting = prom.Gauge(
      "t2t_serve_waiting_requests", "requests awaiting the model", registry=self.registry
    )
    waiting.set_function(lambda: server.waiting)
    for name, doc, field in (
      ("t2t_serve_batches", "batches run", "batches"),
      ("t2t_serve_batched_lines", "lines translated", "lines"),
      ("t2t_serve_batched_requests", "requests in batches", "requests"),
      ("t2t_serve_dropped_requests", "queued requests dropped", "dropped"),
      ("t2t_serve_last_batch_lines", "lines of the last batch", "last_batch_lines"),
    ):
      gauge = prom.Gauge(name, f"{doc}, all models together", registry=self.registry)
      gauge.set_function(
        lambda field=field: sum(
          getattr(s.batcher.stats.snapshot(), field) for s in server.served.values()
        )
      )
    prom.Gauge(
      "t2t_serve_split_sentences",
      "sentences longer than their model's source length, cut into pieces (never truncated)",
      registry=self.registry,
    ).set_function(lambda: server.split_sentences)
    count = server.compilations
    prom.Gauge(
      "t2t_serve_compilations", "XLA compilations of the process", registry=self.registry
    ).set_function(lambda: count.count)
    prom.Gauge(
      "t2t_serve_compilations_after_ready",
      "XLA compilations since /ready: requests that waited for a program",
      registry=self.registry,
    ).set_function(lambda: count.count - server.compiled_at_ready if server.ready.is_set() else 0)
    memory = prom.Gauge(
      "t2t_serve_model_bytes",
      "bytes of a model's parameters and their decoding copies (0 until loaded)",
      ["pair"],
      registry=self.registry,
    )
    for pair, served in server.served.items():
      memory.labels(str(pair)).set_function(
        lambda model=served.model: getattr(model, "param_bytes", 0)
      )

  def observe(self, endpoint: str, status: int, seconds: float) -> None:
    self.latency.labels(endpoint, str(status)).observe(seconds)

  def response(self) -> Response:
    body = self.prom.generate_latest(self.registry)
    return Response(body, media_type=self.prom.CONTENT_TYPE_LATEST)


def http_implementation() -> str:
  """uvicorn's HTTP parser: httptools (C, the serve extra's) where installed, else h11 (pure
  Python). On the tiny model 16 clients got about 1.5x the requests/s with httptools
  (docs/serving.md): with a small model, parsing requests is much of the server's time."""
  try:
    import httptools  # noqa: F401
  except ImportError:
    return "h11"
  return "httptools"


def serve_forever(server: Server, host: str, port: int, graceful_timeout_s: float) -> int:
  """Serves until SIGTERM or SIGINT, then stops accepting, answers what is in flight and
  returns 0; 1 when the model could not be loaded (the failure ends the server)."""
  import uvicorn

  class _Uvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Any:
      # uvicorn's own re-raises the signal after shutting down (exit status 130 or -15);
      # a clean stop exits 0.
      wanted = (signal.SIGINT, signal.SIGTERM)
      old = {sig: signal.signal(sig, self.handle_exit) for sig in wanted}
      try:
        yield
      finally:
        for sig, handler in old.items():
          signal.signal(sig, handler)

  config = uvicorn.Config(
    create_app(server),
    host=host,
    port=port,
    http=http_implementation(),
    log_level="warning",
    timeout_graceful_shutdown=graceful_timeout_s,
    lifespan="on",
  )
  runner = _Uvicorn(config)

  def failed(message: str) -> None:
    print(f"t2t-serve: the model could not be loaded: {message}", file=sys.stderr, flush=True)
    runner.should_exit = True

  def announce() -> None:
    server.ready.wait()
    for pair, served in server.served.items():
      warm_up = getattr(served.model, "warm_up", None)
      compiled = f"; compiled {warm_up}" if warm_up else ""
      print(
        f"t2t-serve: ready ({pair.source} -> {pair.target}{compiled})", file=sys.stderr, flush=True
      )

  server.on_failure = failed
  threading.Thread(target=announce, daemon=True).start()
  print(
    f"t2t-serve: listening on http://{host}:{port} (ready once the model is loaded and "
    "compiled: GET /ready)",
    file=sys.stderr,
    flush=True,
  )
  runner.run()
  return 1 if server.failed is not None else 0
