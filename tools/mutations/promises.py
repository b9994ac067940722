"""User-visible promises that only a targeted test would notice breaking: one-token changes
the quick loop must catch."""

from tools.mutations import Mutation

M = Mutation
KEPT = "t2t_jax/decoding/kept_params.py"
KEPT_TESTS = ("tests/test_kept_params.py",)

MUTATIONS = (
  M(
    "store_key_without_source_digest",
    "a stored program's key leaves out the t2t_jax sources: an upgrade runs the old code's",
    "t2t_jax/compilation.py",
    "    _sources_digest(),\n",
    "",
    ("tests/test_compilation.py",),
  ),
  M(
    "executable_from_jax_cache_serialized",
    "a program jax's cache answered is serialized as it is: a later process's call fails",
    "t2t_jax/compilation.py",
    "    if _compiled_here() == before:\n",
    "    if False:\n",
    ("tests/test_compilation.py",),
  ),
  M(
    "executable_key_without_machine",
    "an executable's file is not keyed by the CPU: a shared cache runs another CPU's code",
    "t2t_jax/compilation.py",
    "  digest = hashlib.sha256((name + _machine()).encode()).hexdigest()\n",
    "  digest = hashlib.sha256(name.encode()).hexdigest()\n",
    ("tests/test_compilation.py",),
  ),
  M(
    "executable_on_every_device",
    "a stored executable is loaded for all devices: a one-device program expects 8 shards",
    "t2t_jax/compilation.py",
    '      execution_devices=[devices[i] for i in saved["devices"]],\n',
    "",
    ("tests/test_compilation.py",),
  ),
  M(
    "tool_imports_not_frozen",
    "a tool's imports are not frozen: the collector walks them during the imports and at exit",
    "t2t_jax/cli/host.py",
    "    gc.freeze()\n",
    "    pass\n",
    ("tests/test_host.py",),
  ),
  M(
    "tree_leaf_bound_off_by_one",
    "constrained parsing, leaves 'words': the leaf index is clamped one column short of the"
    " source row, so a source filling its row copies its next-to-last word as the last leaf",
    "t2t_jax/decoding/constraints.py",
    'index = jnp.minimum(state["leaves"], state["words"].shape[1] - 1)',
    'index = jnp.minimum(state["leaves"], state["words"].shape[1] - 2)',
    ("tests/test_constraints.py",),
  ),
  M(
    "stop_bound_wrong_length_for_negative_alpha",
    "the exact stop bounds a live hypothesis by lp(step + 2), not lp(step + 1): for alpha < 0"
    " it stops before a next-step ending that would still enter the finished set",
    "t2t_jax/decoding/beam.py",
    "largest_lp = length_penalty(state.step + 1, alpha)",
    "largest_lp = length_penalty(state.step + 2, alpha)",
    ("tests/test_stopping_rule.py",),
  ),
  M(
    "constraints_pin_outside_setup_cfg",
    "constraints.txt pins a version setup.cfg excludes: README's install line fails on a"
    " fresh machine",
    "constraints.txt",
    "ml_dtypes==0.6.0\n",
    "ml_dtypes==0.7.0\n",
    ("tests/test_install.py",),
  ),
  M(
    "ci_installs_other_extras_than_readme",
    "CI installs fewer extras than README's test command: the export tests skip in CI only",
    ".ci/run",
    "pip install -c constraints.txt -e '.[dev,export,serve,browser]'\n",
    "pip install -c constraints.txt -e '.[dev,serve,browser]'\n",
    ("tests/test_install.py",),
  ),
  M(
    "from_workdir_default_latest_checkpoint",
    "Translator.from_workdir takes the latest checkpoint by default where t2t-translate takes"
    " the one chosen on dev: README's Python snippet gives other lines than its command",
    "t2t_jax/decoding/translator.py",
    '    workdir: str,\n    checkpoint_spec: str = "auto",\n',
    '    workdir: str,\n    checkpoint_spec: str = "latest",\n',
    ("tests/test_readme.py",),
  ),
  M(
    "readme_speed_figure_not_in_record",
    "README's speed table shows a figure its cited record entry does not hold",
    "README.md",
    "| 156.0 |",
    "| 165.0 |",
    ("tests/test_readme.py",),
  ),
  M(
    "kept_params_key_without_checkpoints",
    "kept parameters are keyed without the checkpoint files: a new checkpoint reads the old",
    KEPT,
    "    *_tree_listing(run.checkpoint_dir),\n",
    "",
    KEPT_TESTS,
  ),
  M(
    "kept_params_key_without_choice",
    "kept parameters are keyed without the --checkpoint choice: average:5 reads latest's",
    KEPT,
    "    spec,\n    _shapes_text(params_like),\n",
    "    _shapes_text(params_like),\n",
    KEPT_TESTS,
  ),
  M(
    "kept_params_shapes_unchecked",
    "a kept entry of other shapes is used as it is",
    KEPT,
    "if not _fits(kept.params, params_like) or len(kept.vocab_sha256)",
    "if len(kept.vocab_sha256)",
    KEPT_TESTS,
  ),
  M(
    "kept_params_never_read",
    "kept parameters are written but never read: every start restores through orbax",
    KEPT,
    "  kept = read(directory, digest, params_like)\n",
    "  kept = None\n",
    KEPT_TESTS,
  ),
  M(
    "kept_params_without_fingerprints",
    "kept parameters forget their vocabulary fingerprints: a swapped vocabulary translates",
    "t2t_jax/decoding/loading.py",
    "workdirs_lib.vocabulary_fingerprints(workdir, steps)",
    "[None] * len(steps)",
    KEPT_TESTS,
  ),
  M(
    "int8_ab_rows_unscaled",
    "tools/int8_ab.py's int8 layer forgets the rows' scale: its products are off by it",
    "tools/int8_ab.py",
    "  return acc.astype(jnp.float32) * row_scale * scale\n",
    "  return acc.astype(jnp.float32) * scale\n",
    ("tests/test_int8_ab.py",),
  ),
)
