// The t2t-serve page: pick a served language pair, translate as the user types (debounced) or
// on Translate / Ctrl+Enter, show the n-best with scores and the encoder-decoder attention of
// the translation shown (POST /api/translate; one layer's heads, or a line the answer has no
// map for, from POST /api/attention). Everything it needs is served by t2t-serve itself.
"use strict";

const $ = (id) => document.getElementById(id);
const PAIR_KEY = "t2t-serve.pair";
const state = {
  settings: null,
  ready: false,
  languages: [], // GET /languages: [{code, name, targets}]
  lines: [], // the answer's lines; a line's `heads` caches its layers' heads
  pair: null, // the pair the lines were translated with
  timer: null,
  inFlight: null,
  sent: "",
  draw: 0, // the latest drawing: a fetch answered after a newer choice is not drawn
  cell: [0, 0], // the heat map's keyboard cell (target row, source column)
};

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

function fillSelect(select, options) {
  const old = select.value;
  select.replaceChildren(
    ...options.map(([value, label]) => new Option(label, value, false, value === old))
  );
}

async function getJSON(path, body) {
  const init = body === undefined ? {} : {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  };
  const response = await fetch(path, init);
  const answer = await response.json();
  if (!response.ok) throw new Error(answer.error || `HTTP ${response.status}`);
  return answer;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// ---- settings, readiness and the language pair

function applySettings(settings) {
  state.settings = settings;
  $("source").maxLength = settings.charLimit > 0 ? settings.charLimit : 1 << 20;
  const alternatives = [["0", "none"]];
  for (let k = 1; k <= settings.alternativesLimit; k++) alternatives.push([String(k), String(k)]);
  fillSelect($("nbest"), alternatives);
  $("key-box").hidden = !settings.apiKeys;
}

// Until GET /ready answers 200 (the models are loaded and compiled); a model that could not
// be loaded is shown as the error it is.
async function waitReady() {
  for (;;) {
    try {
      const response = await fetch("/ready");
      if (response.ok) return;
      const answer = await response.json();
      if (/could not be loaded/.test(answer.error || "")) throw new Error(answer.error);
      $("status").textContent = "the model is loading\u2026";
    } catch (e) {
      if (/could not be loaded/.test(e.message)) throw e;
      $("status").textContent = "waiting for the server\u2026";
    }
    await sleep(500);
  }
}

async function start() {
  let settings = await getJSON("/frontend/settings");
  applySettings(settings);
  if (!settings.ready) {
    $("status").textContent = "the model is loading\u2026";
    await waitReady();
    settings = await getJSON("/frontend/settings"); // alternativesLimit is known once ready
    applySettings(settings);
  }
  state.languages = await getJSON("/languages");
  const { source, target } = settings.language;
  fillLanguages(wantedPair() || { source: source.code, target: target.code });
  state.ready = true;
  $("source-lang").disabled = $("target-lang").disabled = $("translate").disabled = false;
  $("status").textContent = "";
  if ($("source").value.trim()) translate(false);
}

const nameOf = (code) => (state.languages.find((l) => l.code === code) || { name: code }).name;
const targetsOf = (code) => (state.languages.find((l) => l.code === code) || { targets: [] }).targets;
const served = (pair) => !!pair && targetsOf(pair.source).includes(pair.target);

function chosenPair() {
  return { source: $("source-lang").value, target: $("target-lang").value };
}

// The pair the URL's hash names (#source=de&target=en), else the one kept in localStorage,
// when it is served.
function wantedPair() {
  const hash = new URLSearchParams(location.hash.slice(1));
  const fromHash = { source: hash.get("source"), target: hash.get("target") };
  if (served(fromHash)) return fromHash;
  try {
    const kept = JSON.parse(localStorage.getItem(PAIR_KEY) || "null");
    if (kept && served(kept)) return kept;
  } catch (e) {
    // no storage (a private window) or a value that is not ours: the default pair
  }
  return null;
}

function fillLanguages(pair) {
  const sources = state.languages.filter((l) => l.targets.length);
  fillSelect($("source-lang"), sources.map((l) => [l.code, `${l.name} (${l.code})`]));
  if (pair) $("source-lang").value = pair.source;
  fillTargets(pair && pair.target);
}

// The targets of the chosen source only; the old target stays chosen when it is one.
function fillTargets(target) {
  const targets = targetsOf($("source-lang").value);
  fillSelect($("target-lang"), targets.map((code) => [code, `${nameOf(code)} (${code})`]));
  if (target && targets.includes(target)) $("target-lang").value = target;
  pairChosen();
}

function pairChosen() {
  const { source, target } = chosenPair();
  $("swap").hidden = !served({ source: target, target: source });
  $("pair").textContent = `${nameOf(source)} (${source}) \u2192 ${nameOf(target)} (${target})`;
  const hash = "#" + new URLSearchParams({ source, target });
  if (location.hash !== hash) history.replaceState(null, "", hash);
  try {
    localStorage.setItem(PAIR_KEY, JSON.stringify({ source, target }));
  } catch (e) {
    // no storage: the hash keeps the choice
  }
}

function swap() {
  const { source, target } = chosenPair();
  const translation = $("translation").textContent;
  fillLanguages({ source: target, target: source });
  if (translation.trim()) $("source").value = translation;
  translate(false);
}

// ---- translating

function scheduleTranslate() {
  clearTimeout(state.timer);
  const wait = state.settings ? state.settings.frontendTimeout : 500;
  state.timer = setTimeout(() => translate(false), wait);
}

function withKey(request) {
  if (!$("key-box").hidden) request.api_key = $("api-key").value;
  return request;
}

async function translate(force) {
  clearTimeout(state.timer);
  if (!state.ready) return; // start() translates what is typed once the model is ready
  const q = $("source").value;
  const pair = chosenPair();
  const request = withKey({ q, ...pair, alternatives: Number($("nbest").value), attention: true });
  const key = JSON.stringify(request);
  if (!q.trim()) {
    showError("");
    render({ lines: [] }, pair);
    return;
  }
  if (!force && key === state.sent) return;
  state.sent = key;
  if (state.inFlight) state.inFlight.abort();
  const controller = new AbortController();
  state.inFlight = controller;
  $("status").textContent = "translating\u2026";
  try {
    const response = await fetch("/api/translate", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: key,
      signal: controller.signal,
    });
    const answer = await response.json();
    if (!response.ok) throw new Error(answer.error || `HTTP ${response.status}`);
    showError("");
    render(answer, pair);
    $("status").textContent = "";
  } catch (e) {
    if (e.name === "AbortError") return;
    state.sent = "";
    $("status").textContent = "";
    showError(e.message);
  } finally {
    if (state.inFlight === controller) state.inFlight = null;
  }
}

function render(answer, pair) {
  const lines = answer.lines;
  state.lines = lines;
  state.pair = pair;
  $("translation").textContent = lines.map((l) => l.translation).join("\n");
  const items = [];
  const wanted = Number($("nbest").value);
  if (wanted > 0) {
    lines.forEach((line, i) => {
      line.nbest.forEach((h, rank) => {
        const li = document.createElement("li");
        li.textContent = (lines.length > 1 ? `line ${i + 1}, ${rank + 1}: ` : "") + h.text;
        const score = document.createElement("span");
        score.className = "score";
        score.textContent = `score ${h.score.toFixed(3)}, log p ${h.log_prob.toFixed(3)}`;
        li.append(score);
        items.push(li);
      });
    });
  }
  $("alternatives").replaceChildren(...items);
  // Every translated line can be shown: those the answer has no map for load on demand.
  const translated = lines.map((l, i) => [l, i]).filter(([l]) => l.nbest.length > 0);
  const note = answer.attention_note;
  $("attention-note").textContent = note ? `${note}; pick another line to load its map.` : "";
  $("attention-note").hidden = !note;
  $("attention").hidden = !translated.length;
  if (!translated.length) return;
  const first = translated.find(([l]) => l.attention) || translated[0];
  const old = $("line").value;
  fillSelect($("line"), translated.map(([l, i]) => [String(i), `${i + 1}: ${l.source.slice(0, 40)}`]));
  if (!lines[Number(old)] || !lines[Number(old)].attention) $("line").value = String(first[1]);
  $("line-box").hidden = translated.length < 2;
  showLine();
}

// The attention of one line (`layer`: also that layer's heads) through POST /api/attention.
function fetchAttention(line, layer) {
  const { source, target } = state.pair;
  const request = { q: line.source, translation: line.translation, source, target };
  if (layer !== undefined) request.layer = layer;
  return getJSON("/api/attention", withKey(request));
}

async function showLine() {
  const line = state.lines[Number($("line").value)];
  if (!line) return;
  if (!line.attention) {
    $("status").textContent = "loading the attention\u2026";
    try {
      line.attention = await fetchAttention(line);
    } catch (e) {
      showError(e.message);
      return;
    } finally {
      $("status").textContent = "";
    }
    if (state.lines[Number($("line").value)] !== line) return; // another line or answer since
  }
  const att = line.attention;
  const count = (n) => Array.from({ length: n }, (_, i) => [String(i), String(i + 1)]);
  fillSelect($("layer"), [["avg", "average"]].concat(count(att.layers.length)));
  fillSelect($("head"), [["avg", "average"]].concat(count(att.heads)));
  $("map-note").textContent = att.note ? `${att.note}.` : "";
  $("map-note").hidden = !att.note;
  drawHeatmap();
}

const mean = (maps) => maps[0].map((row, t) =>
  row.map((_, s) => maps.reduce((sum, m) => sum + m[t][s], 0) / maps.length)
);

// [target][source] weights of the chosen layer and head: the answer has each layer's mean
// over its heads; one layer's heads are fetched when a head is chosen (and kept).
async function chosenMatrix(line, token) {
  const att = line.attention;
  const layer = $("layer").value;
  $("head").disabled = layer === "avg"; // the heads of one layer at a time
  if (layer === "avg") {
    $("head").value = "avg";
    return mean(att.layers);
  }
  const head = $("head").value;
  if (head === "avg") return att.layers[Number(layer)];
  line.heads = line.heads || {};
  if (!line.heads[layer]) {
    $("status").textContent = "loading the heads\u2026";
    try {
      line.heads[layer] = (await fetchAttention(line, Number(layer))).layer_heads;
    } finally {
      $("status").textContent = "";
    }
  }
  return token === state.draw ? line.heads[layer][Number(head)] : null;
}

async function drawHeatmap() {
  const token = ++state.draw;
  const line = state.lines[Number($("line").value)];
  if (!line || !line.attention) return;
  let matrix;
  try {
    matrix = await chosenMatrix(line, token);
  } catch (e) {
    showError(e.message);
    return;
  }
  if (!matrix || token !== state.draw) return;
  const { source_tokens: src, target_tokens: tgt } = line.attention;
  const table = $("heatmap");
  table.setAttribute("aria-label", "attention weights: rows are target pieces, columns source pieces");
  const caption = document.createElement("caption");
  caption.className = "hint";
  caption.textContent = `Attention of ${tgt.length} target pieces (rows) on ${src.length} source pieces (columns)`;
  const head = document.createElement("tr");
  head.append(document.createElement("th"));
  for (const piece of src) {
    const th = document.createElement("th");
    th.scope = "col";
    th.textContent = piece;
    head.append(th);
  }
  const [ct, cs] = [Math.min(state.cell[0], tgt.length - 1), Math.min(state.cell[1], src.length - 1)];
  state.cell = [ct, cs];
  const rows = tgt.map((piece, t) => {
    const tr = document.createElement("tr");
    const th = document.createElement("th");
    th.scope = "row";
    th.textContent = piece;
    tr.append(th);
    matrix[t].forEach((w, s) => {
      const td = document.createElement("td");
      td.style.background = `rgba(26, 95, 180, ${Math.min(1, w).toFixed(3)})`;
      td.title = `${piece} \u2190 ${src[s]}: ${w.toFixed(3)}`;
      td.dataset.t = t;
      td.dataset.s = s;
      td.tabIndex = t === ct && s === cs ? 0 : -1;
      td.setAttribute("aria-label", cellText(piece, src[s], w));
      tr.append(td);
    });
    return tr;
  });
  const thead = document.createElement("thead");
  thead.append(head);
  const tbody = document.createElement("tbody");
  tbody.append(...rows);
  table.replaceChildren(caption, thead, tbody);
  $("cell-value").textContent = "";
}

function cellText(target, source, weight) {
  return `target ${target}, source ${source}: weight ${weight.toFixed(3)}`;
}

// The heat map as a grid: one cell in the Tab order, the arrow keys move between cells and
// the cell's value is read out (its label, and the live line under the map).
function cellAt(t, s) {
  return $("heatmap").querySelector(`td[data-t="${t}"][data-s="${s}"]`);
}

function readCell(td) {
  $("cell-value").textContent = td.getAttribute("aria-label");
}

function onGridKey(e) {
  const td = e.target.closest("td[data-t]");
  if (!td) return;
  const rows = $("heatmap").tBodies[0].rows.length;
  const cols = $("heatmap").tBodies[0].rows[0].cells.length - 1;
  let [t, s] = [Number(td.dataset.t), Number(td.dataset.s)];
  const moves = {
    ArrowUp: () => (t = Math.max(0, t - 1)),
    ArrowDown: () => (t = Math.min(rows - 1, t + 1)),
    ArrowLeft: () => (s = Math.max(0, s - 1)),
    ArrowRight: () => (s = Math.min(cols - 1, s + 1)),
    Home: () => (s = 0),
    End: () => (s = cols - 1),
  };
  if (!moves[e.key]) return;
  e.preventDefault();
  moves[e.key]();
  const next = cellAt(t, s);
  td.tabIndex = -1;
  next.tabIndex = 0;
  next.focus();
}

$("heatmap").addEventListener("keydown", onGridKey);
$("heatmap").addEventListener("focusin", (e) => {
  const td = e.target.closest("td[data-t]");
  if (!td) return;
  state.cell = [Number(td.dataset.t), Number(td.dataset.s)];
  readCell(td);
});
$("heatmap").addEventListener("mouseover", (e) => {
  const td = e.target.closest("td[data-t]");
  if (td) readCell(td);
});

$("form").addEventListener("submit", (e) => {
  e.preventDefault();
  translate(true);
});
$("source").addEventListener("input", scheduleTranslate);
$("source").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
    e.preventDefault();
    translate(true);
  }
});
$("source-lang").addEventListener("change", () => {
  fillTargets($("target-lang").value);
  translate(false);
});
$("target-lang").addEventListener("change", () => {
  pairChosen();
  translate(false);
});
$("swap").addEventListener("click", swap);
window.addEventListener("hashchange", () => {
  const pair = wantedPair();
  const now = chosenPair();
  if (!state.ready || !pair || (pair.source === now.source && pair.target === now.target)) return;
  fillLanguages(pair);
  translate(false);
});
$("nbest").addEventListener("change", () => translate(false));
$("line").addEventListener("change", showLine);
$("layer").addEventListener("change", drawHeatmap);
$("head").addEventListener("change", drawHeatmap);
start().catch((e) => {
  $("status").textContent = "";
  showError(`settings: ${e.message}`);
});
