"""Pictures of a Transformer and its training (the `viz` extra): see `pictures` for the
attention maps, positional table, schedule and curves, `diagram` for Figure 1 and Table 2, and
`trees` for a gold and a predicted parse side by side."""

from t2t_jax.viz import diagram, trees
from t2t_jax.viz.pictures import (
  KINDS,
  architecture_diagram,
  attention_heads,
  attention_lines,
  attention_map,
  bleu_chart,
  learning_curve,
  learning_rate_schedule,
  positional_encoding,
  tokens,
  training_curves,
)
from t2t_jax.viz.trees import tree_pair

__all__ = [
  "KINDS",
  "architecture_diagram",
  "attention_heads",
  "attention_lines",
  "attention_map",
  "bleu_chart",
  "diagram",
  "trees",
  "learning_curve",
  "learning_rate_schedule",
  "positional_encoding",
  "tokens",
  "training_curves",
  "tree_pair",
]
