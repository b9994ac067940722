"""t2t-serve's fixed batch shapes (rows padded to --batch_rows, sources to powers of two,
each shape compiled before /ready, the compilations after /ready counted) and its batching
threads (two batches at once on a CPU, a load or attention call alone)."""

from tools.mutations import Mutation

M = Mutation
BATCHING = "t2t_jax/decoding/batching.py"
FIRST = ("tests/test_serve_warm_up.py",)
MUTATIONS = (
  M(
    "serve_http_parser_h11",
    "the server parses HTTP with h11 (Python) though httptools is installed",
    "t2t_jax/serve/app.py",
    '  return "httptools"\n',
    '  return "h11"\n',
    ("tests/test_serve_http.py",),
  ),
  M(
    "shapes_rows_to_powers_of_two",
    "a batch is padded to a power of two of rows, not to the ladder's count",
    BATCHING,
    "return next((r for r in self.rows if r >= n), n)",
    "return 1 << (n - 1).bit_length()",
    FIRST,
  ),
  M(
    "shapes_run_not_cut_at_a_rung",
    "a batch followed by more sentences keeps every sentence that fits, padding rows in it",
    BATCHING,
    "return max((r for r in self.rows if r <= n), default=n)",
    "return n",
    FIRST,
  ),
  M(
    "shapes_largest_rows_not_a_bound",
    "a batch takes more sentences than the ladder's largest row count",
    BATCHING,
    "bounds = [b for b in (max_rows, self.rows[-1] if self.rows else None) if b is not None]",
    "bounds = [b for b in (max_rows,) if b is not None]",
    FIRST,
  ),
  M(
    "shapes_warm_up_smallest_rows_only",
    "the warm-up's shapes list only the ladder's first row count",
    BATCHING,
    "out += [(r, bucket, max_decode_len) for r in ladder if r <= top]",
    "out += [(r, bucket, max_decode_len) for r in ladder[:1] if r <= top]",
    FIRST,
  ),
  M(
    "shapes_server_default_buckets",
    "the server pads sources to translate()'s 1.5x buckets: twice the shapes to compile",
    "t2t_jax/serve/worker.py",
    "buckets=tuple(batching.stream_buckets(max_len)),",
    "buckets=None,",
    FIRST,
  ),
  M(
    "shapes_compilations_counted_from_start",
    "/metrics counts every compilation since the start as one after /ready",
    "t2t_jax/serve/app.py",
    "    self.compiled_at_ready = self.compilations.count\n",
    "    self.compiled_at_ready = 0\n",
    ("tests/test_serve_http.py",),
  ),
  M(
    "shapes_first_stage_memory_unpadded",
    "the first stage keeps the batch's own memory: every later program compiled per bucket",
    "t2t_jax/decoding/programs.py",
    "  if memory_len is not None:  # decode_in_stages' full_memory",
    "  if False:  # decode_in_stages' full_memory",
    FIRST,
  ),
  M(
    "serve_one_batch_thread_on_a_cpu",
    "a served model decodes one batch at a time on a CPU, a core idle under load",
    "t2t_jax/serve/worker.py",
    "self.batch_threads = settings.batch_threads or default_batch_threads()",
    "self.batch_threads = settings.batch_threads or 1",
    FIRST,
  ),
  M(
    "batcher_workers_ignored",
    "the Batcher starts one thread whatever its workers",
    "t2t_jax/serve/batching.py",
    "for i in range(self.workers)",
    "for i in range(1)",
    ("tests/test_serve_api.py",),
  ),
  M(
    "batcher_call_beside_a_batch",
    "a _Call (the model's load, the page's attention) starts while a batch runs",
    "t2t_jax/serve/batching.py",
    "if self._call_running or (isinstance(head, _Call) and self._running):",
    "if self._call_running:",
    ("tests/test_serve_api.py",),
  ),
)
