"""Benchmarks: how fast t2t_jax trains and decodes, against the device's matmul peak and
against other implementations of the same model (t2t-bench is the command line over them).

  timing       the measuring tools: compilation counter, matmul peak, peak memory, threads
  inputs       what is measured on: synthetic batches, real sentences from ../shared/data
  train        t2t_jax's training step: model FLOPs, step time, MFU
  decode       t2t_jax's beam and greedy search: sentences/s and tokens/s
  pipeline     the input pipeline's pairs/s and tokens/s
  peers        the training step beside torch, plain flax and Marian (--vs=peers)
  ctranslate2  beam search beside CTranslate2 on the same parameters (--vs=ctranslate2)
  report       every result as the text table t2t-bench prints
"""
