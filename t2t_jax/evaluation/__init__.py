"""Evaluation: the BLEU family and chrF (scoring), and what the trainer and t2t-translate do
with them: dev loss, dev BLEU, checkpoint selection and the test translation (evaluate)."""
