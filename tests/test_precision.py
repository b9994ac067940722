"""The compute dtype of decoding (decoding.precision): which dtype --dtype=auto picks, and that
the dtype chosen is the one the Translator and t2t-translate decode in."""

import numpy as np
import pytest

from t2t_jax.decoding import precision
from tests import support

FLAGS_AMX = "fpu vme sse avx512f amx_bf16 amx_tile amx_int8 avx512_fp16"
FLAGS_AVX512_BF16 = "fpu vme sse avx2 avx512f avx512_bf16 avx512_vnni"
FLAGS_PLAIN = "fpu vme sse avx2 avx512f avx512_vnni avx512_fp16"


def _cpuinfo(tmp_path, flags: str | None, extra: str = "") -> str:
  path = tmp_path / "cpuinfo"
  lines = ["processor\t: 0", "model name\t: Some CPU", extra]
  if flags is not None:
    lines.append(f"flags\t\t: {flags}")
  lines.append("bugs\t\t: spectre_v1")
  path.write_text("\n".join(lines) + "\n")
  return str(path)


@pytest.mark.parametrize(
  "flags, extra, expected",
  [
    (FLAGS_AMX, "", True),
    (FLAGS_AVX512_BF16, "", True),
    (FLAGS_PLAIN, "", False),  # AVX-512 without its bfloat16 dot products
    (None, "", False),  # no flags line at all (not x86)
    (FLAGS_PLAIN, "vmx flags\t: amx_bf16", False),  # only the flags line counts
    ("fpu amx_bf16x amx_tile avx512_bf16_", "", False),  # whole flags, not substrings
  ],
)
def test_cpu_multiplies_bf16_reads_the_flags_line(tmp_path, flags, extra, expected):
  assert precision.cpu_multiplies_bf16(_cpuinfo(tmp_path, flags, extra)) is expected


def test_cpu_multiplies_bf16_is_false_where_cpuinfo_is_unreadable(tmp_path):
  assert precision.cpu_multiplies_bf16(str(tmp_path / "missing")) is False


@pytest.mark.parametrize(
  "requested, config_dtype, platform, flags, expected",
  [
    ("auto", "float32", "cpu", FLAGS_AMX, "bfloat16"),
    ("auto", "float32", "cpu", FLAGS_AVX512_BF16, "bfloat16"),
    ("auto", "float32", "cpu", FLAGS_PLAIN, "float32"),
    ("auto", "bfloat16", "cpu", FLAGS_PLAIN, "float32"),  # converted bfloat16 is slower
    ("auto", "bfloat16", "gpu", FLAGS_PLAIN, "bfloat16"),  # an accelerator keeps the model's
    ("auto", "float32", "tpu", FLAGS_AMX, "float32"),
    ("float32", "float32", "cpu", FLAGS_AMX, "float32"),
    ("bfloat16", "float32", "cpu", FLAGS_PLAIN, "bfloat16"),
  ],
)
def test_decode_dtype_rule(
  tmp_path, monkeypatch, requested, config_dtype, platform, flags, expected
):
  monkeypatch.delenv(precision.ENV, raising=False)
  cpuinfo = _cpuinfo(tmp_path, flags)
  assert precision.decode_dtype(requested, config_dtype, platform, cpuinfo) == expected


def test_the_environment_pins_what_auto_picks_and_bad_values_are_named(tmp_path, monkeypatch):
  amx = _cpuinfo(tmp_path, FLAGS_AMX)
  monkeypatch.setenv(precision.ENV, "float32")
  assert precision.decode_dtype("auto", "float32", "cpu", amx) == "float32"
  assert precision.decode_dtype("bfloat16", "float32", "cpu", amx) == "bfloat16"
  monkeypatch.setenv(precision.ENV, "bfloat16")
  assert precision.decode_dtype("auto", "float32", "gpu", amx) == "bfloat16"
  monkeypatch.setenv(precision.ENV, "fp16")
  with pytest.raises(ValueError, match=r"^\$T2T_DECODE_DTYPE='fp16': use float32 or bfloat16"):
    precision.decode_dtype("auto", "float32", "cpu", amx)
  with pytest.raises(ValueError, match="dtype 'half': use one of auto, float32, bfloat16"):
    precision.decode_dtype("half", "float32", "cpu", amx)


def _scores(translator, lines):
  return np.array([hyps[0].score for hyps in translator.translate(lines, nbest=1)])


@pytest.fixture(scope="module")
def workdir_and_lines():
  from t2t_jax import data
  from t2t_jax.decoding.translator import load_config

  workdir = support.small_trained_workdir()
  pairs = data.get_datasets(load_config(workdir).data, workdir).test_pairs[:12]
  return workdir, [s for s, _ in pairs]


def test_bfloat16_decoding_scores_follow_float32_within_bfloat16_rounding(workdir_and_lines):
  """Translator.from_workdir(dtype='bfloat16') decodes with bfloat16 products: its scores
  differ from float32's (so the products really are bfloat16), by no more than bfloat16's
  rounding of a few products allows."""
  import jax.numpy as jnp

  from t2t_jax.decoding.translator import Translator

  workdir, lines = workdir_and_lines
  f32 = Translator.from_workdir(workdir, dtype="float32")
  bf16 = Translator.from_workdir(workdir, dtype="bfloat16")
  assert f32.model.config.dtype == jnp.float32 and bf16.model.config.dtype == jnp.bfloat16
  assert Translator.from_workdir(workdir).model.config.dtype == jnp.float32  # the config's
  a, b = _scores(f32, lines), _scores(bf16, lines)
  assert not np.array_equal(a, b)
  np.testing.assert_allclose(b, a, rtol=0.05, atol=0.05)


def test_t2t_translate_decodes_in_the_dtype_auto_picks(workdir_and_lines, tmp_path, monkeypatch):
  """--dtype=auto (the default) decodes in bfloat16 on a CPU that multiplies bfloat16 in
  hardware and in float32 on one that does not; --dtype=float32 overrides it. Checked
  through the written scores, against the Translator's in each dtype."""
  from t2t_jax.decoding.translator import Translator
  from tests.test_sampling import _translate

  workdir, lines = workdir_and_lines
  source = tmp_path / "in.txt"
  source.write_text("".join(s + "\n" for s in lines))
  expected = {
    d: _scores(Translator.from_workdir(workdir, dtype=d), lines) for d in ("float32", "bfloat16")
  }
  monkeypatch.delenv(precision.ENV, raising=False)
  for amx, flag, dtype in [
    (True, [], "bfloat16"),
    (False, [], "float32"),
    (True, ["--dtype=float32"], "float32"),
  ]:
    monkeypatch.setattr(precision, "cpu_multiplies_bf16", lambda cpuinfo="", amx=amx: amx)
    output = tmp_path / f"out_{amx}_{len(flag)}.txt"
    _translate(
      monkeypatch,
      f"--workdir={workdir}",
      "--scores",
      f"--input={source}",
      f"--output={output}",
      *flag,
    )
    written = [float(line.split("\t")[0]) for line in output.read_text().splitlines()]
    np.testing.assert_allclose(written, expected[dtype], rtol=1e-4, err_msg=(amx, flag))


def test_t2t_serve_decodes_in_the_dtype_its_flag_names(workdir_and_lines, monkeypatch):
  """t2t-serve's --dtype reaches the server's Translator; its default is auto's choice."""
  import jax.numpy as jnp

  from t2t_jax.serve import worker

  workdir, lines = workdir_and_lines
  monkeypatch.delenv(precision.ENV, raising=False)
  monkeypatch.setattr(precision, "cpu_multiplies_bf16", lambda cpuinfo="": True)
  for settings, dtype in [
    (worker.ModelSettings(workdirs=(workdir,)), jnp.bfloat16),
    (worker.ModelSettings(workdirs=(workdir,), dtype="float32"), jnp.float32),
  ]:
    model = worker.Model(settings)
    model.load()
    assert model._translator.model.config.dtype == dtype
    assert len(model.translate(lines[:2])) == 2


def test_a_bad_environment_pin_is_one_line_from_t2t_translate(workdir_and_lines, monkeypatch):
  from tests.test_sampling import _translate

  workdir, _ = workdir_and_lines
  monkeypatch.setenv(precision.ENV, "fp16")
  with pytest.raises(SystemExit) as e:
    _translate(monkeypatch, f"--workdir={workdir}", "--input=/dev/null")
  assert str(e.value) == "t2t-translate: $T2T_DECODE_DTYPE='fp16': use float32 or bfloat16"


def test_the_translator_searches_with_decoding_params_made_once(workdir_and_lines, monkeypatch):
  """Translator.decoder() hands the search `decoding_params` of the Translator's parameters,
  made once and again when they are replaced; translations and scores are those of a search
  over the parameters themselves (beam and greedy, bfloat16 and float32)."""
  import jax.numpy as jnp

  from t2t_jax.decoding import translator as translator_lib
  from t2t_jax.model.layers import OUTPUT_KERNEL

  workdir, lines = workdir_and_lines
  for dtype in ("bfloat16", "float32"):
    tr = translator_lib.Translator.from_workdir(workdir, dtype=dtype)
    params, _ = tr.decoder()
    assert tr.decoder()[0] is params
    assert params["embed"][OUTPUT_KERNEL].dtype == jnp.dtype(dtype)
    wi = params["decoder"]["layer_0"]["ffn"]["wi"]["kernel"]
    assert wi.dtype == jnp.dtype(dtype)
    got = [tr.translate(lines, nbest=1, search=tr.search.override(beam_size=b)) for b in (4, 1)]
    with monkeypatch.context() as m:
      m.setattr(translator_lib, "decoding_params", lambda p, config: p)
      plain = translator_lib.Translator.from_workdir(workdir, dtype=dtype)
      want = [
        plain.translate(lines, nbest=1, search=plain.search.override(beam_size=b)) for b in (4, 1)
      ]
      assert OUTPUT_KERNEL not in plain.decoder()[0]["embed"]
    for g, w in zip(got, want):
      assert [h[0].text for h in g] == [h[0].text for h in w], dtype
      np.testing.assert_allclose([h[0].score for h in g], [h[0].score for h in w], rtol=1e-5)

  halved = {**tr.params, "embed": {"embedding": tr.params["embed"]["embedding"] / 2}}
  tr.params = halved
  replaced, _ = tr.decoder()
  np.testing.assert_array_equal(replaced["embed"][OUTPUT_KERNEL], halved["embed"]["embedding"].T)
