"""Translation of a trained workdir: the Translator (notebooks) and the t2t-translate command.

    t2t-translate --workdir=DIR [--input=FILE] [--output=FILE] [--reference=FILE]
                  [--beam_size=4] [--alpha=0.6] [--checkpoint=auto|latest|average:N|STEP|selected]

Reads stdin and writes stdout by default: one output line per input line, in input order
(sentences are sorted by length for batching and put back). With --reference it prints
sacreBLEU (with its signature), the paper-style tokenized BLEU and chrF to stderr.
"""

import functools
import json
import os
import sys
from typing import List, Optional, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from t2t_jax import checkpoint, decode
from t2t_jax.model import Transformer, TransformerConfig, beam_search_cache
from t2t_jax.tokens import EOS_ID, PAD_ID


class TranslateError(ValueError):
  """A workdir, checkpoint choice or input file that cannot be used; names the path."""


def load_config(workdir: str) -> ml_collections.ConfigDict:
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise TranslateError(f"{workdir}: no config.json (not a t2t-train workdir?)")
  with open(path, encoding="utf-8") as f:
    return ml_collections.ConfigDict(json.load(f))


def target_language(config) -> str:
  """The target language code (Moses tokenization of the paper-style BLEU)."""
  data = config.data
  if data.get("target_lang"):
    return data.target_lang
  other = [lang for lang in data.get("pair", "de-en").split("-") if lang != "en"]
  return other[0] if other else "en"


def _load_tokenizer(config, workdir):
  from t2t_jax import data  # pylint: disable=g-import-not-at-top
  path = data.vocab_path(config.data, workdir)
  if not os.path.exists(str(path)):
    raise TranslateError(f"{workdir}: vocabulary {path} is missing")
  return data.load_tokenizer(path)


def choose_steps(ckpts: checkpoint.Checkpoints, spec: str) -> List[int]:
  """'latest' -> [last]; 'average:N' -> the last N steps; 'STEP' -> [STEP]."""
  available = ckpts.steps()
  if not available:
    raise TranslateError(f"{ckpts.directory}: no checkpoint to translate with")
  if spec == "latest":
    return available[-1:]
  if spec.startswith("average:"):
    n = int(spec.split(":", 1)[1])
    if n < 1 or n > len(available):
      raise TranslateError(f"--checkpoint={spec}: {ckpts.directory} holds {len(available)} "
                           f"checkpoint(s) {available}, fewer than {n}")
    return available[-n:]
  if spec.isdigit() and int(spec) in available:
    return [int(spec)]
  raise TranslateError(f"--checkpoint={spec}: not 'latest', 'average:N' or one of the steps "
                       f"{available} in {ckpts.directory}")


SELECTED_FILE = "selected.json"


def selected_spec(workdir: str) -> str:
  """The checkpoint choice t2t-train made on dev (written to <workdir>/selected.json)."""
  path = os.path.join(workdir, SELECTED_FILE)
  try:
    with open(path) as f:
      return json.load(f)["checkpoint"]
  except FileNotFoundError:
    raise TranslateError(f"--checkpoint=selected: {path} does not exist (set "
                         "config.select_checkpoints in training to write it)") from None
  except (ValueError, KeyError) as e:
    raise TranslateError(f"--checkpoint=selected: {path} is not a selection file: {e}") from None


def load_params(workdir: str, spec: str, params_like):
  if spec == "auto":  # what t2t-train scored the test split with, when it chose on dev
    has_choice = os.path.exists(os.path.join(workdir, SELECTED_FILE))
    spec = "selected" if has_choice else "latest"
  if spec == "selected":
    spec = selected_spec(workdir)
  ckpts = checkpoint.Checkpoints(workdir)
  chosen = choose_steps(ckpts, spec)
  trees = [ckpts.restore_params(step, params_like) for step in chosen]
  return (trees[0] if len(trees) == 1 else checkpoint.average_params(trees)), chosen


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def search(params, inputs, max_lengths, alpha, *, model, max_decode_len: int, beam_size: int,
           suppress_eos: bool = False):
  """Encodes once, builds the cache, then beam search (beam_size > 1) or greedy decoding.

  Beam search runs the decoder on [batch, beam] ids (`Transformer.decode_beam_step`): the
  hypotheses of a sentence share its encoder keys/values, and their self-attention entries
  are written in place and read through `decode.BeamSlots`, so no cache is copied per
  hypothesis or gathered after a step.

  suppress_eos (benchmarks only): EOS is never chosen before the length limit, so every
  output has exactly its max length whatever the parameters.

  Returns:
    beam search: `decode.beam_search`'s (sequences [batch, beam, max_decode_len], scores
    [batch, beam]); greedy: (sequences [batch, 1, max_decode_len], log-probs [batch, 1]).
  """
  encoded = model.apply({"params": params}, inputs, method=Transformer.encode)
  _, state = model.apply({"params": params}, encoded, inputs, max_decode_len,
                         method=Transformer.init_cache, mutable=["cache"])

  def no_eos(logits):
    if not suppress_eos:
      return logits
    return jnp.where(jnp.arange(logits.shape[-1]) == EOS_ID, -1e9, logits)

  if beam_size == 1:
    def tokens_to_logits(ids, cache):
      logits, new = model.apply({"params": params, "cache": cache}, ids,
                                method=Transformer.decode_step, mutable=["cache"])
      return no_eos(logits), new["cache"]

    seqs, log_probs = decode.greedy_search(tokens_to_logits, state["cache"],
                                           max_lengths=max_lengths,
                                           max_decode_len=max_decode_len)
    return seqs[:, None], log_probs[:, None]

  def beam_tokens_to_logits(ids, cache):
    model_cache, slots = cache
    logits, new = model.apply({"params": params, "cache": model_cache}, ids,
                              slots.attention_mask(), method=Transformer.decode_beam_step,
                              mutable=["cache"])
    return no_eos(logits), (new["cache"], slots)

  def reorder(cache, parents):
    model_cache, slots = cache
    return model_cache, slots.reorder(parents)

  cache = (beam_search_cache(state["cache"], beam_size),
           decode.BeamSlots.create(inputs.shape[0], beam_size, max_decode_len))
  return decode.beam_search(beam_tokens_to_logits, cache, max_lengths=max_lengths,
                            max_decode_len=max_decode_len, beam_size=beam_size, alpha=alpha,
                            reorder_cache=reorder)


@functools.partial(jax.jit, static_argnames=("model", "max_decode_len", "beam_size",
                                             "suppress_eos"))
def _search(params, inputs, max_lengths, alpha, *, model, max_decode_len, beam_size,
            suppress_eos=False):
  """The best output of `search` per sentence: int32 [batch, max_decode_len]."""
  seqs, _ = search(params, inputs, max_lengths, alpha, model=model,
                   max_decode_len=max_decode_len, beam_size=beam_size,
                   suppress_eos=suppress_eos)
  return seqs[:, 0]


class Translator:
  """A trained model with its vocabulary: `.translate(sentences)` and `.attention_weights`."""

  def __init__(self, model: Transformer, params, tokenizer, max_output_extra: int = 50,
               batch_tokens: int = 4096):
    self.model, self.params, self.tokenizer = model, params, tokenizer
    self.max_output_extra = max_output_extra
    self.batch_tokens = batch_tokens
    self.checkpoint_steps: List[int] = []
    self.target_lang = "de"

  @classmethod
  def from_workdir(cls, workdir: str, checkpoint_spec: str = "latest", **kwargs):
    """Loads config.json, the vocabulary and checkpoint(s) ('latest', 'average:N', 'STEP')."""
    config = load_config(workdir)
    tokenizer = _load_tokenizer(config, workdir)
    model_cfg = TransformerConfig.from_dict(config.model.to_dict(),
                                            vocab_size=tokenizer.vocab_size)
    model = Transformer(model_cfg)
    dummy = jnp.ones((1, 4), jnp.int32)
    like = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), dummy, dummy))["params"]
    params, steps = load_params(workdir, checkpoint_spec, like)
    kwargs.setdefault("max_output_extra", config.get("max_output_extra", 50))
    translator = cls(model, params, tokenizer, **kwargs)
    translator.checkpoint_steps = steps
    translator.target_lang = target_language(config)
    return translator

  def _source_ids(self, sentences: Sequence[str]) -> List[List[int]]:
    max_len = self.model.config.max_len
    ids = []
    for i, text in enumerate(sentences):
      tokens = list(self.tokenizer.encode(text)) + [EOS_ID]
      if len(tokens) > max_len:
        logging.warning("line %d: %d source tokens exceed the model's max_len=%d; "
                        "truncated", i + 1, len(tokens), max_len)
        tokens = tokens[:max_len - 1] + [EOS_ID]
      ids.append(tokens)
    return ids

  def translate(self, sentences: Sequence[str], beam_size: int = 4, alpha: float = 0.6
                ) -> List[str]:
    """Translates each sentence (max output length = its source length + max_output_extra)."""
    sources = self._source_ids(sentences)
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    outputs: List[Optional[str]] = [None] * len(sources)
    for batch in self._batches(order, sources):
      for i, text in zip(batch, self._translate_batch([sources[i] for i in batch],
                                                       beam_size, alpha)):
        outputs[i] = text
    return outputs

  def _batches(self, order, sources):
    batch, longest = [], 0
    for i in order:
      longest = max(longest, len(sources[i]))
      if batch and (len(batch) + 1) * longest > self.batch_tokens:
        yield batch
        batch, longest = [], len(sources[i])
      batch.append(i)
    if batch:
      yield batch

  def _translate_batch(self, sources, beam_size, alpha) -> List[str]:
    max_len = self.model.config.max_len
    src_len = min(_round_up(max(len(s) for s in sources), 8), max_len)
    rows = 1 << (len(sources) - 1).bit_length()  # few distinct shapes: fewer compiles
    inputs = np.full((rows, src_len), PAD_ID, np.int32)
    for r, s in enumerate(sources):
      inputs[r, :len(s)] = s
    limits = np.array([len(s) + self.max_output_extra for s in sources] +
                      [1] * (rows - len(sources)), np.int32)
    if limits.max() > max_len:
      logging.warning("output length limited to the model's max_len=%d (source length + %d "
                      "exceeds it)", max_len, self.max_output_extra)
    max_decode_len = min(_round_up(int(limits.max()), 8), max_len)
    seqs = _search(self.params, jnp.asarray(inputs), jnp.asarray(np.minimum(limits, max_len)),
                   jnp.float32(alpha), model=self.model, max_decode_len=max_decode_len,
                   beam_size=beam_size)
    return [self.tokenizer.decode(row) for row in np.asarray(seqs)[:len(sources)]]

  def attention_weights(self, source: str, target: str) -> dict:
    """Every layer's and head's attention for one pair, teacher-forced on `target`.

    Returns {'encoder_self': [layers, heads, src, src], 'decoder_self': [layers, heads, tgt,
    tgt], 'cross': [layers, heads, tgt, src]} as numpy, plus the 'source_tokens' and
    'target_tokens' (subword strings, EOS included) that label the axes.
    """
    src = self._source_ids([source])[0]
    tgt = list(self.tokenizer.encode(target)) + [EOS_ID]
    inputs, targets = jnp.array([src]), jnp.array([tgt])
    _, state = self.model.apply({"params": self.params}, inputs, targets,
                                mutable=["intermediates"])
    inter = state["intermediates"]
    stack = lambda part, layers, kind: np.stack(
        [np.asarray(inter[part][f"layer_{i}"][kind]["attention_weights"][0][0])
         for i in range(layers)])
    cfg = self.model.config
    return dict(encoder_self=stack("encoder", cfg.encoder_layers, "self_attention"),
                decoder_self=stack("decoder", cfg.decoder_layers, "self_attention"),
                cross=stack("decoder", cfg.decoder_layers, "cross_attention"),
                source_tokens=self._pieces(src), target_tokens=self._pieces(tgt))

  def _pieces(self, ids) -> List[str]:
    piece = getattr(self.tokenizer, "id_to_piece", None)
    if piece is not None:
      return [piece(i) for i in ids]
    return [self.tokenizer.decode([i]) if i != EOS_ID else "</s>" for i in ids]


def read_lines(path: Optional[str]) -> List[str]:
  """Lines of a UTF-8 file (or stdin), without line ends; bad bytes name the line."""
  try:
    raw = sys.stdin.buffer.read() if path in (None, "", "-") else open(path, "rb").read()
  except OSError as e:
    raise TranslateError(f"{path}: cannot read ({e.strerror})") from e
  name = path or "<stdin>"
  lines = raw.split(b"\n")
  if lines and lines[-1] == b"":
    lines.pop()
  out = []
  for number, line in enumerate(lines, start=1):
    try:
      out.append(line.rstrip(b"\r").decode("utf-8"))
    except UnicodeDecodeError as e:
      raise TranslateError(f"{name}:{number}: not UTF-8 ({e.reason} at byte {e.start})") from e
  return out


def _define_flags():
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_string("workdir", None, "a t2t-train workdir (config.json, vocabulary, checkpoints)")
  flags.DEFINE_string("input", None, "source sentences, one per line (default: stdin)")
  flags.DEFINE_string("output", None, "where translations go (default: stdout)")
  flags.DEFINE_string("reference", None, "reference translations: prints BLEU and chrF")
  flags.DEFINE_integer("beam_size", 4, "beam width; 1 = greedy decoding")
  flags.DEFINE_float("alpha", 0.6, "length penalty exponent")
  flags.DEFINE_string("checkpoint", "auto", "'latest', 'average:N' (last N), a step, "
                      "'selected' (the choice t2t-train made on dev), or 'auto': 'selected' "
                      "when the workdir has one, else 'latest'")
  flags.DEFINE_integer("batch_tokens", 4096, "source tokens per decoding batch")
  return flags.FLAGS


def main(argv):
  from t2t_jax import cli, scoring  # pylint: disable=g-import-not-at-top
  cli.quiet_library_logs()
  flags = _define_flags.flags
  if len(argv) > 1:
    raise SystemExit(f"t2t-translate: unexpected arguments {argv[1:]}")
  if not flags.workdir:
    raise SystemExit("t2t-translate: --workdir is required")
  try:
    sources = read_lines(flags.input)
    references = read_lines(flags.reference) if flags.reference else None
    if references is not None and len(references) != len(sources):
      raise TranslateError(f"--reference={flags.reference} has {len(references)} lines but "
                           f"--input={flags.input or '<stdin>'} has {len(sources)}")
    translator = Translator.from_workdir(flags.workdir, flags.checkpoint,
                                         batch_tokens=flags.batch_tokens)
  except TranslateError as e:
    raise SystemExit(f"t2t-translate: {e}") from None
  hyps = translator.translate(sources, beam_size=flags.beam_size, alpha=flags.alpha)
  text = "".join(h + "\n" for h in hyps)
  if flags.output:
    with open(flags.output, "w", encoding="utf-8") as f:
      f.write(text)
  else:
    sys.stdout.write(text)
  if references is not None:
    print(f"checkpoint(s) {translator.checkpoint_steps}, beam {flags.beam_size}, "
          f"alpha {flags.alpha}", file=sys.stderr)
    scores = scoring.score_all(hyps, references, translator.target_lang)
    print(scoring.format_scores(scores), file=sys.stderr)


def run():
  from absl import app  # pylint: disable=g-import-not-at-top
  from t2t_jax import host  # pylint: disable=g-import-not-at-top
  host.use_huge_pages()
  _define_flags.flags = _define_flags()
  app.run(main)


if __name__ == "__main__":
  run()
