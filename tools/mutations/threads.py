"""Shared state touched from several threads: one-token changes the quick loop must catch."""

from tools.mutations import Mutation

M = Mutation
FIRST = ("tests/test_threads.py",)
MUTATIONS = (
  M(
    "store_programs_unlocked",
    "the compiled-program store's dicts are read and changed by the batch threads unlocked",
    "t2t_jax/compilation.py",
    "    self._lock = threading.Lock()  # guards both dicts",
    "    self._lock = contextlib.nullcontext()  # guards both dicts",
    FIRST,
  ),
  M(
    "store_builds_per_caller",
    "threads asking for one program at once each trace and compile it",
    "t2t_jax/compilation.py",
    "      pending = self._building.get(key)\n",
    "      pending = None\n",
    FIRST,
  ),
  M(
    "serve_stats_unlocked",
    "the server's batch counts are added to by two threads and read by /metrics unlocked",
    "t2t_jax/serve/batching.py",
    "default_factory=threading.Lock, init=False",
    "default_factory=lambda: threading.Semaphore(1 << 30), init=False",
    FIRST,
  ),
)
