"""The figures of docs/parsing.md from a trained parsing workdir.

    python -m tools.parsing_figures --workdir=workdirs/parsing --picture=docs/parsing_tree.png \
        --curve=docs/parsing_dev_f1.png --runs=words=workdirs/parsing,xx=workdirs/parsing_xx

Reads the test.gold and test.trees files t2t-train wrote at the end of training, prints the
model's EVALB F1 beside the right-branching baseline's (labelled and unlabelled), and draws
one test sentence's gold and predicted trees side by side: the median sentence of 10-20
words by its own bracket F1, a typical parse rather than the best. --curve
draws dev F1 against wall-clock minutes for the workdir, or for each of --runs (label=workdir).
"""

import os

from absl import app, flags

from t2t_jax import viz
from t2t_jax.data import trees
from t2t_jax.evaluation import parseval

FLAGS = flags.FLAGS


def _define_flags() -> None:
  """The command's flags, defined when it runs (not on import: tests import pick_example
  beside other commands' flags)."""
  flags.DEFINE_string("workdir", None, "a t2t-train parsing workdir with test.gold/test.trees")
  flags.DEFINE_string("picture", "", "where the gold/predicted picture goes ('' = none)")
  flags.DEFINE_string("curve", "", "where the dev F1 curve goes ('' = none)")
  flags.DEFINE_list("runs", [], "label=workdir pairs drawn on --curve (default: --workdir alone)")


def _read(path: str) -> list[trees.Tree]:
  with open(path, encoding="utf-8") as f:
    return [tree for tree, _ in trees.parse_brackets(f.read())]


def pick_example(parsed: list[trees.Tree], golds: list[trees.Tree]) -> int:
  """Index of the median 10-20 word sentence by its bracket F1 (ties: the earlier one), a
  typical parse; every sentence when none has 10-20 words."""
  chosen = [i for i, g in enumerate(golds) if 10 <= len(g.leaves()) <= 20] or range(len(golds))
  f1s = {i: parseval.corpus_score([parsed[i]], [golds[i]]).f1 for i in chosen}
  ranked = sorted(chosen, key=lambda i: (f1s[i], i))
  return ranked[(len(ranked) - 1) // 2]


def _runs() -> dict[str, str]:
  if not FLAGS.runs:
    return {os.path.basename(os.path.normpath(FLAGS.workdir)): FLAGS.workdir}
  out = {}
  for pair in FLAGS.runs:
    label, sep, workdir = pair.partition("=")
    if not sep or not label or not workdir:
      raise app.UsageError(f"--runs: {pair!r} is not label=workdir")
    out[label] = workdir
  return out


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
  if FLAGS.curve:
    viz.learning_curve(
      _runs(), title="dev F1 (greedy) during training", path=FLAGS.curve, metric="dev_f1"
    )
    print(f"dev F1 curve: {FLAGS.curve}")


if __name__ == "__main__":
  _define_flags()
  flags.mark_flag_as_required("workdir")
  app.run(main)
