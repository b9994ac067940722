"""`t2t-serve` itself: the command on a trained tiny workdir (tests/export_support), one
process for the module, spoken to over HTTP as a LibreTranslate client would.

Its answers must be the Translator's own (the same workdir loaded here), whatever body the
fields came in and whatever other requests they were batched with; keys are required when
a keys file is given; bad input is answered 4xx and the server goes on; SIGTERM lets the
request in flight finish and exits 0.
"""

import concurrent.futures
import re
import signal

import pytest

from tests import export_support
from tests import serve_support as ss

# The trained workdir is tests/export_support's (about a minute of training, made once per run
# and shared with the export tests); the quick loop checks the same rules over a stand-in
# model (test_serve_http.py, test_serve_api.py).
pytestmark = pytest.mark.slow

KEY = "test-key-1"
SENTENCES = ["3 1 4 1 5", "9 2 6 5 3 5 8", "7 9", "2 7 1 8 2 8 1 8 2 8 4 5", "6 6 6 1"]


@pytest.fixture(scope="module")
def workdir():
  return export_support.tiny_workdir()


@pytest.fixture(scope="module")
def server(workdir, tmp_path_factory):
  pytest.importorskip("starlette")
  pytest.importorskip("uvicorn")
  keys = tmp_path_factory.mktemp("serve") / "keys"
  keys.write_text(f"# test keys\n{KEY}\nother-key\n")
  port = ss.free_port()
  proc = ss.start_serve(
    workdir,
    port,
    f"--workdir=de:en={workdir}",  # a second pair: the same model under another name
    f"--api_keys={keys}",
    "--metrics",
    "--batch_window_ms=20",
    "--beam_size=4",
  )
  try:
    ss.wait_for(port, "/ready", proc=proc)
    yield proc, port
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()


@pytest.fixture(scope="module")
def expected(workdir):
  """The Translator's own translations and 3-best of SENTENCES (beam 4)."""
  from t2t_jax.translate import Translator

  translator = Translator.from_workdir(workdir, "latest")
  best = translator.translate(SENTENCES, search=translator.search.override(beam_size=4))
  nbest = translator.translate(SENTENCES, nbest=3, search=translator.search.override(beam_size=4))
  return best, nbest


def translate(port, **fields):
  return ss.translate(port, api_key=KEY, **fields)


def test_answers_are_the_translators_in_every_body_kind(server, expected):
  _, port = server
  best, _ = expected
  for sentence, want in zip(SENTENCES, best):
    assert translate(port, q=sentence).json == {"translatedText": want}
  form = f"q={SENTENCES[1].replace(' ', '+')}&source=en&target=de&api_key={KEY}"
  as_form = ss.call(port, "POST", "/translate", form, "application/x-www-form-urlencoded")
  assert as_form.json == {"translatedText": best[1]}
  assert ss.call(port, "POST", "/translate?" + form).json == {"translatedText": best[1]}


def test_list_and_lines_come_back_in_place(server, expected):
  _, port = server
  best, _ = expected
  q = [SENTENCES[0], "", f"{SENTENCES[2]}\n\n{SENTENCES[3]}"]
  answer = translate(port, q=q).json
  assert answer == {"translatedText": [best[0], "", f"{best[2]}\n\n{best[3]}"]}


def test_alternatives_are_the_translators_nbest(server, expected):
  _, port = server
  _, nbest = expected
  answer = translate(port, q=SENTENCES[1], alternatives=2).json
  hyps = [h.text for h in nbest[1]]
  assert answer["translatedText"] == hyps[0]
  assert answer["alternatives"] == [h for h in dict.fromkeys(hyps[1:]) if h != hyps[0]]


def test_an_answer_does_not_depend_on_what_it_was_batched_with(server, expected):
  """... and a burst of plain requests of 1 to 12 tokens, batched in every row count,
  compiles nothing: every batch is padded to a shape compiled before /ready."""
  _, port = server
  best, _ = expected
  before = _batches(port)
  compiled = _metric(port, "t2t_serve_compilations")
  others = [" ".join(str((i * k) % 16) for k in range(1 + i % 12)) for i in range(24)]
  with concurrent.futures.ThreadPoolExecutor(len(others) + 1) as pool:
    mine = pool.submit(translate, port, q=SENTENCES[3])
    theirs = [pool.submit(translate, port, q=[o, SENTENCES[0]]) for o in others]
    assert mine.result().json == {"translatedText": best[3]}
    for t in theirs:
      assert t.result().json["translatedText"][1] == best[0]
  batches, requests = (a - b for a, b in zip(_batches(port), before))
  assert batches < requests  # some requests did share a batch
  assert _metric(port, "t2t_serve_compilations") == compiled


def _metric(port, name):
  text = ss.call(port, "GET", "/metrics").body.decode()
  return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))


def _batches(port):
  return _metric(port, "t2t_serve_batches"), _metric(port, "t2t_serve_batched_requests")


def test_a_fresh_server_compiles_nothing_after_ready(workdir):
  """The fresh-server benchmark: a new process with an empty compilation cache, 16
  requests from 4 clients from /ready on: none waits for a compilation."""
  from t2t_jax.bench import serve_fresh

  out = serve_fresh.measure_fresh(workdir, clients=(4,), requests=16)
  (row,) = out["fresh"]
  assert row["clients"] == 4 and row["requests"] == 16 and row["ready_s"] > 0
  assert row["compilations_at_ready"] > 0 and row["compilations_after_ready"] == 0
  assert row["requests_per_batch"] > 1
  assert "after ready" in serve_fresh.table(out)


def test_keys_and_bad_input(server, expected):
  _, port = server
  best, _ = expected
  assert ss.translate(port, q="1 2").status == 400
  assert ss.translate(port, q="1 2", api_key="wrong").json == {"error": "Invalid API key"}
  for sent, status in [
    (("{not json", "application/json"), 400),
    ((b"q=\xff\xfe&api_key=" + KEY.encode(), "application/x-www-form-urlencoded"), 400),
  ]:
    assert ss.call(port, "POST", "/translate", *sent).status == status
  assert translate(port, q="1 2", target="fr").status == 400
  assert translate(port, q="1 " * 3000).status == 400
  assert translate(port, q=SENTENCES[0]).json == {"translatedText": best[0]}
  assert ss.call(port, "GET", "/languages").json[0]["targets"] == ["de"]


def test_two_pairs_in_one_process_each_compiled_before_ready_with_its_memory(server, expected):
  _, port = server
  assert ss.call(port, "GET", "/languages").json == [
    {"code": "en", "name": "English", "targets": ["de"]},
    {"code": "de", "name": "German", "targets": ["en"]},
  ]
  for source, target in (("en", "de"), ("de", "en")):
    answer = ss.translate(port, q=SENTENCES, source=source, target=target, api_key=KEY)
    assert answer.json["translatedText"] == expected[0], (source, target)
  metrics = ss.call(port, "GET", "/metrics").body.decode()
  sizes = dict(re.findall(r't2t_serve_model_bytes\{pair="(\S+)"\} (\S+)', metrics))
  assert sizes.keys() == {"en-de", "de-en"} and all(float(v) > 0 for v in sizes.values())


def test_sigterm_finishes_the_request_in_flight_and_exits_0(server, expected):
  proc, port = server
  best, _ = expected
  many = "\n".join(SENTENCES * 20)
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    pending = pool.submit(translate, port, q=many)
    while not _in_flight(port):
      pass
    proc.send_signal(signal.SIGTERM)
    answer = pending.result()
  assert answer.status == 200
  assert answer.json["translatedText"].split("\n") == best * 20
  assert proc.wait(120) == 0


def _in_flight(port) -> bool:
  text = ss.call(port, "GET", "/metrics").body.decode()
  line = next(line for line in text.splitlines() if line.startswith("t2t_serve_waiting_requests "))
  return float(line.split()[1]) > 0
