"""Times `Translator.sample` of one file in another source tree of t2t_jax (a git worktree
of an older commit, say) or this one, as tools/translate_ab.py does for beam search, and
writes the samples, so that two versions can be compared on speed and outputs.

    python tools/sample_ab.py TREE WORKDIR INPUT OUTPUT
    cmp OLD_OUTPUT NEW_OUTPUT

One sample per line (seed 1, the workdir's temperature and cuts), two passes; prints one
JSON line with both passes' seconds and sentences/s of the second. Run it from outside the
checkout (`cd /tmp`) so that TREE's t2t_jax is the one imported. JAX's persistent
compilation cache is off.
"""

import json
import os
import sys
import time


def main(tree: str, workdir: str, input_path: str, output: str) -> None:
  sys.path.insert(0, os.path.abspath(tree))
  os.environ["T2T_COMPILATION_CACHE"] = "off"
  import jax

  jax.config.update("jax_compilation_cache_dir", "")
  import t2t_jax

  if not t2t_jax.__file__.startswith(os.path.abspath(tree)):
    raise SystemExit(f"t2t_jax imported from {t2t_jax.__file__}, not from {tree}")
  from t2t_jax.decoding import translator as translate

  with open(input_path, encoding="utf-8") as f:
    lines = f.read().splitlines()
  t = translate.Translator.from_workdir(workdir, "latest", None)
  times = []
  for _ in range(2):
    start = time.perf_counter()
    settings = t.search.override(sampling=True, beam_size=1, num_samples=1, sampling_seed=1)
    outputs = t.translate(lines, search=settings)
    times.append(time.perf_counter() - start)
  with open(output, "w", encoding="utf-8") as f:
    f.writelines(o + "\n" for o in outputs)
  print(
    json.dumps(
      dict(
        tree=tree,
        first_s=round(times[0], 1),
        second_s=round(times[1], 1),
        sentences_per_s=round(len(lines) / times[1], 1),
      )
    )
  )


if __name__ == "__main__":
  main(*sys.argv[1:5])
