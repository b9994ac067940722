"""Training: the loss and optimizer of the paper (sections 5.3, 5.4), the per-device steps, the
one pmap-aware module, multi-host start-up, metrics, the dev and test evaluation and the loop
(`t2t_jax.training.trainer.train_and_evaluate`), with its typed defaults
(`t2t_jax.training.config.TrainConfig`). Checkpoints and the workdir are t2t_jax.run."""
