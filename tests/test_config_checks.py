"""A configuration that is wrong as a whole is refused before anything is written.

Every leaf field of every experiment's config (with an ARG variant of each experiment that
takes one) is set to values of a wrong type and to values of its type that it cannot hold,
and pairs of fields are set to values that contradict each other. Each must be refused by
`training.checks.check` in one line that names the field (both fields for a pair), and by
t2t-train, t2t-prepare and t2t-bench with exit status 2, at most 3 lines on stderr, no
traceback, the workdir absent afterwards, and an existing workdir's files unchanged (bytes
and mtimes). The commands run as forked children of one interpreter
(tests.support.forked_commands); a child that is not refused starts real work, which its
time limit ends, and fails the case.
"""

import json
import math
import os

import ml_collections
import pytest

from t2t_jax import data
from t2t_jax.cli import common
from t2t_jax.training import checks
from tests import support

EXPERIMENTS = [
  "base",
  "base_enfr",
  "big",
  "big_enfr",
  "multi30k",
  "multi30k:de-en",
  "parsing",
  "parsing:big",
  "table3",
  "table3:B1",
  "tiny",
]

# Values of a wrong type for a field whose value (in the experiment) has this type.
WRONG_TYPE = {
  bool: ["yes", 1, None],
  int: ["7x", 1.5, True, None],
  float: ["x", math.nan, math.inf, -math.inf, True, None],
  str: [3, None],
  tuple: [3, "x"],
}
NONE_ALLOWED = {"model.num_encoder_layers", "model.num_decoder_layers"}  # None: num_layers

# Values of the field's own type that it cannot hold, in every experiment. A bool field's
# rule is its type (both values are settings), except where another field forbids one.
INVALID = {
  "seed": [-1, 2**31],
  "num_train_steps": [0, -1],
  "warmup_steps": [0, -5],
  "learning_rate_factor": [0.0, -1.0],
  "label_smoothing": [-0.1, 1.0],
  "grad_accum_steps": [0],
  "log_every_steps": [0, -1],
  "eval_every_steps": [0],
  "checkpoint_every_steps": [0],
  "keep_checkpoints": [0],
  "average_checkpoints": [0, 999],  # 999: more than are kept
  "prefetch_batches": [-1],
  "bleu_every_steps": [-1],
  "bleu_num_sentences": [0],
  "bleu_beam_size": [-1],
  "test_at_end": [],
  "select_checkpoints": ["lastest", "average:0", "best:0", "selected", "latest,,best", "ema"],
  "select_num_sentences": [-1],
  "train_time_limit_minutes": [-1.0],
  "init_keep_optimizer": [True],  # every experiment has init_from=''
  "best_metric": ["loss", ""],
  "keep_best_checkpoints": [-1],
  "patience": [-1],
  "min_delta": [-0.5],
  "ema_decay": [1.0, -0.1],
  "profile_steps": ["3", "a,b", "0,2", "5,2"],
  "beam_size": [0, -1],
  "alpha": [-0.1],
  "max_output_extra": [-1],
  "beam_stop": ["never", ""],
  "sampling": [True],  # every experiment searches with a beam > 1
  "sampling_temperature": [0.0, -1.0],
  "sampling_topk": [-1],
  "sampling_topp": [0.0, 1.5],
  "num_samples": [0],
  "sampling_seed": [-1, 2**31],
  "constrained": [],
  "no_repeat_ngram": [-1],
  "min_length_ratio": [-0.5],
  "diverse_groups": [0, 5],  # 5 divides no experiment's beam
  "diversity_strength": [-0.5],
  "model.d_model": [0, -64, 63],
  "model.d_ff": [0],
  "model.num_heads": [0, -1],
  "model.d_k": [-1],
  "model.d_v": [-1],
  "model.num_layers": [0],
  "model.num_encoder_layers": [-1],
  "model.num_decoder_layers": [-1],
  "model.dropout_rate": [1.0, -0.1],
  "model.attention_dropout_rate": [1.0],
  "model.norm": ["mid"],
  "model.positional": ["rotary"],
  "model.share_embeddings": [],
  "model.dtype": ["int32", "float33", ""],
  "model.max_len": [0, 8],  # 8: shorter than every experiment's data.max_len
  "model.attention_impl": ["flash"],
  "model.loss_chunk_tokens": [-1],
  "data.source": ["nosuch", ""],
  "data.task": ["rot13"],
  "data.synthetic_num_symbols": [0],
  "data.synthetic_min_len": [0, 99],  # 99: above synthetic_max_len
  "data.synthetic_max_len": [0],
  "data.synthetic_train_size": [0],
  "data.synthetic_eval_size": [0],
  "data.synthetic_seed": [-1],
  "data.pair": ["deen", "de-", ""],
  "data.source_lang": ["e n", "-"],
  "data.target_lang": ["d e"],
  # Training corpora beside train_source, or for a source that reads its own.
  "data.train_corpora": [({"source": "a", "target": "b"},)],
  "data.treebank_train": ["1-x", "9-1"],
  "data.treebank_dev": ["1-x", "9-1"],
  "data.treebank_test": ["1-x"],
  "data.tree_leaves": ["leaves"],
  "data.tree_max_depth": [-1],
  "data.tree_max_opens": [-1],
  "data.tfds_download": [],
  "data.prepared_store": [],
  "data.vocab_size": [0, 4],
  "data.vocab_type": ["wordpiece"],
  "data.vocab_max_sentences": [0],
  "data.vocab_character_coverage": [0.0, 1.5],
  "data.vocab_byte_fallback": [],
  "data.vocab_seed": [-1],
  "data.vocab_min_count": [0],
  "data.train_max_pairs": [-1],
  "data.max_len": [1, 999],  # 999: longer than every model.max_len
  "data.max_length_ratio": [0.5, -1.0],
  "data.batching": ["foo"],
  "data.tokens_per_batch": [0, 8],  # 8: less than one row of max_len
  "data.bucket_boundaries": [(0, 8), (16, 8), (8, "a")],
  "data.source_bucket_boundaries": [(3,), ("a",)],
  "data.bucket_min": [0],
  "data.bucket_scale": [0.5],
  "data.bucket_multiple": [0],
  "data.pack_len": [1, 0],
  "data.pack_bins": [-1],
  "data.shuffle_seed": [-1],
  "data.tokenize_threads": [-1],
  "data.prefetch_batches": [-1],
  "data.wait_for_process0_s": [-1.0],
  "data.download_probe_s": [-1.0],
  # The experiments' own fields (their check_config).
  "corpus_dir": [""],
  "variant": ["Z9", "A2"],
  "paper_dev_bleu": [0.0],
}

# Fields whose every value of their type is a setting: only a wrong type is refused.
FREE = {
  "init_from": "a workdir, WORKDIR[:SPEC]: read (and its SPEC checked) when the run starts",
  "data.tfds_data_dir": "a directory TFDS makes or reads",
  "data.tfds_manual_dir": "a directory of downloaded archives, read when preparing",
  "data.data_dir": "a directory the store is made in",
  "data.vocab_path": "a file the vocabulary is read from or written to",
  "data.treebank_dir": "a directory, read when the data is prepared (exit 1 when missing)",
  **{
    f"data.{split}_{side}": "a file, read when the data is prepared (exit 1 when missing)"
    for split in ("train", "dev", "test")
    for side in ("source", "target")
  },
}

# Pairs (or more) of fields set to values that contradict each other: name -> (experiment,
# overrides, the fields the message must name).
PAIRS = {
  "heads-d_model": ("tiny", {"model.num_heads": 7}, ["model.d_model", "model.num_heads"]),
  "d_k-alone": (
    "base",
    {"model.d_model": 100, "model.d_k": 16, "model.d_v": 0},
    ["model.d_model", "model.num_heads"],
  ),
  "budget-max_len": (
    "tiny",
    {"data.tokens_per_batch": 12},
    ["data.tokens_per_batch", "data.max_len"],
  ),
  "budget-pack_len": (
    "tiny",
    {"data.batching": "pack", "data.pack_len": 32, "data.tokens_per_batch": 20},
    ["data.tokens_per_batch", "data.pack_len"],
  ),
  "pack_len-max_len": (
    "tiny",
    {"data.batching": "pack", "data.pack_len": 8},
    ["data.pack_len", "max_len"],
  ),
  "data-model-max_len": ("tiny", {"data.max_len": 128}, ["data.max_len", "model.max_len"]),
  "pack_len-model-max_len": (
    "tiny",
    {"data.batching": "pack", "data.pack_len": 128},
    ["data.pack_len", "model.max_len"],
  ),
  "beam-diverse_groups": ("tiny", {"diverse_groups": 3}, ["diverse_groups", "beam_size"]),
  "dev-beam-diverse_groups": (
    "tiny",
    {"diverse_groups": 2, "bleu_beam_size": 1},
    ["bleu_beam_size", "diverse_groups"],
  ),
  "sampling-beam": ("tiny", {"sampling": True}, ["sampling", "beam_size"]),
  "sampling-dev-beam": (
    "tiny",
    {"sampling": True, "beam_size": 1, "bleu_beam_size": 4},
    ["bleu_beam_size", "sampling"],
  ),
  "average-keep": (
    "tiny",
    {"average_checkpoints": 6, "keep_checkpoints": 5},
    ["average_checkpoints", "keep_checkpoints"],
  ),
  "select-ema": ("tiny", {"select_checkpoints": "latest,ema"}, ["select_checkpoints", "ema_decay"]),
  "select-best-kept": (
    "tiny",
    {"select_checkpoints": "best:3", "keep_best_checkpoints": 2},
    ["select_checkpoints", "keep_best_checkpoints"],
  ),
  "keep-optimizer-init_from": ("tiny", {"init_keep_optimizer": True}, ["init_keep_optimizer"]),
  "best_metric-bleu_every": (
    "tiny",
    {"best_metric": "dev_bleu"},
    ["best_metric", "bleu_every_steps"],
  ),
  "synthetic-lengths": (
    "tiny",
    {"data.synthetic_min_len": 10, "data.synthetic_max_len": 5},
    ["data.synthetic_min_len", "synthetic_max_len"],
  ),
  "synthetic-min_len-max_len": (
    "tiny",
    {"data.synthetic_min_len": 16, "data.synthetic_max_len": 20},
    ["data.synthetic_min_len", "max_len"],
  ),
  "source-buckets": (
    "tiny",
    {"data.source_bucket_boundaries": (8,)},
    ["data.source_bucket_boundaries"],
  ),
  "dev-files": ("multi30k", {"data.dev_target": ""}, ["data.dev_source", "dev_target"]),
  "wmt-languages-pair": (
    "base",
    {"data.source_lang": "fr"},
    ["data.source_lang", "target_lang", "data.pair"],
  ),
  "table3-row": ("table3:B1", {"model.d_k": 32}, ["model.d_k"]),
}

# Weighted training corpora (textfiles): weights that cannot be upsampling factors.
BAD_WEIGHTS = [-1.0, 0.0, math.nan, math.inf, "2"]


def _experiment(name: str) -> tuple[ml_collections.ConfigDict, object]:
  path = common.experiment_path(name)
  return common.load_experiment(path), common.experiment_check(path)


def _leaves(config: ml_collections.ConfigDict, prefix: str = "") -> dict[str, object]:
  out = {}
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      out.update(_leaves(value, f"{prefix}{key}."))
    else:
      out[prefix + key] = value
  return out


def _loose(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy whose fields take values of any type (as code, or a config.json, could give)."""
  return ml_collections.ConfigDict(config.to_dict(), type_safe=False)


def _set(config: ml_collections.ConfigDict, path: str, value: object) -> None:
  *parents, leaf = path.split(".")
  node = config
  for part in parents:
    node = node[part]
  node[leaf] = None  # from None, a field takes the value as it is (no int -> float, bool)
  node[leaf] = value


def _refusal(config, experiment_check) -> str | None:
  """The one-line message of the check's refusal, or None when the config passes."""
  try:
    checks.check(config, experiment_check)
  except (checks.ConfigError, data.DataError) as e:
    return str(e)
  return None


def _invalid_values(path: str, value: object) -> list[object]:
  kind = tuple if isinstance(value, tuple | list) else type(value)
  wrong = [v for v in WRONG_TYPE[kind] if not (v is None and path in NONE_ALLOWED)]
  return wrong + ([] if path in FREE else INVALID[path])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
  """A directory with two aligned files a.txt and b.txt."""
  root = tmp_path_factory.mktemp("corpus")
  for name in ("a.txt", "b.txt"):
    (root / name).write_text("1 2\n3 4\n")
  return str(root)


def test_every_experiment_and_every_field_is_covered():
  assert {name.partition(":")[0] for name in EXPERIMENTS} == set(common.available_experiments())
  missing, fields = set(), {}
  for name in EXPERIMENTS:
    config, _ = _experiment(name)
    fields.update(_leaves(config))
    missing |= set(_leaves(config)) - set(INVALID) - set(FREE)
  assert not missing, f"give these fields invalid values (INVALID) or a reason (FREE): {missing}"
  for path, values in INVALID.items():  # only a bool's type can be its whole rule
    assert values or isinstance(fields[path], bool), path


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_config_passes_and_gives_its_typed_parts(name):
  config, experiment_check = _experiment(name)
  checked = checks.check(config, experiment_check)
  assert checked.model.d_model == config.model.d_model
  assert checked.model.vocab_size == checks.PLACEHOLDER_VOCAB_SIZE
  assert checked.search.beam_size == config.beam_size
  assert checked.train.num_train_steps == config.num_train_steps
  assert checked.source.name == config.data.source


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_a_field_set_to_a_value_it_cannot_hold_is_refused_naming_it(name):
  config, experiment_check = _experiment(name)
  loose = _loose(config)
  assert _refusal(loose, experiment_check) is None
  failures = []
  for path, value in _leaves(config).items():
    for bad in _invalid_values(path, value):
      _set(loose, path, bad)
      message = _refusal(loose, experiment_check)
      _set(loose, path, value)
      if message is None or f"config.{path}=" not in message or "\n" in message:
        failures.append(f"{path}={bad!r}: {message}")
  assert not failures, "\n".join(failures)


@pytest.mark.parametrize("case", sorted(PAIRS))
def test_fields_that_contradict_each_other_are_refused_naming_them(case):
  name, overrides, named = PAIRS[case]
  config, experiment_check = _experiment(name)
  loose = _loose(config)
  for path, value in overrides.items():
    _set(loose, path, value)
  message = _refusal(loose, experiment_check)
  assert message is not None and "\n" not in message, message
  assert f"config.{named[0]}=" in message, message
  assert all(field.rsplit(".", 1)[-1] in message for field in named), message


@pytest.mark.parametrize("weight", BAD_WEIGHTS, ids=repr)
@pytest.mark.parametrize("index", [0, 1])
def test_a_weight_of_a_training_corpus_that_is_no_upsampling_factor_is_refused(
  corpus, index, weight
):
  config, experiment_check = _experiment("multi30k")
  loose = _loose(config)
  _set(loose, "data.train_source", "")
  _set(loose, "data.train_target", "")
  files = {"source": f"{corpus}/a.txt", "target": f"{corpus}/b.txt"}
  corpora = [dict(files, weight=1.0), dict(files, weight=2.0)]
  _set(loose, "data.train_corpora", tuple(corpora))
  assert _refusal(loose, experiment_check) is None
  corpora[index]["weight"] = weight
  _set(loose, "data.train_corpora", tuple(corpora))
  message = _refusal(loose, experiment_check)
  assert message is not None and f"config.data.train_corpora[{index}].weight=" in message


def test_a_warmup_longer_than_the_run_is_allowed():
  """No rule ties warmup_steps to num_train_steps (training.checks): a short trial run or a
  fine-tuning run cut by its time limit may end with the rate still rising."""
  config, experiment_check = _experiment("tiny")
  config.update(num_train_steps=6, warmup_steps=10)
  checks.check(config, experiment_check)


# --- the commands -------------------------------------------------------------------------


def _flag(path: str, value: object) -> str:
  """--config.PATH=VALUE as a user writes it (tuples and dicts as Python literals)."""
  text = value if isinstance(value, str) else repr(value)
  return f"--config.{path}={text}"


def _bool_flag(path: str) -> str:
  return f"--config.{path}=maybe"  # not a boolean: absl's parser refuses it


# The fields of tiny that t2t-prepare is also given (every one is given to t2t-train).
PREPARE_FIELDS = (
  "seed",
  "model.dtype",
  "data.batching",
  "data.task",
  "data.treebank_train",
  "data.tree_leaves",
  "data.vocab_size",
  "data.bucket_multiple",
  "data.tokens_per_batch",
  "data.pair",
  "data.source_lang",
  "data.max_length_ratio",
  "data.train_corpora",
  "data.prepared_store",
)


def _command_cases(root: str) -> dict[str, tuple[str, list[str], str]]:
  """name -> (command, arguments, the field its line must name): every field of tiny (one
  value it cannot hold, or a non-boolean for a bool), every pair, a field of each
  experiment, the experiments' own fields and a corpus weight, for t2t-train; all but most
  of tiny's fields (the same check, run by the same call) for t2t-prepare; some for
  t2t-bench; a few against an existing workdir."""
  new, existing = f"--workdir={root}/new", f"--workdir={root}/existing"
  config, _ = _experiment("tiny")
  refused = {}
  for path in _leaves(config):
    if path in FREE:
      continue
    bad = INVALID[path]
    refused[path] = (["--experiment=tiny", _flag(path, bad[0]) if bad else _bool_flag(path)], path)
  for case, (name, overrides, named) in PAIRS.items():
    flags = [_flag(p, v) for p, v in overrides.items()]
    refused[case] = ([f"--experiment={name}", *flags], named[0])
  for name in EXPERIMENTS:
    refused[f"{name}-heads"] = ([f"--experiment={name}", "--config.model.num_heads=0"], "model")
  for name, path in (
    ("multi30k", "corpus_dir"),
    ("table3", "variant"),
    ("table3", "paper_dev_bleu"),
  ):
    refused[f"{name}-{path}"] = ([f"--experiment={name}", _flag(path, INVALID[path][0])], path)
  corpora = ({"source": f"{root}/a.txt", "target": f"{root}/b.txt", "weight": -1.0},)
  weight = ["--config.data.train_source=", "--config.data.train_target="]
  weight += [_flag("data.train_corpora", corpora)]
  refused["corpus-weight"] = (["--experiment=multi30k", *weight], "data.train_corpora[0].weight")
  fields = set(_leaves(config)) - set(PREPARE_FIELDS)
  cases = {}
  for case, (args, named) in refused.items():
    cases[f"train:{case}"] = ("train", [new, *args], named)
    if case not in fields:
      cases[f"prepare:{case}"] = ("prepare", [new, *args], named)
  for case in ("heads-d_model", "budget-max_len", "data.bucket_multiple", "model.dtype"):
    args, named = refused[case]
    cases[f"bench:{case}"] = ("bench", ["--parts=train,pipeline", *args], named)
  for case in ("heads-d_model", "data-model-max_len", "data.treebank_train", "seed"):
    args, named = refused[case]
    cases[f"train-existing:{case}"] = ("train", [existing, *args], named)
    cases[f"prepare-existing:{case}"] = ("prepare", [existing, *args], named)
  return cases


@pytest.fixture(scope="module")
def command_results(tmp_path_factory):
  """(root, name -> {status, stderr, created, changed}) of every case of _command_cases."""
  root = str(tmp_path_factory.mktemp("config"))
  for name in ("a.txt", "b.txt"):
    with open(f"{root}/{name}", "w") as f:
      f.write("1 2\n3 4\n")
  os.makedirs(f"{root}/existing")
  with open(f"{root}/existing/notes.txt", "w") as f:
    f.write("kept\n")
  with open(f"{root}/existing/config.json", "w") as f:
    json.dump({"note": "an earlier run"}, f)
  cases = [[name, command, args] for name, (command, args, _) in _command_cases(root).items()]
  out_dir = str(tmp_path_factory.mktemp("config_stderr"))
  return root, support.forked_commands(cases, root, out_dir, child_timeout_s=10)


def test_the_commands_are_refused_in_one_line_with_status_2_and_nothing_written(command_results):
  root, results = command_results
  failures = []
  for name, (command, _, named) in sorted(_command_cases(root).items()):
    result = results[name]
    lines = [line for line in result["stderr"].splitlines() if line.strip()]
    line = next((x for x in lines if x.startswith(f"t2t-{command}: ")), "")
    problems = [
      f"status {result['status']}" if result["status"] != 2 else "",
      f"{len(lines)} lines" if not 1 <= len(lines) <= 3 else "",
      "a traceback" if "Traceback" in result["stderr"] else "",
      f"no line of t2t-{command} naming config.{named}" if f"config.{named}" not in line else "",
      f"created {result['created']}" if result["created"] else "",
      f"changed {result['changed']}" if result["changed"] else "",
    ]
    if any(problems):
      failures.append(f"{name}: {', '.join(p for p in problems if p)}: {result['stderr'][-300:]}")
  assert not failures, "\n".join(failures)
  assert len(results) >= 150
  assert not os.path.exists(f"{root}/new")
  assert sorted(os.listdir(f"{root}/existing")) == ["config.json", "notes.txt"]
