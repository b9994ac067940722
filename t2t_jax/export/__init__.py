"""Export a trained workdir for other inference engines: CTranslate2 and Hugging Face.

    t2t-export --workdir=DIR --format=ctranslate2 --output=OUT [--quantization=int8]
    t2t-export --workdir=DIR --format=huggingface --output=OUT

Both exporters read the same thing: the model configuration, one parameter tree (a checkpoint
or the average of several, chosen as t2t-translate chooses) and the shared vocabulary, as
`Trained`. They need the `export` extra (ctranslate2, transformers, safetensors), imported only
when an exporter runs.
"""

import dataclasses
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from t2t_jax.decoding.config import PAPER_SEARCH, SearchConfig
from t2t_jax.model import TransformerConfig
from t2t_jax.tokens import BOS_ID, EOS_ID, NUM_RESERVED, PAD_ID, UNK_ID

if TYPE_CHECKING:  # the data package (TFDS, grain) loads only when a workdir is read
  from t2t_jax.data.tokenizer import Tokenizer

# One module's parameters (a layer, a stack): names -> numpy arrays or nested trees.
ParamTree = Mapping[str, Any]

# The reserved ids' tokens, as the SentencePiece models t2t_jax trains name them.
RESERVED_TOKENS = {PAD_ID: "<pad>", EOS_ID: "</s>", BOS_ID: "<s>", UNK_ID: "<unk>"}


class ExportError(ValueError):
  """A model or workdir the chosen format cannot express; says why."""


@dataclasses.dataclass
class Trained:
  """What an exporter reads from a workdir.

  Attributes:
    config: the model's hyperparameters.
    params: the parameter tree as numpy float32 arrays (Flax names, see t2t_jax.model).
    tokenizer: the workdir's tokenizer (SentencePiece or symbol list).
    vocabulary: the token string of every id, in id order (ids 0-3 are RESERVED_TOKENS).
    vocab_file: the vocabulary file (vocab.model, vocab.symbols or vocab.words; in the workdir
      or config.data.data_dir).
    checkpoint_steps: the checkpoint step(s) the parameters come from (several: averaged).
    source_lang, target_lang: language codes from the data config ('' when unknown).
    search: the workdir's decoding settings (the defaults an exported model decodes with).
  """

  config: TransformerConfig
  params: dict[str, Any]
  tokenizer: "Tokenizer"
  vocabulary: list[str]
  vocab_file: str
  checkpoint_steps: list[int]
  source_lang: str = ""
  target_lang: str = ""
  search: SearchConfig = PAPER_SEARCH

  @property
  def is_sentencepiece(self) -> bool:
    """Whether the vocabulary is a SentencePiece model; a symbol or word list (vocab.symbols,
    parsing's vocab.words: tokenizers with a `symbols` list) is not, whatever its file name."""
    return getattr(self.tokenizer, "symbols", None) is None


def vocabulary_tokens(tokenizer: "Tokenizer") -> list[str]:
  """Every id's token string: SentencePiece pieces, or the reserved tokens then the symbols."""
  symbols = getattr(tokenizer, "symbols", None)
  if symbols is not None:
    return [RESERVED_TOKENS[i] for i in range(NUM_RESERVED)] + list(symbols)
  import sentencepiece as spm

  sp = spm.SentencePieceProcessor(model_proto=tokenizer.model_proto)
  return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def load_trained(workdir: str, checkpoint: str = "auto") -> Trained:
  """Reads a t2t-train workdir: config.json, the vocabulary and checkpoint(s).

  `checkpoint` is t2t-translate's --checkpoint: 'auto', 'latest', 'average:N', 'best[:N]',
  'selected' or a step. Raises TranslateError or CheckpointSpecError (naming the path) for a
  workdir that is not usable.
  """
  from t2t_jax import data
  from t2t_jax.decoding.translator import Translator, load_config

  translator = Translator.from_workdir(workdir, checkpoint, None)  # the model as stored
  config = load_config(workdir)
  vocab_file = str(data.vocab_path(config.data, workdir))
  params = _to_numpy(translator.params)
  tokenizer = translator.tokenizer
  return Trained(
    config=translator.model.config,
    params=params,
    tokenizer=tokenizer,
    vocabulary=vocabulary_tokens(tokenizer),
    vocab_file=vocab_file,
    checkpoint_steps=list(translator.checkpoint_steps),
    source_lang=config.data.source_lang or "",
    target_lang=data.target_language(config.data),
    search=translator.search,
  )


def _to_numpy(tree: ParamTree | ArrayLike) -> dict[str, Any] | np.ndarray:
  if isinstance(tree, dict) or hasattr(tree, "items"):
    return {k: _to_numpy(v) for k, v in tree.items()}
  return np.asarray(tree, np.float32)


def check_output_dir(path: str) -> None:
  """Refuses an output directory that already holds files (nothing is overwritten)."""
  if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
    raise ExportError(f"--output={path} already exists and is not empty; choose a new one")
