"""The gold-vs-predicted tree picture (t2t_jax.viz.tree_pair)."""

import pytest

pytest.importorskip("matplotlib")

from t2t_jax import viz
from t2t_jax.data import trees

GOLD = "(S (NP (NNP John)) (VP (VBZ has) (NP (DT a) (NN dog)) (PP (IN in) (NP (NN town)))) (. .))"


def test_tree_pair_marks_the_brackets_the_other_tree_lacks(tmp_path):
  gold = next(trees.parse_brackets(GOLD))[0]
  parsed, _ = trees.rebuild(
    "(S (NP XX )NP (VP XX (NP (NP XX XX )NP (PP XX (NP XX )NP )PP )NP )VP XX )S", gold.leaves()
  )
  path = tmp_path / "pair.png"
  fig = viz.tree_pair(gold, parsed, path=str(path))
  assert path.stat().st_size > 0
  left, right = fig.axes
  red = lambda ax: sorted(t.get_text() for t in ax.texts if t.get_color() == viz.trees.MISS)
  assert red(left) == [] and red(right) == ["NP"]  # the predicted NP over "a dog in town"
  words = [t.get_text() for t in right.texts if t.get_rotation() == 40]
  assert words == gold.leaves()
  with pytest.raises(ValueError, match="same words"):
    viz.tree_pair(gold, trees.rebuild("(S XX )S", ["x"])[0])
