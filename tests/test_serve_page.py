"""The page's endpoints' bounds, over stand-in models (tests/serve_support.FakeModel): any
number of lines translates, the first `attention_lines` get a map and the others null with a
note; each map is every layer's mean over its heads cut to serve.page.MAX_PIECES pieces a
side, so an answer's size does not grow with its lines; POST /api/attention gives one line's
map and one layer's heads; the maps are shaped in the model's thread and written off the
event loop. The page itself in a browser: tests/test_serve_browser.py."""

import json
import threading

import pytest

from tests import serve_support as ss
from tests.serve_support import call


class Layered(ss.FakeModel):
  """FakeModel with `layers` x `heads` maps whose head h gives source piece h its weight
  (so the heads differ and their mean is known)."""

  def __init__(self, layers: int = 3, heads: int = 2, **kw) -> None:
    super().__init__(**kw)
    self.layers, self.heads = layers, heads

  def attention(self, source: str, target: str) -> dict:
    src, tgt = source.split() + ["</s>"], target.split() + ["</s>"]

    def head(h: int) -> list:
      return [[1.0 if s == h % len(src) else 0.0 for s in range(len(src))]] * len(tgt)

    cross = [[head(h) for h in range(self.heads)] for _ in range(self.layers)]
    return dict(source_tokens=src, target_tokens=tgt, cross=cross)


@pytest.fixture(scope="module")
def port():
  pytest.importorskip("starlette")
  pytest.importorskip("uvicorn")
  from t2t_jax.serve.api import Limits

  models = [Layered(pair="en-de"), Layered(layers=1, heads=4, pair="de-en", mark="deen:")]
  with ss.in_process(models, limits=Limits(char_limit=60000)) as port:
    yield port


def page_translate(port, **fields):
  answer = call(port, "POST", "/api/translate", fields)
  assert answer.status == 200, answer.body
  return answer


def test_the_maps_are_each_layers_head_mean_cut_to_size():
  from t2t_jax.serve import page

  model = Layered(layers=2, heads=4)
  found = model.attention("a b c", "x y")
  att = page.line_attention(found, max_pieces=3)
  assert att["source_tokens"] == ["a", "b", "c"] and att["target_tokens"] == ["x", "y", "</s>"]
  assert att["heads"] == 4 and att["pieces"] == [3, 4]
  # heads 0..3 put their weight on sources 0, 1, 2, 3: the mean is 0.25 on each
  assert att["layers"] == [[[0.25] * 3] * 3] * 2
  assert att["note"] == "attention shown for the first 3 of 4 source pieces"
  assert "layer_heads" not in att
  one = page.line_attention(found, max_pieces=3, layer=1)
  assert one["layer"] == 1 and one["layer_heads"][3] == [[0.0] * 3] * 3
  assert one["layer_heads"][0] == [[1.0, 0.0, 0.0]] * 3
  assert page.line_attention(found)["note"] is None
  from t2t_jax.serve import api

  with pytest.raises(api.ApiError, match="layer 2 .the model has 2 layers"):
    page.line_attention(found, layer=2)
  assert page.lines_note(16, 16) is None
  assert page.lines_note(20, 16) == "attention shown for the first 16 lines (20 lines translated)"
  assert page.lines_note(3, 0) == "no attention shown (3 lines translated)"


def test_any_number_of_lines_translates_the_first_sixteen_with_maps(port):
  lines = [f"w{i} x" for i in range(20)] + ["", "  "] + [f"v{i}" for i in range(30)]
  answer = page_translate(port, q="\n".join(lines)).json
  got = answer["lines"]
  assert [line["translation"] for line in got] == [
    ss.FakeModel().answer(line) if line.strip() else "" for line in lines
  ]
  mapped = [i for i, line in enumerate(got) if line["attention"] is not None]
  assert mapped == list(range(16))
  assert answer["attention_note"] == "attention shown for the first 16 lines (50 lines translated)"
  first = got[0]["attention"]
  assert first["target_tokens"] == ["x", "0w", "</s>"] and first["source_tokens"] == [
    "w0",
    "x",
    "</s>",
  ]
  assert first["heads"] == 2 and len(first["layers"]) == 3
  assert first["layers"][0] == [[0.5, 0.5, 0.0]] * 3
  few = page_translate(port, q="\n".join(lines[:16])).json
  assert few["attention_note"] is None and all(line["attention"] for line in few["lines"])
  off = page_translate(port, q="\n".join(lines), attention=False).json
  assert off["attention_note"] is None
  assert all(line["attention"] is None for line in off["lines"])


def test_a_long_line_has_a_bounded_map(port):
  from t2t_jax.serve import page

  long = " ".join(f"w{i}" for i in range(511))  # 512 pieces with </s>
  answer = page_translate(port, q="\n".join([long] * 20))
  att = answer.json["lines"][0]["attention"]
  side = page.MAX_PIECES
  assert len(att["source_tokens"]) == len(att["target_tokens"]) == side
  assert att["pieces"] == [512, 512]
  assert [len(att["layers"]), len(att["layers"][0]), len(att["layers"][0][0])] == [3, side, side]
  assert att["note"] == (
    f"attention shown for the first {side} of 512 target pieces and the first {side} of 512 "
    "source pieces"
  )
  # what one such line's attention was before: every layer x head x target x source
  full = json.dumps(Layered().attention(long, ss.FakeModel().answer(long)))
  assert len(full) > 4_000_000
  # 16 maps of 3 layers of 64 x 64 (and 20 lines of text): well under one line's full map
  assert len(answer.body) < 16 * 3 * side * side * 8 + 100_000 < len(full) / 4


def test_attention_for_one_line_and_one_layers_heads(port):
  def attention(**fields):
    return call(port, "POST", "/api/attention", fields)

  one = attention(q="ab cd", translation="dc ba")
  assert one.status == 200, one.body
  assert one.json["layers"] == [[[0.5, 0.5, 0.0]] * 3] * 3 and "layer_heads" not in one.json
  heads = attention(q="ab cd", translation="dc ba", layer=2).json
  assert heads["layer"] == 2 and heads["layer_heads"][1] == [[0.0, 1.0, 0.0]] * 3
  other = attention(q="ab cd", translation="x", source="de", target="en", layer=0).json
  assert len(other["layers"]) == 1 and len(other["layer_heads"]) == 4  # de-en's model
  long = " ".join(f"w{i}" for i in range(300))
  cut = attention(q=long, translation=long, layer=0).json
  assert len(cut["layer_heads"][0]) == len(cut["layer_heads"][0][0]) == 64
  assert attention(q="ab", translation="", layer=0).json["target_tokens"] == ["</s>"]
  for fields, message in (
    (dict(q="ab", translation="b", layer=3), "layer 3 (the model has 3 layers)"),
    (dict(q="ab", translation="b", layer=-1), "layer must be a layer number"),
    (dict(q="ab", translation="b", layer=True), "layer must be a layer number"),
    (dict(q="ab", translation="b", layer="1"), "layer must be a layer number"),
    (dict(q="ab"), "q and translation must be strings"),
    (dict(q="a\nb", translation="b"), "one non-blank line"),
    (dict(q=" ", translation="b"), "one non-blank line"),
    (dict(q="ab", translation="x" * 60001), "exceeds text limit (60000)"),
    (dict(q="ab", translation="b", source="de", target="de"), "not available"),
  ):
    refused = attention(**fields)
    assert refused.status == 400 and message in refused.json["error"], (fields, refused.body)


def test_the_page_pair_picks_the_model_of_the_maps(port):
  got = page_translate(port, q="ab cd", source="de", target="en").json["lines"][0]
  assert got["translation"] == "deen:dc ba"
  assert got["attention"]["heads"] == 4 and len(got["attention"]["layers"]) == 1


def test_a_smaller_attention_lines_and_none():
  pytest.importorskip("uvicorn")
  from t2t_jax.serve.api import Limits

  for cap, mapped, note in (
    (2, 2, "attention shown for the first 2 lines (5 lines translated)"),
    (0, 0, "no attention shown (5 lines translated)"),
    (-1, 5, None),
  ):
    with ss.in_process(ss.FakeModel(), limits=Limits(attention_lines=cap)) as port:
      answer = page_translate(port, q="a\nb\nc\nd\ne").json
      assert sum(line["attention"] is not None for line in answer["lines"]) == mapped
      assert answer["attention_note"] == note


def test_the_maps_are_shaped_in_a_batching_thread_and_written_off_the_loop(port, monkeypatch):
  from t2t_jax.serve import page

  threads: dict[str, set[str]] = {"shape": set(), "json": set(), "loop": set()}
  shape, write, note = page.line_attention, page.json_body, page.lines_note

  def shaped(*args, **kw):
    threads["shape"].add(threading.current_thread().name)
    return shape(*args, **kw)

  def written(content):
    threads["json"].add(threading.current_thread().name)
    return write(content)

  def noted(*args):  # page_translate calls it on the loop
    threads["loop"].add(threading.current_thread().name)
    return note(*args)

  monkeypatch.setattr(page, "lines_note", noted)
  monkeypatch.setattr(page, "line_attention", shaped)
  monkeypatch.setattr(page, "json_body", written)
  page_translate(port, q="ab\ncd")
  assert call(port, "POST", "/api/attention", dict(q="ab", translation="b", layer=0)).status == 200
  assert len(threads["shape"]) == 1 and next(iter(threads["shape"])).startswith("t2t-serve-model-")
  # the loop's default executor, neither the loop's own thread nor the model's
  assert len(threads["loop"]) == 1 and threads["json"]
  assert not threads["json"] & (threads["loop"] | threads["shape"])
