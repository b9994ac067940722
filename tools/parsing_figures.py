"""The figures of docs/parsing.md from a trained parsing workdir.

    python -m tools.parsing_figures --workdir=workdirs/parsing --picture=docs/parsing_tree.png

Reads the test.gold and test.trees files t2t-train wrote at the end of training, prints the
model's EVALB F1 beside the right-branching baseline's (labelled and unlabelled), and draws
one test sentence's gold and predicted trees side by side: the sentence of 10-20 words whose
parse is closest to, but not exactly, the gold tree (the first such if none is perfect).
"""

import os

from absl import app, flags

from t2t_jax import viz
from t2t_jax.data import trees
from t2t_jax.evaluation import parseval

flags.DEFINE_string("workdir", None, "a t2t-train parsing workdir with test.gold/test.trees")
flags.DEFINE_string("picture", "", "where the gold/predicted picture goes ('' = none)")
FLAGS = flags.FLAGS


def _read(path: str) -> list[trees.Tree]:
  with open(path, encoding="utf-8") as f:
    return [tree for tree, _ in trees.parse_brackets(f.read())]


def pick_example(parsed: list[trees.Tree], golds: list[trees.Tree]) -> int:
  """Index of the 10-20 word sentence with the highest F1 below 100 (else the first)."""
  best, best_f1 = 0, -1.0
  for i, (p, g) in enumerate(zip(parsed, golds)):
    if not 10 <= len(g.leaves()) <= 20:
      continue
    f1 = parseval.corpus_score([p], [g]).f1
    if best_f1 < f1 < 100.0:
      best, best_f1 = i, f1
  return best


def main(argv):
  del argv
  golds = _read(os.path.join(FLAGS.workdir, "test.gold"))
  parsed = _read(os.path.join(FLAGS.workdir, "test.trees"))
  baseline = [parseval.right_branching(g.leaves()) for g in golds]
  for name, tests in (("model", parsed), ("right-branching", baseline)):
    for labelled in (True, False):
      score = parseval.corpus_score(tests, golds, labelled)
      kind = "labelled" if labelled else "unlabelled"
      print(f"{name:16s} {kind:10s} {score.summary()}")
  if FLAGS.picture:
    i = pick_example(parsed, golds)
    f1 = parseval.corpus_score([parsed[i]], [golds[i]]).f1
    viz.tree_pair(
      golds[i],
      parsed[i],
      (f"gold (test sentence {i + 1})", f"predicted (bracket F1 {f1:.1f})"),
      path=FLAGS.picture,
    )
    print(f"picture of test sentence {i + 1}: {' '.join(golds[i].leaves())}")


if __name__ == "__main__":
  flags.mark_flag_as_required("workdir")
  app.run(main)
