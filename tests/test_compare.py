"""t2t-compare against sacreBLEU's own command line on the same files: paired bootstrap and
approximate randomization, scores, confidence intervals, p-values and signatures; a copy of
the baseline gets p = 1; the command's output and refusals."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from t2t_jax.evaluation import scoring, significance

WORDS = [
  "der",
  "die",
  "das",
  "ein",
  "Hund",
  "Katze",
  "läuft",
  "über",
  "die",
  "Wiese",
  "rot-blau",
  "Mann",
  "Frau",
  "sitzt",
  "auf",
  "Bank",
]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _write(path, lines):
  path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
  return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  """A 60-line reference and three systems that replace 45%, 30% and 35% of its words at
  random (.de: the language tokenized BLEU uses)."""
  root = tmp_path_factory.mktemp("compare")
  rng = np.random.default_rng(0)
  refs = [" ".join(rng.choice(WORDS, size=rng.integers(4, 11))) for _ in range(60)]

  def noisy(rate):
    return [
      " ".join(w if rng.random() > rate else str(rng.choice(WORDS)) for w in r.split())
      for r in refs
    ]

  paths = {"ref": _write(root / "ref.de", refs)}
  for name, rate in (("a", 0.45), ("b", 0.3), ("c", 0.35)):
    paths[name] = _write(root / f"{name}.de", noisy(rate))
  return paths


def _read(path):
  with open(path, encoding="utf-8") as f:
    return f.read().splitlines()


def _sacrebleu_table(ref, systems, *options):
  """{(system file, column): [numbers in its cells]} from `sacrebleu REF -i SYSTEMS ...
  -f text -w 4` (the table's cells: score, mean, CI, then the p-value's row)."""
  out = subprocess.run(
    [sys.executable, "-m", "sacrebleu", ref, "-i", *systems, "-f", "text", "-w", "4", *options],
    capture_output=True,
    text=True,
    check=True,
    env=dict(os.environ, SACREBLEU_SEED="12345"),
  ).stdout
  table, name = {}, None
  for line in ANSI.sub("", out).splitlines():
    cells = [c.strip() for c in line.split("│")[1:-1]]
    if not cells or cells[0] == "System":
      continue
    name = cells[0].removeprefix("Baseline: ") or name
    for column, cell in enumerate(cells[1:]):
      table.setdefault((name, column), []).extend(float(x) for x in re.findall(r"\d+\.\d+", cell))
  signatures = re.findall(r"^ - (\S+)\s+(nrefs:\S+)$", out, re.M)
  return table, signatures


def _ours(files, names, lang=None, **options):
  """significance.compare on the files `names` (the first the baseline), its defaults unless
  `options` (method, samples) say otherwise."""
  named = [(files[n], _read(files[n])) for n in names]
  return significance.compare(named[0], named[1:], _read(files["ref"]), lang, **options)


def _assert_equal_figures(comparison, table, column):
  for r in comparison.results:
    want = table[(r.name, column)]
    got = [r.score] + ([r.mean, r.ci] if r.mean is not None else [])
    got += [r.p_value] if r.p_value is not None else []
    np.testing.assert_allclose(got, want, atol=5.1e-5, err_msg=f"{comparison.label} {r.name}")


def test_paired_bootstrap_equals_sacrebleus_command(files):
  """sacreBLEU and chrF: every score, bootstrap mean, 95% CI and p-value of
  `sacrebleu REF -i A B C -m bleu chrf --paired-bs` (1000 resamples, seed 12345), and the
  signatures."""
  names = ["a", "b", "c"]
  table, signatures = _sacrebleu_table(
    files["ref"], [files[n] for n in names], "-m", "bleu", "chrf", "--paired-bs"
  )
  ours = _ours(files, names)
  assert [c.label for c in ours] == [scoring.SACREBLEU_LABEL, scoring.CHRF_LABEL]
  for column, comparison in enumerate(ours):
    _assert_equal_figures(comparison, table, column)
    assert comparison.signature == "|".join(signatures[column])
  assert "bs:1000|seed:12345" in ours[0].signature
  assert ours[0].results[1].p_value < 0.05  # 45% against 30% of the words replaced


def test_tokenized_bleu_equals_sacrebleu_on_the_tokenized_files(files, tmp_path):
  """Tokenized BLEU's test is sacreBLEU's unsmoothed, untokenizing BLEU on the files that
  `scoring.tokenize_for_bleu` makes."""
  names = ["a", "c"]
  tokenized = {
    n: _write(tmp_path / f"{n}.tok", [" ".join(scoring.tokenize_for_bleu(x)) for x in _read(p)])
    for n, p in files.items()
    if n in names + ["ref"]
  }
  table, _ = _sacrebleu_table(
    tokenized["ref"], [tokenized[n] for n in names], "-tok", "none", "-s", "none", "--paired-bs"
  )
  original = {tokenized[n]: files[n] for n in names}
  table = {(original[name], column): v for (name, column), v in table.items()}
  (comparison,) = [c for c in _ours(files, names, lang="de") if "tokenized" in c.label]
  _assert_equal_figures(comparison, table, 0)
  assert "tok:moses-de+compound-split|smooth:none" in comparison.signature


def test_approximate_randomization_equals_sacrebleus_command(files):
  """--paired-ar with 2000 trials: the scores and p-values of sacreBLEU's command."""
  names = ["a", "b"]
  table, _ = _sacrebleu_table(
    files["ref"], [files[n] for n in names], "-m", "bleu", "--paired-ar", "--paired-ar-n", "2000"
  )
  (bleu, _) = _ours(files, names, method="ar", samples=2000)
  _assert_equal_figures(bleu, table, 0)


def test_a_system_compared_with_itself_has_p_one(files, tmp_path):
  """A copy of the baseline (another file, the same lines): p = 1 for every metric, and the
  same score; sacreBLEU's own count of strictly larger differences says 1/1001 there."""
  copy = _write(tmp_path / "copy.de", _read(files["a"]))
  files = dict(files, copy=copy)
  for comparison in _ours(files, ["a", "copy", "b"], lang="de"):
    base, same, other = comparison.results
    assert same.p_value == 1.0 and same.score == base.score
    assert other.p_value < 1.0
  table, _ = _sacrebleu_table(files["ref"], [files["a"], copy], "-m", "bleu", "--paired-bs")
  assert table[(copy, 0)][-1] == pytest.approx(1 / 1001, abs=1e-4)


def _compare_command(*args):
  return subprocess.run(
    [sys.executable, "-m", "t2t_jax.cli.compare", *args], capture_output=True, text=True
  )


def test_command_prints_every_metric_and_marks_significance(files):
  result = _compare_command(f"--reference={files['ref']}", files["a"], files["b"])
  assert result.returncode == 0, result.stderr
  out = result.stdout
  for label in (scoring.SACREBLEU_LABEL, scoring.CHRF_LABEL, scoring.TOKENIZED_BLEU_LABEL):
    assert label in out
  rows = [line for line in out.splitlines() if files["b"] in line]
  assert len(rows) == 3 and all(re.search(r"p = 0\.00\d\d \*$", row) for row in rows), rows
  assert re.search(r"baseline\s+\S+a\.de\s+\d+\.\d\d\s+\(\s*\d+\.\d\d ±", out)


def test_command_refusals(files, tmp_path):
  short = _write(tmp_path / "short.de", _read(files["a"])[:10])
  cases = {
    (f"--reference={files['ref']}", files["a"]): "give a baseline and at least one system",
    (files["a"], files["b"]): "--reference is required",
    (f"--reference={files['ref']}", files["a"], short): f"{short} has 10 lines but the "
    "reference has 60",
    (f"--reference={files['ref']}", files["a"], str(tmp_path / "no.de")): "no.de: cannot read",
  }
  for args, message in cases.items():
    result = _compare_command(*args)
    assert result.returncode != 0
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr
