"""Times `Translator.translate` of one file in another source tree of t2t_jax (a git
worktree of an older commit, say) or this one, and writes the outputs, so that two versions
can be compared on real text: speed, compilations and identical lines.

    python tools/translate_ab.py TREE WORKDIR INPUT OUTPUT [BEAM [DTYPE]]
    cmp OLD_OUTPUT NEW_OUTPUT

Run it for each tree in turn, alternating, on an idle machine. It prints one JSON line: the
first (compiling) pass, two timed passes, sentences/s of the faster, the programs the first
pass compiled and their seconds, and the search statistics where the tree has them. JAX's
persistent compilation cache is off, so each run compiles what it needs. DTYPE (float32,
bfloat16 or auto) is what `Translator.from_workdir` decodes in; without it, the model's
configured dtype.
"""

import json
import os
import sys
import threading
import time


def main(
  tree: str, workdir: str, input_path: str, output: str, beam: int = 4, dtype: str | None = None
) -> None:
  sys.path.insert(0, os.path.abspath(tree))
  os.environ["T2T_COMPILATION_CACHE"] = "off"
  import jax

  jax.config.update("jax_compilation_cache_dir", "")
  import t2t_jax

  if not t2t_jax.__file__.startswith(os.path.abspath(tree)):
    raise SystemExit(f"t2t_jax imported from {t2t_jax.__file__}, not from {tree}")
  from t2t_jax.decoding import translator as translate

  compiles = [0, 0.0, float("-inf")]  # count, wall-clock seconds, covered until
  lock = threading.Lock()

  def listen(event: str, duration: float, **kwargs: object) -> None:
    """Compilations that overlap (a tree that decodes two batches at once) count once."""
    if event == "/jax/core/compile/backend_compile_duration":
      end = time.perf_counter()
      with lock:
        compiles[0] += 1
        compiles[1] += max(0.0, end - max(end - duration, compiles[2]))
        compiles[2] = max(compiles[2], end)

  jax.monitoring.register_event_duration_secs_listener(listen)
  with open(input_path, encoding="utf-8") as f:
    lines = [line.rstrip("\n") for line in f]
  tr = translate.Translator.from_workdir(workdir, "latest", dtype)
  start = time.perf_counter()
  hyps = tr.translate(lines, search=tr.search.override(beam_size=beam))
  first, first_compiles = time.perf_counter() - start, list(compiles)
  if hasattr(translate, "DecodeStats"):
    tr.stats = translate.DecodeStats()
  times = []
  for _ in range(2):
    start = time.perf_counter()
    again = tr.translate(lines, search=tr.search.override(beam_size=beam))
    times.append(time.perf_counter() - start)
    assert again == hyps, "a second pass gave other outputs"
  with open(output, "w", encoding="utf-8") as f:
    f.write("\n".join(hyps) + "\n")
  stats = getattr(tr, "stats", None)
  print(
    json.dumps(
      dict(
        tree=tree,
        beam=beam,
        dtype=dtype,
        first_s=round(first, 2),
        steady_s=[round(t, 2) for t in times],
        sentences_per_s=round(len(lines) / min(times), 1),
        compiled=first_compiles[0],
        compile_s=round(first_compiles[1], 1),
        stats=None if stats is None else vars(stats),
      )
    )
  )


if __name__ == "__main__":
  if len(sys.argv) not in (5, 6, 7):
    raise SystemExit(__doc__)
  main(*sys.argv[1:5], *(int(b) for b in sys.argv[5:6]), *sys.argv[6:])
