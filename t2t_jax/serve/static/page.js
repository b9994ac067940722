// The t2t-serve page: translate as the user types (debounced) or on Translate / Ctrl+Enter,
// show the n-best with scores and the encoder-decoder attention of the translation shown
// (POST /api/translate). Everything it needs is served by t2t-serve itself.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { settings: null, lines: [], timer: null, inFlight: null, sent: "" };

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

async function loadSettings() {
  const response = await fetch("/frontend/settings");
  const settings = await response.json();
  state.settings = settings;
  const { source, target } = settings.language;
  $("pair").textContent = `${source.name} (${source.code}) \u2192 ${target.name} (${target.code})`;
  $("source").maxLength = settings.charLimit > 0 ? settings.charLimit : 1 << 20;
  const alternatives = [["0", "none"]];
  for (let k = 1; k <= settings.alternativesLimit; k++) alternatives.push([String(k), String(k)]);
  fillSelect($("nbest"), alternatives);
  $("key-box").hidden = !settings.apiKeys;
}

function scheduleTranslate() {
  clearTimeout(state.timer);
  const wait = state.settings ? state.settings.frontendTimeout : 500;
  state.timer = setTimeout(() => translate(false), wait);
}

async function translate(force) {
  clearTimeout(state.timer);
  const q = $("source").value;
  const request = { q, alternatives: Number($("nbest").value), attention: true };
  if (!$("key-box").hidden) request.api_key = $("api-key").value;
  const key = JSON.stringify(request);
  if (!q.trim()) {
    showError("");
    render([]);
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
    render(answer.lines);
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

function render(lines) {
  state.lines = lines;
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
  const mapped = lines.map((l, i) => [l, i]).filter(([l]) => l.attention);
  $("attention").hidden = mapped.length === 0;
  if (!mapped.length) return;
  fillSelect($("line"), mapped.map(([l, i]) => [String(i), `${i + 1}: ${l.source.slice(0, 40)}`]));
  $("line-box").hidden = mapped.length < 2;
  const cross = lines[Number($("line").value)].attention.cross;
  const layers = [["avg", "average"]].concat(cross.map((_, i) => [String(i), String(i + 1)]));
  fillSelect($("layer"), layers);
  const heads = [["avg", "average"]].concat(cross[0].map((_, i) => [String(i), String(i + 1)]));
  fillSelect($("head"), heads);
  drawHeatmap();
}

// [target][source] weights of the chosen layer and head, or their mean.
function chosenMatrix(cross) {
  const layer = $("layer").value;
  const head = $("head").value;
  const layers = layer === "avg" ? cross : [cross[Number(layer)]];
  const picked = [];
  for (const heads of layers) {
    for (const m of head === "avg" ? heads : [heads[Number(head)]]) picked.push(m);
  }
  return picked[0].map((row, t) =>
    row.map((_, s) => picked.reduce((sum, m) => sum + m[t][s], 0) / picked.length)
  );
}

function drawHeatmap() {
  const line = state.lines[Number($("line").value)];
  if (!line || !line.attention) return;
  const { source_tokens: src, target_tokens: tgt, cross } = line.attention;
  const matrix = chosenMatrix(cross);
  const table = $("heatmap");
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
      td.setAttribute("aria-label", td.title);
      tr.append(td);
    });
    return tr;
  });
  const thead = document.createElement("thead");
  thead.append(head);
  const tbody = document.createElement("tbody");
  tbody.append(...rows);
  table.replaceChildren(caption, thead, tbody);
}

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
$("nbest").addEventListener("change", () => translate(false));
$("line").addEventListener("change", () => render(state.lines));
$("layer").addEventListener("change", drawHeatmap);
$("head").addEventListener("change", drawHeatmap);
loadSettings().catch((e) => showError(`settings: ${e.message}`));
