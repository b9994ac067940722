"""Pictures of a Transformer and its training (the `viz` extra): see `pictures` for the
attention maps, positional table, schedule and curves, and `diagram` for Figure 1 and Table 2."""

from t2t_jax.viz import diagram
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

__all__ = [
  "KINDS",
  "architecture_diagram",
  "attention_heads",
  "attention_lines",
  "attention_map",
  "bleu_chart",
  "diagram",
  "learning_curve",
  "learning_rate_schedule",
  "positional_encoding",
  "tokens",
  "training_curves",
]
