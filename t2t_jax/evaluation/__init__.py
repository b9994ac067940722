"""Evaluation: the BLEU family and chrF (scoring), EVALB bracket F1 (parseval), and a
translator's dev BLEU/F1 and test report (evaluate), as the trainer and t2t-translate use
them. The trainer's dev loss, checkpoint selection and test run are training.evaluation."""
