"""t2t-serve: trained workdirs behind LibreTranslate's HTTP API, with a page at `/`.

    t2t-serve --workdir=[SRC:TGT=]DIR[,DIR...] [--workdir=...] [--host=127.0.0.1] [--port=5000]
              [--checkpoint=auto|latest|average:N|best[:N]|ema|STEP|selected]
              [--beam_size=N] [--alpha=A] [--char_limit=5000] [--batch_limit=128]
              [--alternatives_limit=3] [--batch_window_ms=5] [--api_keys=FILE] [--req_limit=N]
              [--metrics]
              [--dtype=auto|float32|bfloat16]

POST /translate takes q (a string or a list), source, target, format, alternatives and
api_key as JSON, a form body or query parameters, and answers {"translatedText": ...};
each --workdir serves one language pair (its config's source_lang and target_lang, or the
SRC:TGT= before it; several DIRs: their ensemble), and a request's source and target pick
the model. GET /languages lists the pairs; GET / is the page (translation, n-best, attention
heat map). /health answers at once; /ready, /languages and /translate answer 503 until the
model is loaded and compiled. Concurrent requests arriving within --batch_window_ms are
translated together. SIGTERM or SIGINT: stop accepting, answer what is in flight, exit 0.
It binds 127.0.0.1 unless --host says otherwise: it has no TLS and, without --api_keys, no
access control (docs/serving.md, security).
"""

import re
from collections.abc import Sequence
from typing import Any

from absl import flags

from t2t_jax.cli import common
from t2t_jax.decoding import precision

flags.DEFINE_multi_string(
  "workdir",
  None,
  "[SRC:TGT=]DIR[,DIR...]: a t2t-train workdir serving the pair of its config (or SRC to "
  "TGT); several comma-separated: their ensemble; repeat the flag for more pairs",
)
flags.DEFINE_string("host", "127.0.0.1", "address to bind (0.0.0.0: every interface)")
flags.DEFINE_integer("port", 5000, "TCP port")
flags.DEFINE_string("checkpoint", "auto", common.CHECKPOINT_HELP)
flags.DEFINE_integer("beam_size", None, "beam width (default: the workdir's config.beam_size)")
flags.DEFINE_float("alpha", None, "length penalty exponent (default: the workdir's config.alpha)")
flags.DEFINE_integer(
  "char_limit", 5000, "characters per text (each text of a list q on its own; -1: no limit)"
)
flags.DEFINE_integer(
  "req_limit",
  -1,
  "requests a client (address) a minute, a list q of n texts counting n; beyond: 429 "
  "(-1: no limit; LibreTranslate's --req-limit)",
)
flags.DEFINE_integer("batch_limit", 128, "texts in one list q (-1: no limit)")
flags.DEFINE_integer(
  "alternatives_limit", 3, "n-best alternatives per request (at most beam size - 1; -1: that)"
)
flags.DEFINE_integer(
  "batch_window_ms", 5, "how long the oldest queued request waits for others to batch with"
)
flags.DEFINE_integer(
  "batch_threads",
  0,
  "batches of one model decoded at once (0: 2 where JAX runs on the CPU, whose second core "
  "a batch's small stages leave idle, else 1)",
)
flags.DEFINE_integer(
  "max_batch_chars", 32768, "a batch's padded size: rows x longest line, in characters"
)
flags.DEFINE_integer("max_queue_lines", 4096, "lines waiting at most; beyond: 503")
flags.DEFINE_float("request_timeout", 60.0, "seconds a request may wait for its answer: 503")
flags.DEFINE_integer("batch_tokens", 4096, "source tokens per decoding batch")
flags.DEFINE_list(
  "batch_rows",
  ["1", "8"],
  "the row counts every decoding batch is padded to (n lines take the smallest that holds "
  "n; the largest bounds a batch); each is compiled for every source bucket before /ready",
)
flags.DEFINE_enum(
  "warm_up",
  "plain",
  ["plain", "all"],
  "what is compiled before /ready: every batch shape (--batch_rows x source buckets) for "
  "plain translations, or also for each n-best size --alternatives_limit allows, so that "
  "no request compiles later",
)
flags.DEFINE_enum(
  "dtype",
  "auto",
  list(precision.DTYPES),
  "the products' dtype, as t2t-translate's --dtype ('auto': bfloat16 on a CPU with amx_bf16 "
  "or avx512_bf16)",
)
flags.DEFINE_string(
  "api_keys",
  None,
  "a file of API keys, one a line (KEY, or KEY req_limit=N char_limit=M for its own "
  "limits): every request then needs one of them",
)
flags.DEFINE_boolean(
  "files_translation", True, "POST /translate_file and GET /download_file (.txt, .html, .srt)"
)
flags.DEFINE_integer("file_limit", 65536, "bytes an uploaded file may have; beyond: 413")
flags.DEFINE_float(
  "files_expiry_minutes", 30.0, "minutes a translated file is kept for GET /download_file"
)
flags.DEFINE_boolean("metrics", False, "Prometheus metrics at /metrics (needs prometheus_client)")
flags.DEFINE_string("compilation_cache", "default", common.COMPILATION_CACHE_HELP)
FLAGS = flags.FLAGS
# --workdir=en:de=DIR: the pair named before the workdir(s)
PAIRED = re.compile(r"([A-Za-z]{2,3}(?:-[A-Za-z0-9]+)?):([A-Za-z]{2,3}(?:-[A-Za-z0-9]+)?)=(.+)")


def _fail(message: str) -> None:
  raise SystemExit(f"t2t-serve: {message}")


def _usage(message: str) -> None:
  common.refuse("t2t-serve", message)


def _keys(path: str | None) -> dict[str, Any] | None:
  """The keys file's keys with their own limits (serve.limits.read_key_limits)."""
  from t2t_jax.serve import limits

  if not path:
    return None
  try:
    with open(path, encoding="utf-8") as f:
      return limits.read_key_limits(f.read().splitlines(), path)
  except (OSError, UnicodeDecodeError) as e:
    _fail(f"--api_keys={path}: cannot read ({getattr(e, 'strerror', None) or e})")
  except ValueError as e:
    _fail(str(e))


def _check_flags() -> None:
  if not FLAGS.workdir:
    _usage("--workdir is required")
  if FLAGS.beam_size is not None and FLAGS.beam_size < 1:
    _usage(f"--beam_size={FLAGS.beam_size} must be >= 1 (1: greedy)")
  for name in ("char_limit", "batch_limit", "alternatives_limit"):
    if FLAGS[name].value < -1:
      _usage(f"--{name}={FLAGS[name].value} must be >= 0 (-1: no limit)")
  if FLAGS.file_limit < 1:
    _usage(f"--file_limit={FLAGS.file_limit} must be >= 1 (bytes)")
  if not FLAGS.files_expiry_minutes > 0:
    _usage(f"--files_expiry_minutes={FLAGS.files_expiry_minutes} must be > 0")
  if FLAGS.req_limit < 1 and FLAGS.req_limit != -1:
    _usage(f"--req_limit={FLAGS.req_limit} must be >= 1 (-1: no limit)")
  if FLAGS.batch_threads < 0:
    _usage(f"--batch_threads={FLAGS.batch_threads} must be >= 0 (0: the backend's default)")
  for name in (
    "batch_window_ms",
    "max_batch_chars",
    "max_queue_lines",
    "batch_tokens",
  ):
    if FLAGS[name].value < (0 if name == "batch_window_ms" else 1):
      _usage(f"--{name}={FLAGS[name].value} is too small")
  batch_rows(FLAGS.batch_rows)
  if not 0 < FLAGS.port < 65536:
    _usage(f"--port={FLAGS.port} must be in 1..65535")


def batch_rows(values: Sequence[str]) -> tuple[int, ...]:
  """--batch_rows as ascending counts; a usage error for anything but positive integers."""
  try:
    rows = sorted({int(v) for v in values})
  except ValueError:
    rows = []
  if not rows or rows[0] < 1:
    _usage(f"--batch_rows={','.join(values)}: positive integers, e.g. 1,8")
  return tuple(rows)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    _usage(f"unexpected arguments {argv[1:]}: flags are written --name=value (t2t-serve --help)")
  _check_flags()
  keys = _keys(FLAGS.api_keys)  # before the extra's imports: a wrong line needs none of them
  try:
    from t2t_jax.serve import api, app, worker
  except ImportError as e:
    _fail(f"{e.name} is missing: pip install 't2t_jax[serve]'")
  common.quiet_library_logs()
  common.use_compilation_cache(FLAGS)
  settings = app.ServerSettings(
    limits=api.Limits(
      char_limit=FLAGS.char_limit,
      batch_limit=FLAGS.batch_limit,
      alternatives_limit=FLAGS.alternatives_limit,
    ),
    keys=None if keys is None else frozenset(keys),
    key_limits=keys,
    req_limit=FLAGS.req_limit,
    request_timeout_s=FLAGS.request_timeout,
    window_s=FLAGS.batch_window_ms / 1000,
    max_batch_chars=FLAGS.max_batch_chars,
    max_queue_lines=FLAGS.max_queue_lines,
    metrics=FLAGS.metrics,
    files=FLAGS.files_translation,
    file_limit_bytes=FLAGS.file_limit,
    files_expiry_s=FLAGS.files_expiry_minutes * 60,
  )
  models = [_model(worker, api, entry) for entry in FLAGS.workdir]
  try:
    server = app.Server(models, settings)
  except ValueError as e:
    _usage(str(e))
  code = app.serve_forever(server, FLAGS.host, FLAGS.port, FLAGS.request_timeout)
  if code:
    raise SystemExit(code)


def _model(worker: Any, api: Any, entry: str) -> Any:
  """The model of one --workdir entry, [SRC:TGT=]DIR[,DIR...]."""
  match = PAIRED.fullmatch(entry)
  pair = api.Pair(match[1], match[2]) if match else None
  workdirs = worker.workdir_list(match[3] if match else entry)
  model_settings = worker.ModelSettings(
    workdirs=workdirs,
    pair=pair,
    checkpoint=FLAGS.checkpoint,
    beam_size=FLAGS.beam_size,
    alpha=FLAGS.alpha,
    batch_tokens=FLAGS.batch_tokens,
    batch_rows=batch_rows(FLAGS.batch_rows),
    batch_threads=FLAGS.batch_threads,
    alternatives_limit=FLAGS.alternatives_limit,
    warm_up=FLAGS.warm_up,
    dtype=FLAGS.dtype,
  )
  try:
    return worker.Model(model_settings)
  except worker.ModelError as e:
    _fail(str(e))


def run() -> None:
  common.run(main, __doc__)


if __name__ == "__main__":
  run()
