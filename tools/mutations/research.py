"""The researcher's tools: the moving average of the parameters (config.ema_decay), the paired
significance tests of t2t-compare, the training profile (config.profile_steps) and the
real-text benchmark's figures (t2t-bench --vs=ctranslate2)."""

from tools.mutations import Mutation

M = Mutation
EMA_TESTS = ("tests/test_ema.py",)
COMPARE_TESTS = ("tests/test_compare.py",)
MUTATIONS = (
  M(
    "ema_checkpoint_flag",
    "the commands' --checkpoint check refuses 'ema' before any workdir is read",
    "t2t_jax/cli/common.py",
    "^(auto|selected|latest|best|ema|",
    "^(auto|selected|latest|best|",
    EMA_TESTS,
  ),
  M(
    "ema_decay_direction",
    "EMA: decay weighs the new parameters instead of the average",
    "t2t_jax/training/steps.py",
    "lambda e, p: decay * e + (1.0 - decay) * p",
    "lambda e, p: (1.0 - decay) * e + decay * p",
    EMA_TESTS,
  ),
  M(
    "ema_warmup",
    "EMA: the warmup (1 + t) / (10 + t) caps the decay from below, not above",
    "t2t_jax/training/steps.py",
    "jnp.minimum(decay, (1.0 + step) / (10.0 + step))",
    "jnp.maximum(decay, (1.0 + step) / (10.0 + step))",
    EMA_TESTS,
  ),
  M(
    "ema_stale_params",
    "EMA: averages the parameters before the update instead of after",
    "t2t_jax/training/steps.py",
    "ema = update_ema(ema, params, ema_decay_at(state.ema_decay, state.step))",
    "ema = update_ema(ema, state.params, ema_decay_at(state.ema_decay, state.step))",
    EMA_TESTS,
  ),
  M(
    "ema_step_offset",
    "EMA: the warmup counts the update from 1, not 0",
    "t2t_jax/training/steps.py",
    "ema_decay_at(state.ema_decay, state.step))",
    "ema_decay_at(state.ema_decay, state.step + 1))",
    EMA_TESTS,
  ),
  M(
    "ema_not_saved",
    "EMA: a misspelt field: checkpoints never hold the average, a resume restarts it",
    "t2t_jax/run/checkpoint.py",
    "ema = getattr(state, EMA, None)",
    'ema = getattr(state, "ema_", None)',
    EMA_TESTS,
  ),
  M(
    "ema_spec_reads_params",
    "--checkpoint=ema reads the parameters instead of their average",
    "t2t_jax/run/checkpoint_spec.py",
    'return EMA if spec == EMA else "params"',
    'return EMA if spec != EMA else "params"',
    EMA_TESTS,
  ),
  M(
    "compare_bootstrap_samples",
    "t2t-compare: 100 bootstrap resamples by default instead of sacreBLEU's 1000",
    "t2t_jax/evaluation/significance.py",
    "  samples: int = 0,\n) -> list[MetricComparison]:",
    "  samples: int = 100,\n) -> list[MetricComparison]:",
    COMPARE_TESTS,
  ),
  M(
    "compare_significance_side",
    "t2t-compare: '*' marks p above 0.05 instead of below",
    "t2t_jax/evaluation/significance.py",
    "r.p_value < SIGNIFICANCE_LEVEL",
    "r.p_value > SIGNIFICANCE_LEVEL",
    COMPARE_TESTS,
  ),
  M(
    "compare_copy_p",
    "t2t-compare: p = 1 goes to systems that differ from the baseline, not to its copies",
    "t2t_jax/evaluation/significance.py",
    "if i > 0 and list(lines) == list(baseline[1]):",
    "if i > 0 and list(lines) != list(baseline[1]):",
    COMPARE_TESTS,
  ),
  M(
    "compare_baseline_row",
    "t2t-compare: the first system's p-value is dropped as if it were the baseline",
    "t2t_jax/evaluation/significance.py",
    "p_value = None if i == 0 else result.p_value",
    "p_value = None if i <= 1 else result.p_value",
    COMPARE_TESTS,
  ),
  M(
    "profile_window",
    "profile_steps: the trace starts one step after START",
    "t2t_jax/training/profile.py",
    "if start <= number <= end and",
    "if start < number <= end and",
    ("tests/test_profile.py",),
  ),
  M(
    "bench_step_cost_per_needed_step",
    "t2t-bench's ms per hypothesis-step divides t2t_jax's pass by the steps its outputs needed",
    "t2t_jax/bench/real_text.py",
    "steps = _hypothesis_steps(row, search)\n  return",
    'steps = search["hypothesis_steps_needed"]\n  return',
    ("tests/test_bench_real_text.py",),
  ),
  M(
    "bench_one_batch_row_decodes_two",
    "t2t-bench's 'one batch at a time' row decodes one batch at a time",
    "t2t_jax/bench/real_text.py",
    "one = Translator.ensemble([first], batch_threads=1)",
    "one = Translator.ensemble([first])",
    ("tests/test_bench_real_text.py",),
  ),
  M(
    "compile_seconds_summed",
    "t2t-bench's compile seconds add up compilations that ran at once (two batch threads)",
    "t2t_jax/compilation.py",
    "      self.seconds += max(0.0, end - max(start, self._covered_until))",
    "      self.seconds += end - start",
    ("tests/test_bench_real_text.py",),
  ),
)
