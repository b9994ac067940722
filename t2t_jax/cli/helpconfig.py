"""`t2t-train --experiment=NAME --helpconfig`: the experiment's config fields, each with its
value, the default where the experiment changes it, and a one-line description.

The descriptions are not written here: they are read from the comments beside each default
in the typed configs (TrainConfig, TransformerConfig, data.config.default_config) and from
SearchConfig's Attributes docstring, so a default and its words live in one place.
"""

import inspect
import re
from collections.abc import Iterator
from typing import Any

import ml_collections

# `name: type = value  # doc` (a dataclass field) or `c.name = value  # doc` (data config).
_FIELD = re.compile(r"^\s*(?:c\.)?(?P<name>\w+)\s*(?::[^=#]*)?=[^#]*(?:#\s?(?P<doc>.*))?$")
_COMMENT = re.compile(r"^\s*#(?P<text>.*)$")


def comment_docs(source: str) -> dict[str, str]:
  """{field: its comments as one line} of the fields assigned in `source`.

  A field's words are the comment lines just above it and the comment after its value, with
  the comment lines below that are indented past the '#' (a continued trailing comment);
  '# --- section ---' lines belong to no field.
  """
  docs: dict[str, str] = {}
  above: list[str] = []
  last = None
  for line in source.splitlines():
    comment = _COMMENT.match(line)
    if comment:
      text = comment["text"]
      if last is not None and text.startswith("  ") and not above:
        docs[last] = f"{docs[last]} {text.strip()}".strip()
      elif not text.strip().startswith("---"):
        above.append(text.strip())
      continue
    field = _FIELD.match(line)
    if field and not line.lstrip().startswith(("def ", "return", "class ")):
      last = field["name"]
      docs[last] = " ".join([*above, (field["doc"] or "").strip()]).strip()
    else:
      last = None
    above = []
  return docs


def attribute_docs(docstring: str) -> dict[str, str]:
  """{name: text} of a Google-style 'Attributes:' section, each entry joined into one line."""
  docs: dict[str, str] = {}
  name = None
  for line in docstring.split("Attributes:", 1)[-1].splitlines():
    entry = re.match(r"^\s{4}(\w+): (.*)$", line)
    if entry:
      name = entry[1]
      docs[name] = entry[2].strip()
    elif name and line.startswith(" " * 6):
      docs[name] += " " + line.strip()
    else:
      name = None
  return docs


def field_docs() -> dict[str, str]:
  """{'num_train_steps': ..., 'model.d_model': ..., 'data.max_len': ...}: every typed field's
  description, from the comments and docstrings beside the defaults."""
  from t2t_jax.data import config as data_config
  from t2t_jax.decoding.config import SearchConfig
  from t2t_jax.model.config import TransformerConfig
  from t2t_jax.training.config import TrainConfig

  docs = dict(comment_docs(inspect.getsource(TrainConfig)))
  docs.update(attribute_docs(SearchConfig.__doc__ or ""))
  docs.update(
    {f"model.{k}": v for k, v in comment_docs(inspect.getsource(TransformerConfig)).items()}
  )
  data = comment_docs(inspect.getsource(data_config.default_config))
  docs.update({f"data.{k}": v for k, v in data.items()})
  return docs


def defaults() -> dict[str, Any]:
  """{field path: default} of every typed field (TrainConfig, SearchConfig, TransformerConfig,
  the data config)."""
  from t2t_jax.data import config as data_config
  from t2t_jax.decoding.config import SearchConfig
  from t2t_jax.model.config import TransformerConfig
  from t2t_jax.training.config import TrainConfig

  out = {**TrainConfig.defaults(), **SearchConfig().config_fields()}
  out.update({f"model.{k}": v for k, v in TransformerConfig.defaults().items()})
  out.update({f"data.{k}": v for k, v in data_config.default_config().items()})
  return out


def _leaves(config: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
  for key in sorted(config.keys()) if not prefix else config.keys():
    value = config[key]
    if isinstance(value, ml_collections.ConfigDict):
      yield from _leaves(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


def describe(config: ml_collections.ConfigDict, experiment: str) -> str:
  """The --helpconfig text: one line per field of `config`, top-level fields first."""
  docs, default = field_docs(), defaults()
  lines = [f"config fields of --experiment={experiment} (override any with --config.FIELD=VALUE):"]
  leaves = sorted(_leaves(config), key=lambda kv: (kv[0].count("."), kv[0]))
  for path, value in leaves:
    changed = f" (default {default[path]!r})" if path in default and default[path] != value else ""
    doc = docs.get(path) or ("this experiment's own field" if path not in default else "")
    lines.append(f"  {path} = {value!r}{changed}" + (f"  # {doc}" if doc else ""))
  return "\n".join(lines)
