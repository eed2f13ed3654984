"use strict";
// jaxcredit's credit viewer: reads the JSON in #data (jaxcredit.view.page) and renders one page
// of responses at a time. Data reach the DOM only as text nodes and attributes.

// Responses (or groups) per page: ?page_size=N in the page's address changes it.
const PAGE_SIZE = Number(new URLSearchParams(location.search).get("page_size")) || 20;
const POSITIVE = [26, 140, 70];   // credit > 0
const NEGATIVE = [200, 40, 40];   // credit < 0
const started = performance.now();
const DATA = JSON.parse(document.getElementById("data").textContent);
const $ = (id) => document.getElementById(id);
const state = {step: DATA.steps.length - 1, credit: null, other: null, pair: false,
               view: "groups", sort: "reward", page: 0, showPrompt: false,
               minReward: NaN, maxCorr: NaN, minEntropy: NaN};
const decoded = new Map();

function decode(b64, Type) {
  const text = atob(b64);
  const bytes = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
  return new Type(bytes.buffer);
}

function ranks(values) {
  const order = Array.from(values.keys()).sort((a, b) => values[a] - values[b]);
  const rank = new Float64Array(values.length);
  for (let i = 0; i < order.length;) {
    let j = i;
    while (j + 1 < order.length && values[order[j + 1]] === values[order[i]]) j++;
    for (let k = i; k <= j; k++) rank[order[k]] = (i + j) / 2;
    i = j + 1;
  }
  return rank;
}

// Spearman's rank correlation; 0 when either side is constant (no ranking to agree with).
function rankCorrelation(a, b) {
  if (a.length < 2) return 0;
  const ra = ranks(a), rb = ranks(b);
  const mean = (a.length - 1) / 2;
  let sab = 0, saa = 0, sbb = 0;
  for (let i = 0; i < a.length; i++) {
    const da = ra[i] - mean, db = rb[i] - mean;
    sab += da * db; saa += da * da; sbb += db * db;
  }
  return saa > 0 && sbb > 0 ? sab / Math.sqrt(saa * sbb) : 0;
}

function stepData(index) {
  if (decoded.has(index)) return decoded.get(index);
  const raw = DATA.steps[index];
  const s = {raw, credits: {}, scales: {}};
  for (const key of ["reward", "blp", "lp", "ent", "ratio"]) s[key] = decode(raw[key], Float32Array);
  for (const key of ["group", "sample", "pos", "id", "act", "text"]) s[key] = decode(raw[key], Int32Array);
  for (const [name, b64] of Object.entries(raw.credits)) s.credits[name] = decode(b64, Float32Array);
  s.responses = [];
  for (let i = 0; i < raw.tokens;) {
    let j = i;
    while (j < raw.tokens && s.group[j] === s.group[i] && s.sample[j] === s.sample[i]) j++;
    const actions = [];
    for (let k = i; k < j; k++) if (s.act[k]) actions.push(k);
    let entropy = 0;
    for (const k of actions) entropy += s.ent[k];
    s.responses.push({group: s.group[i], sample: s.sample[i], start: i, end: j, actions,
                      reward: s.reward[i], entropy: actions.length ? entropy / actions.length : 0});
    i = j;
  }
  decoded.set(index, s);
  return s;
}

function fmt(x) { return Number.isFinite(x) ? x.toFixed(4) : "\u2014"; }

function shown(text) {
  if (text === "") return "\u2205";
  return text.replace(/\t/g, "\u2192").replace(/\n/g, "\u21b5\n");
}

function colour(value, scale) {
  const t = scale > 0 ? Math.min(Math.abs(value) / scale, 1) : 0;
  const end = value >= 0 ? POSITIVE : NEGATIVE;
  const c = end.map((e) => Math.round(255 + (e - 255) * t));
  return `rgb(${c[0]}, ${c[1]}, ${c[2]})`;
}

// Each credit on its own scale, +-max |credit| over the step's actions (estimators differ in
// scale: GRPO's normalised advantages are O(1), exact advantages often O(0.1)).
function scaleOf(s, name) {
  if (!(name in s.scales)) {
    const credit = s.credits[name];
    let scale = 0;
    for (let k = 0; k < credit.length; k++) if (s.act[k]) scale = Math.max(scale, Math.abs(credit[k]));
    s.scales[name] = scale;
  }
  return s.scales[name];
}

function tokensElement(s, r, name) {
  const scale = scaleOf(s, name);
  const box = document.createElement("div");
  box.className = "tokens";
  box.dataset.credit = name;
  if (state.pair) {
    const caption = document.createElement("span");
    caption.className = "caption";
    caption.textContent = name;
    box.appendChild(caption);
  }
  const credit = s.credits[name];
  let seenAction = false;
  for (let k = r.start; k < r.end; k++) {
    seenAction = seenAction || s.act[k] === 1;
    if (!s.act[k] && !seenAction && !state.showPrompt) continue;
    const span = document.createElement("span");
    span.className = s.act[k] ? "tok" : "tok prompt";
    span.textContent = shown(DATA.texts[s.text[k]]);
    span.dataset.k = k;
    if (s.act[k]) {
      span.dataset.value = credit[k];
      span.style.background = colour(credit[k], scale);
    }
    box.appendChild(span);
  }
  return box;
}

function responseElement(s, r) {
  const row = document.createElement("div");
  row.className = state.pair ? "response pair" : "response";
  row.dataset.group = r.group;
  row.dataset.sample = r.sample;
  const meta = document.createElement("div");
  meta.className = "meta";
  const corr = state.other ? `  \u03c1 ${fmt(r.corr)}` : "";
  meta.textContent = `g${r.group} s${r.sample}  reward ${fmt(r.reward)}\nmean entropy ${fmt(r.entropy)}${corr}`;
  meta.style.whiteSpace = "pre";
  row.appendChild(meta);
  row.appendChild(tokensElement(s, r, state.credit));
  if (state.pair) row.appendChild(tokensElement(s, r, state.other));
  return row;
}

function promptText(s, r) {
  const parts = [];
  for (let k = r.start; k < r.end && !s.act[k]; k++) parts.push(DATA.texts[s.text[k]]);
  return parts.join(" ");
}

function selected(s) {
  const a = s.credits[state.credit], b = state.other ? s.credits[state.other] : null;
  for (const r of s.responses) {
    r.corr = b ? rankCorrelation(r.actions.map((k) => a[k]), r.actions.map((k) => b[k])) : NaN;
  }
  return s.responses.filter((r) =>
    !(r.reward < state.minReward) && !(r.corr > state.maxCorr) && !(r.entropy < state.minEntropy));
}

const SORTS = {
  reward: (a, b) => b.reward - a.reward,
  reward_low: (a, b) => a.reward - b.reward,
  disagreement: (a, b) => a.corr - b.corr,
  entropy: (a, b) => b.entropy - a.entropy,
};

function pager(count) {
  const pages = Math.max(1, Math.ceil(count / PAGE_SIZE));
  state.page = Math.min(state.page, pages - 1);
  for (const id of ["pages_top", "pages_bottom"]) {
    const nav = $(id);
    nav.replaceChildren();
    const button = (label, page) => {
      const b = document.createElement("button");
      b.textContent = label;
      b.disabled = page < 0 || page >= pages || page === state.page;
      b.onclick = () => { state.page = page; render(); };
      nav.appendChild(b);
    };
    button("\u2039 previous", state.page - 1);
    nav.appendChild(document.createTextNode(` page ${state.page + 1} of ${pages} `));
    button("next \u203a", state.page + 1);
  }
}

function render() {
  const s = stepData(state.step);
  const scale = scaleOf(s, state.credit);
  $("low").textContent = `\u2212${scale.toPrecision(3)}`;
  $("high").textContent = `+${scale.toPrecision(3)}`;
  $("other_scale").textContent = state.pair
    ? `(${state.credit}); ${state.other} \u00b1${scaleOf(s, state.other).toPrecision(3)}` : "";
  const responses = selected(s);
  const list = $("list");
  list.replaceChildren();
  let count;
  if (state.view === "groups") {
    const groups = new Map();
    for (const r of responses) {
      if (!groups.has(r.group)) groups.set(r.group, []);
      groups.get(r.group).push(r);
    }
    const keys = Array.from(groups.keys()).sort((a, b) => a - b);
    count = keys.length;
    pager(count);
    for (const g of keys.slice(state.page * PAGE_SIZE, (state.page + 1) * PAGE_SIZE)) {
      const members = groups.get(g).sort(SORTS.reward);  // best first, worst last
      const box = document.createElement("section");
      box.className = "group";
      box.dataset.group = g;
      const title = document.createElement("h2");
      const rewards = members.map((r) => r.reward.toFixed(2)).join(", ");
      title.textContent = `group ${g}  \u2014  rewards ${rewards}  \u2014  prompt: ${promptText(s, members[0])}`;
      box.appendChild(title);
      for (const r of members) box.appendChild(responseElement(s, r));
      list.appendChild(box);
    }
  } else {
    responses.sort(SORTS[state.sort]);
    count = responses.length;
    pager(count);
    for (const r of responses.slice(state.page * PAGE_SIZE, (state.page + 1) * PAGE_SIZE)) {
      list.appendChild(responseElement(s, r));
    }
  }
  $("summary").textContent =
    `step ${s.raw.step} (RL update ${s.raw.rl_step}, ${s.raw.file}): ${responses.length} of ` +
    `${s.responses.length} responses, ${s.raw.tokens} tokens; colour: ${state.credit} ` +
    `\u00b1${scale.toPrecision(3)}` +
    (state.pair ? ` | ${state.other} \u00b1${scaleOf(s, state.other).toPrecision(3)}` : "");
  document.body.dataset.rendered = String(Number(document.body.dataset.rendered || 0) + 1);
}

function options(select, values, chosen) {
  select.replaceChildren();
  for (const value of values) {
    const option = document.createElement("option");
    option.value = option.textContent = value;
    select.appendChild(option);
  }
  select.value = chosen;
}

function setUpCredits() {
  const names = Object.keys(DATA.steps[state.step].credits);
  if (!names.includes(state.credit)) state.credit = names[0];
  if (!names.includes(state.other)) state.other = names.includes("oracle") && state.credit !== "oracle"
    ? "oracle" : (names.find((n) => n !== state.credit) || null);
  options($("credit"), names, state.credit);
  options($("other"), names, state.other);
  $("pair").disabled = names.length < 2;
}

function tooltip(event) {
  const span = event.target.closest(".tok");
  const tip = $("tooltip");
  if (!span) { tip.style.display = "none"; return; }
  const s = stepData(state.step), k = Number(span.dataset.k);
  const lines = [`token ${JSON.stringify(DATA.texts[s.text[k]])}  id ${s.id[k]}  position ${s.pos[k]}`];
  if (s.act[k]) {
    lines.push(`behaviour logprob ${fmt(s.blp[k])}`, `logprob ${fmt(s.lp[k])}`,
               `entropy ${fmt(s.ent[k])}`, `ratio ${fmt(s.ratio[k])}`);
    for (const [name, credit] of Object.entries(s.credits)) lines.push(`${name} ${fmt(credit[k])}`);
  } else {
    lines.push("prompt token (not an action)");
  }
  tip.textContent = lines.join("\n");
  tip.style.display = "block";
  tip.style.left = `${Math.min(event.clientX + 12, window.innerWidth - 320)}px`;
  tip.style.top = `${event.clientY + 14}px`;
}

function number(id, key) {
  $(id).oninput = () => { state[key] = $(id).value === "" ? NaN : Number($(id).value); state.page = 0; render(); };
}

function start() {
  $("problems").textContent = DATA.problems.join("\n");
  if (!DATA.steps.length) {
    $("summary").textContent = "No readable export step.";
    return;
  }
  options($("step"), DATA.steps.map((s, i) => i), String(state.step));
  Array.from($("step").options).forEach((o, i) => { o.textContent = `${DATA.steps[i].step}`; });
  setUpCredits();
  $("bar").style.background =
    `linear-gradient(to right, ${colour(-1, 1)}, ${colour(0, 1)}, ${colour(1, 1)})`;
  $("step").onchange = () => { state.step = Number($("step").value); setUpCredits(); render(); };
  $("credit").onchange = () => { state.credit = $("credit").value; render(); };
  $("other").onchange = () => { state.other = $("other").value; render(); };
  $("pair").onchange = () => { state.pair = $("pair").checked; render(); };
  $("view").onchange = () => { state.view = $("view").value; state.page = 0; render(); };
  $("sort").onchange = () => { state.sort = $("sort").value; state.page = 0; render(); };
  $("show_prompt").checked = state.showPrompt;
  $("show_prompt").onchange = () => { state.showPrompt = $("show_prompt").checked; render(); };
  number("min_reward", "minReward");
  number("max_corr", "maxCorr");
  number("min_entropy", "minEntropy");
  $("list").addEventListener("mouseover", tooltip);
  $("list").addEventListener("mouseleave", () => { $("tooltip").style.display = "none"; });
  render();
  document.body.dataset.loadMs = String(Math.round(performance.now() - started));
}

start();
