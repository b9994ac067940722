"""English constituency parsing as translation (paper section 6.3), on the NLTK Penn Treebank
sample, sized for two CPU cores.

    t2t-train --experiment=parsing --workdir=/tmp/parsing
    t2t-train --experiment=parsing:big --workdir=/tmp/parsing_big  # the paper's size (accelerator)
    t2t-translate --workdir=/tmp/parsing --input=/tmp/parsing/test.words \
        --reference=/tmp/parsing/test.gold

The source is a sentence's words, the target its tree linearized as in Vinyals et al. 2015
(labelled brackets) with each leaf the word itself (config.data.tree_leaves='words';
`t2t_jax.data.trees`), decoded under the tree constraint. Data: the 199 files
wsj_0001-wsj_0199 (3,914 trees) of ../shared/data/ptb_sample beside the repository, or
--config.data.treebank_dir; split by file: train 0001-0179 (3,669 trees), dev 0180-0189 (127),
test 0190-0199 (118). Decoding as in the paper: beam 21, alpha 0.3, maximum output length
input + 300. The vocabulary is word level
(`t2t_jax.data.sources.treebank.vocabulary_symbols`): the 55 target symbols (bracket labels
and XX), training words seen twice or more, and 8 word-shape classes for the rest. The paper
used a 16k subword vocabulary on 40k sentences; on 3.7k sentences a word vocabulary keeps one
source token per target leaf and needs no subword counting.

Scores: EVALB bracket F1 (COLLINS.prm conventions, `t2t_jax.evaluation.parseval`) on dev
during training (greedy) and on test at the end (beam 21), with the checkpoint chosen on dev
F1. The default model (3+3 layers, d_model 256) trains for 54 minutes and parses the test
split within the hour on two CPU cores; ':big' is the paper's 4 layers with d_model 1024,
for an accelerator. Results and caveats: docs/parsing.md.
"""

import os

from t2t_jax.experiments import base

DEFAULT_DIR = os.path.normpath(
  os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "ptb_sample"
  )
)


def get_config(size: str = ""):
  size = size or "small"
  if size not in ("small", "big"):
    raise ValueError(f"parsing: size {size!r} must be '' (small) or 'big'")
  config = base.get_config()
  config.data.update(
    source="treebank",
    treebank_dir=os.environ.get("T2T_PTB_SAMPLE", DEFAULT_DIR),
    treebank_train="1-179",
    treebank_dev="180-189",
    treebank_test="190-199",
    vocab_min_count=2,
    max_len=160,  # drops the 19 training trees longer than 159 target symbols
    tokens_per_batch=4096,
    batching="bucket",
    bucket_boundaries=(32, 48, 64, 80, 96, 128, 160),
    # Sources are about a third of their targets (median 23 words, 59 target symbols): each
    # bucket's source length, so the encoder is not fed targets' worth of padding.
    source_bucket_boundaries=(16, 24, 32, 40, 48, 64, 160),
    # Constrained decoding writes no deeper tree and no longer run of opening brackets than
    # the training split holds (28 and 6; tests/test_parsing_data.py): without them a weak
    # model stacks unary brackets, `(NX (NX (NX ...`, until its output limit.
    tree_max_depth=28,
    tree_max_opens=6,
    # Each leaf is its source word (the decoder copies the sentence, so its history says
    # which word it has reached): at 15 minutes of training it parsed the test split at
    # F1 50.95 where XX1, XX2, ... gave 15.63 (docs/parsing.md, the leaf forms).
    tree_leaves="words",
  )
  # Positions reach input + 300 when decoding (sinusoids: no parameters).
  config.model.update(
    d_model=256, d_ff=1024, num_heads=4, num_layers=3, dropout_rate=0.2, max_len=512
  )
  if size == "big":  # paper 6.3: 4 layers, d_model 1024
    config.model.update(d_model=1024, d_ff=4096, num_heads=16, num_layers=4, dropout_rate=0.3)
  config.beam_size = 21  # paper 6.3
  config.alpha = 0.3
  config.max_output_extra = 300
  config.num_train_steps = 6000  # the time limit below ends it first on two CPU cores
  config.warmup_steps = 400
  # Half the paper's rate: at 1.5x (peak 4.7e-3) the decoder settled on one parse shape for
  # every sentence and never learned to read the source (docs/parsing.md).
  config.learning_rate_factor = 0.5
  config.log_every_steps = 50
  config.eval_every_steps = 250
  config.checkpoint_every_steps = 100
  config.keep_checkpoints = 5
  # The last step parses the test split with the best on dev F1 (greedy, bleu_beam_size) of
  # the last checkpoint, the average of the last five (every 100 steps) and the checkpoint
  # of the best dev F1 so far: a greedy dev decoding each, seconds on two CPU cores.
  config.average_checkpoints = 1
  config.select_checkpoints = "latest,average:5,best"
  config.bleu_every_steps = 250  # dev bracket F1 (the whole dev split) every 250 steps
  config.bleu_num_sentences = 127
  config.bleu_beam_size = 1  # greedy: a beam of 21 costs minutes per evaluation here
  config.test_at_end = True
  config.train_time_limit_minutes = 54.0
  return config
