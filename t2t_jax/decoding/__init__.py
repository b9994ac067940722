"""Decoding: greedy and beam search over a `tokens_to_logits(ids, cache)` function (search),
and the Translator that turns a workdir's checkpoint and vocabulary into text (translator)."""
