"""Reserved token ids shared by the vocabulary, the data pipeline, the model and decoding.

Pad is 0 so that `tokens > 0` is the non-padding mask everywhere (masks, loss weights);
the SentencePiece model is trained with exactly these ids (unknown is deliberately not 0).
"""

PAD_ID = 0
EOS_ID = 1
BOS_ID = 2
UNK_ID = 3
NUM_RESERVED = 4
