"""Table 3 of the paper: variations on the base model, scored on newstest2013 (dev).

    t2t-train --experiment=table3:A2 --workdir=/tmp/table3_A2

The row is chosen after the colon (the argument of get_config): 'base' or one of
A1-A4, B1-B2, C1-C7, D1-D4, E (below). Every row trains 100k steps like base and, as in the
paper, is decoded with beam 4 and alpha 0.6 without checkpoint averaging, on newstest2013.
"""

from t2t_jax.experiments import base

# Row -> (model overrides, training overrides, paper's dev BLEU on newstest2013).
VARIANTS = {
  "base": ({}, {}, 25.8),
  # (A) number of heads, d_k = d_v = d_model / h, constant computation.
  "A1": (dict(num_heads=1), {}, 24.9),
  "A2": (dict(num_heads=4), {}, 25.5),
  "A3": (dict(num_heads=16), {}, 25.8),
  "A4": (dict(num_heads=32), {}, 25.4),
  # (B) smaller attention key size d_k (d_v stays 64).
  "B1": (dict(d_k=16, d_v=64), {}, 25.1),
  "B2": (dict(d_k=32, d_v=64), {}, 25.4),
  # (C) model size.
  "C1": (dict(num_layers=2), {}, 23.7),
  "C2": (dict(num_layers=4), {}, 25.3),
  "C3": (dict(num_layers=8), {}, 25.5),
  "C4": (dict(d_model=256), {}, 24.5),  # d_k = d_v = 32
  "C5": (dict(d_model=1024), {}, 26.0),  # d_k = d_v = 128
  "C6": (dict(d_ff=1024), {}, 25.4),
  "C7": (dict(d_ff=4096), {}, 26.2),
  # (D) dropout and label smoothing.
  "D1": (dict(dropout_rate=0.0), {}, 24.6),
  "D2": (dict(dropout_rate=0.2), {}, 25.5),
  "D3": ({}, dict(label_smoothing=0.0), 25.3),
  "D4": ({}, dict(label_smoothing=0.2), 25.7),
  # (E) learned positional embedding instead of sinusoids.
  "E": (dict(positional="learned"), {}, 25.7),
}


def get_config(variant: str = "base"):
  variant = variant or "base"
  if variant not in VARIANTS:
    raise ValueError(f"table3: unknown row {variant!r}; rows: {', '.join(VARIANTS)}")
  model, training, paper_bleu = VARIANTS[variant]
  config = base.get_config()
  config.model.update(model)
  config.update(training)
  config.variant = variant
  config.paper_dev_bleu = paper_bleu
  config.average_checkpoints = 1  # "no checkpoint averaging" for Table 3
  return config


def check_config(config):
  """The experiment's own rule: config.variant names a row of VARIANTS, the config holds that
  row's settings, and paper_dev_bleu is the paper's figure for it (a record, not a setting).
  Another row is another --experiment=table3:ROW, not an override of its fields."""
  variant = config.variant
  if variant not in VARIANTS:
    raise ValueError(
      f"config.variant={variant!r} is not a row of Table 3; rows: {', '.join(VARIANTS)}"
    )
  model, training, paper_bleu = VARIANTS[variant]
  for prefix, fields, part in (("model.", model, config.model), ("", training, config)):
    for name, value in fields.items():
      if part[name] != value:
        raise ValueError(
          f"config.variant={variant!r} is a row with {prefix}{name}={value!r}, but "
          f"config.{prefix}{name}={part[name]!r}: the run would not be the row it is named "
          "after (another row: --experiment=table3:ROW)"
        )
  if config.paper_dev_bleu != paper_bleu:
    raise ValueError(
      f"config.paper_dev_bleu={config.paper_dev_bleu!r} is not the paper's dev BLEU of row "
      f"{variant} ({paper_bleu}): it records the paper and sets nothing"
    )
