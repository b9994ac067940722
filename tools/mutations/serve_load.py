"""t2t-bench --parts=serve under load: the tail latency, the pairs the requests go to, the
16-against-1 ratio, the request count the memory figure is read after."""

from tools.mutations import Mutation

M = Mutation
BENCH = "t2t_jax/bench/serve.py"
FIRST = ("tests/test_serve_http.py",)
MUTATIONS = (
  M(
    "serve_load_p99_as_p95",
    "the p99 latency is the p95 again: a slow tail goes unseen",
    BENCH,
    "p99_ms=1000 * nearest_rank(latencies, 0.99)",
    "p99_ms=1000 * nearest_rank(latencies, 0.95)",
    FIRST,
  ),
  M(
    "serve_load_one_pair",
    "every request goes to the first pair: the second model and its thread sit idle",
    BENCH,
    "source, target = pairs[i % len(pairs)]",
    "source, target = pairs[0]",
    FIRST,
  ),
  M(
    "serve_load_ratio_inverted",
    "the load ratio is 1 client over 16: a gain reads as a loss",
    BENCH,
    "return rate[many] / rate[one] if many in rate",
    "return rate[one] / rate[many] if many in rate",
    FIRST,
  ),
  M(
    "serve_load_memory_count_on_top",
    "--serve_memory_requests are sent on top of those already served, not up to the count",
    BENCH,
    "rest = memory_requests - served()",
    "rest = memory_requests",
    FIRST,
  ),
)
