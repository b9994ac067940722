"""t2t-export: a trained workdir as a CTranslate2 or Hugging Face (MarianMT) model directory.

    t2t-export --workdir=DIR --format=ctranslate2 --output=OUT [--quantization=int8]
    t2t-export --workdir=DIR --format=huggingface --output=OUT
               [--checkpoint=auto|latest|average:N|best[:N]|ema|selected|STEP]

--checkpoint chooses the parameters as t2t-translate does ('auto': the checkpoint t2t-train
selected on dev when there is one, else the latest); --beam_size and --alpha (the defaults
written to generation_config.json) default to the workdir's experiment. Needs the `export` extra
(in the t2t_jax checkout: pip install -e '.[export]'). See docs/export.md for using the output.
"""

import types
from collections.abc import Sequence

from absl import app, flags

from t2t_jax import export
from t2t_jax.cli import common
from t2t_jax.decoding.translator import TranslateError, load_config
from t2t_jax.run import checkpoint
from t2t_jax.run.checkpoint import CheckpointSpecError

FORMATS = ("ctranslate2", "huggingface")

flags.DEFINE_string("workdir", None, "a t2t-train workdir (config.json, vocabulary, checkpoints)")
flags.DEFINE_enum("format", "ctranslate2", FORMATS, "what to write")
flags.DEFINE_string("output", None, "new model directory (must not exist or be empty)")
flags.DEFINE_string(
  "checkpoint",
  "auto",
  common.CHECKPOINT_HELP,
)
flags.DEFINE_string(
  "quantization",
  "float32",
  "ctranslate2 only: stored weight type (float32, "
  "int8, int8_float32, int8_float16, int8_bfloat16, int16, float16, bfloat16)",
)
flags.DEFINE_integer(
  "beam_size",
  None,
  "huggingface only: num_beams of generation_config.json (default: the workdir's config.beam_size)",
)
flags.DEFINE_float(
  "alpha",
  None,
  "huggingface only: length_penalty of generation_config.json (default: the workdir's "
  "config.alpha)",
)
FLAGS = flags.FLAGS


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(
      f"unexpected arguments {argv[1:]}: flags are written --name=value (t2t-export --help)"
    )
  if not FLAGS.workdir or not FLAGS.output:
    raise app.UsageError(
      "--workdir and --output are required: the trained workdir and a new directory, e.g. "
      "--workdir=workdirs/NAME --output=exported/NAME"
    )
  common.check_checkpoint_flag("t2t-export", FLAGS.checkpoint)
  if FLAGS.format != "ctranslate2" and FLAGS.quantization != "float32":
    raise app.UsageError(f"--quantization={FLAGS.quantization} is for --format=ctranslate2")
  for name in ("beam_size", "alpha"):  # a CTranslate2 model stores no decoding defaults
    if FLAGS.format != "huggingface" and FLAGS[name].present:
      raise app.UsageError(
        f"--{name}={FLAGS[name].value} is for --format=huggingface; CTranslate2 takes "
        "beam_size and length_penalty when it translates"
      )
  common.quiet_library_logs()
  try:
    # The workdir and the checkpoint choice first: a mistyped path is named before a
    # missing package is.
    load_config(FLAGS.workdir)
    checkpoint.resolve_spec(FLAGS.workdir, FLAGS.checkpoint)
    writer = _writer(FLAGS.format)
    if FLAGS.format == "ctranslate2":
      writer.check_quantization(FLAGS.quantization)
    export.check_output_dir(FLAGS.output)
    trained = export.load_trained(FLAGS.workdir, FLAGS.checkpoint)
    if FLAGS.format == "ctranslate2":
      path = writer.export(trained, FLAGS.output, FLAGS.quantization)
    else:
      search = trained.search.override(beam_size=FLAGS.beam_size, alpha=FLAGS.alpha)
      path = writer.export(trained, FLAGS.output, search)
  except (export.ExportError, TranslateError, CheckpointSpecError) as e:
    raise SystemExit(f"t2t-export: {e}") from None
  print(f"t2t-export: checkpoint(s) {trained.checkpoint_steps} -> {path} ({FLAGS.format})")


def _writer(fmt: str) -> types.ModuleType:
  """The exporter module, or a one-line error naming the missing package."""
  needs = ("ctranslate2",) if fmt == "ctranslate2" else ("transformers", "safetensors")
  for package in needs:
    try:
      __import__(package)
    except ImportError:
      raise export.ExportError(
        f"--format={fmt} needs the '{package}' package: in the t2t_jax checkout, "
        "pip install -e '.[export]'"
      ) from None
  if fmt == "ctranslate2":
    from t2t_jax.export import to_ctranslate2

    return to_ctranslate2
  from t2t_jax.export import to_huggingface

  return to_huggingface


def run() -> None:
  common.run(main, __doc__)


if __name__ == "__main__":
  run()
