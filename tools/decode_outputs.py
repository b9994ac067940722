"""Writes what one source tree of t2t_jax decodes for a file in every search mode, as JSON,
so that two versions (a git worktree of an older commit, say, and this one) can be compared
output for output, scores included:

    python tools/decode_outputs.py TREE WORKDIR INPUT OUTPUT.json [--parsing | --quick]
        [--cache=DIR] [--dtype=float32|bfloat16]
    cmp OLD.json NEW.json

Modes: beam (4), greedy, the 4-best list with scores, seeded sampling (plain and with
top-k/top-p, 3 samples each with scores), prefix-forced beam, greedy and 2-best (each
sentence's prefix: the first two tokens of its greedy output), an ensemble of the model
with itself, diverse beam search (2 groups, 2-best), beam and greedy search without a
repeated 2-gram, and `translate_stream`. With --parsing only beam and greedy, which a parsing
workdir decodes under its tree constraint; with --quick beam, greedy, the 4-best list and
seeded sampling only. It also prints the programs the first beam pass
compiled. --dtype: the Translator's dtype (default: the workdir config's). The
persistent caches are off unless --cache=DIR turns them on there: run twice with one DIR,
the second process decodes with the programs the first stored.
"""

import json
import os
import sys


def main(
  tree: str,
  workdir: str,
  input_path: str,
  output: str,
  parsing: bool = False,
  quick: bool = False,
  cache: str = "",
  dtype: str | None = None,
) -> None:
  sys.path.insert(0, os.path.abspath(tree))
  os.environ["T2T_COMPILATION_CACHE"] = cache or "off"
  import jax

  jax.config.update("jax_compilation_cache_dir", "")
  import t2t_jax

  if cache:
    from t2t_jax import compilation

    compilation.enable(cache)

  if not t2t_jax.__file__.startswith(os.path.abspath(tree)):
    raise SystemExit(f"t2t_jax imported from {t2t_jax.__file__}, not from {tree}")
  from t2t_jax.translate import Translator

  compiles = [0]

  def listen(event: str, duration: float, **kwargs: object) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
      compiles[0] += 1

  jax.monitoring.register_event_duration_secs_listener(listen)
  with open(input_path, encoding="utf-8") as f:
    lines = [line.rstrip("\n") for line in f]
  tr = Translator.from_workdir(workdir, "latest", dtype)
  hyps = lambda found: [[[h.text, repr(h.score), repr(h.log_prob)] for h in s] for s in found]
  beam, greedy = tr.search.override(beam_size=4), tr.search.override(beam_size=1)
  sampling = lambda **fields: tr.search.override(beam_size=1, sampling=True, **fields)
  out = {"beam": tr.translate(lines, search=beam)}
  out["first_pass_programs"] = compiles[0]
  out["greedy"] = tr.translate(lines, search=greedy)
  if not parsing:
    out["nbest"] = hyps(tr.translate(lines, nbest=4, search=beam))
    out["greedy_scores"] = hyps(tr.translate(lines, nbest=1, search=greedy))
    out["sample"] = hyps(
      tr.translate(lines, nbest=3, search=sampling(num_samples=3, sampling_seed=7))
    )
  if not parsing and not quick:
    cut = sampling(num_samples=3, sampling_seed=3, sampling_topk=5, sampling_topp=0.9)
    out["sample_cut"] = hyps(tr.translate(lines, nbest=3, search=cut))
    prefixes = [" ".join(g.split()[:2]) for g in out["greedy"]]
    out["prefix_beam"] = tr.translate(lines, search=beam, prefixes=prefixes)
    out["prefix_greedy"] = tr.translate(lines, search=greedy, prefixes=prefixes)
    out["prefix_nbest"] = hyps(tr.translate(lines, nbest=2, search=beam, prefixes=prefixes))
    diverse = beam.override(diverse_groups=2)
    out["diverse"] = hyps(tr.translate(lines, nbest=2, search=diverse))
    out["no_repeat_beam"] = tr.translate(lines, search=beam.override(no_repeat_ngram=2))
    out["no_repeat_greedy"] = tr.translate(lines, search=greedy.override(no_repeat_ngram=2))
    pair = Translator.from_workdirs([workdir, workdir], "latest", dtype)
    out["ensemble"] = hyps(pair.translate(lines[:40], nbest=2, search=beam))
    out["stream"] = list(tr.translate_stream(lines[:20], search=beam))
  with open(output, "w", encoding="utf-8") as f:
    json.dump({k: v for k, v in out.items() if k != "first_pass_programs"}, f, indent=0)
  print(json.dumps({"tree": tree, "first_pass_programs": out["first_pass_programs"]}))


if __name__ == "__main__":
  options = sys.argv[5:]
  caches = [o.split("=", 1)[1] for o in options if o.startswith("--cache=")]
  dtypes = [o.split("=", 1)[1] for o in options if o.startswith("--dtype=")]
  valued = {f"--cache={c}" for c in caches} | {f"--dtype={d}" for d in dtypes}
  if len(sys.argv) < 5 or set(options) - {"--parsing", "--quick"} - valued:
    raise SystemExit(__doc__)
  main(
    *sys.argv[1:5],
    parsing="--parsing" in options,
    quick="--quick" in options,
    cache=caches[-1] if caches else "",
    dtype=dtypes[-1] if dtypes else None,
  )
