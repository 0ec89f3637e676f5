// The console's pages, routed by the URL hash:
//   #/                                  the run queue (reorder, remove) and runs (start, pause, resume, stop)
//   #/runs/<id>                         a run: live curves, config, adapter versions
//   #/runs/<id>/episodes?kind=&step=&solved=&seed=   its episodes
//   #/runs/<id>/episodes/<episode id>   one episode, turn by turn (arrow keys step)
//   #/runs/<id>/compare?seed=&a=&b=     one eval task at two steps side by side

import * as api from "./api.js";
import { lineChart } from "./chart.js";

const page = document.getElementById("page");
let leave = new AbortController(); // aborted when the page changes: timers, streams, key handlers

function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v, { signal: leave.signal });
    else if (v !== false && v != null) node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children.flat()) if (child != null) node.append(child);
  return node;
}

// replaceChildren without the null and false children that conditional parts leave.
function fill(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c != null && c !== false));
}

const pct = (v) => (v == null ? "–" : `${(100 * v).toFixed(1)}%`);
const num = (v, digits = 3) => (v == null ? "–" : String(+Number(v).toFixed(digits)));
const when = (t) => new Date(t * 1000).toLocaleString();
const ending = (e) => (e.end || (e.solved ? "solved" : "not solved")).replace("_", " ");
const runPath = (id) => `/v1/runs/${encodeURIComponent(id)}`;
const link = (hash, text) => h("a", { href: hash }, text);

function badge(text, kind = text) {
  return h("span", { class: `badge badge-${kind}` }, text);
}

function showError(error) {
  if (error instanceof api.Unauthorized) return askToken();
  if (error.name === "AbortError") return;
  page.prepend(h("p", { class: "error" }, String(error.message || error)));
}

function askToken() {
  const form = document.getElementById("token-form");
  form.hidden = false;
  document.getElementById("token-input").focus();
}

document.getElementById("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  api.setToken(document.getElementById("token-input").value.trim());
  event.target.hidden = true;
  route();
});
document.getElementById("forget-token").addEventListener("click", () => { api.setToken(""); route(); });

// Runs --------------------------------------------------------------------------------------------
async function act(run, action, after) {
  if (action === "stop" && !confirm(run.state === "queued" ? `Remove run ${run.id} from the queue? It will be stopped.`
    : `Stop run ${run.id}? A stopped run cannot be resumed.`)) return;
  try { await api.post(`${runPath(run.id)}/${action}`); after(); } catch (e) { showError(e); }
}

function controls(run, after) {
  const live = ["pending", "running"].includes(run.state);
  return h("span", { class: "controls" },
    live ? h("button", { onclick: () => act(run, "pause", after) }, "Pause") : null,
    ["paused", "failed"].includes(run.state) ? h("button", { onclick: () => act(run, "resume", after) }, "Resume") : null,
    live || ["paused", "queued"].includes(run.state)
      ? h("button", { class: "danger", onclick: () => act(run, "stop", after) }, "Stop") : null);
}

const state = (run) => [badge(run.state),
  run.queue_position ? h("div", { class: "sub" }, `#${run.queue_position} in the queue`) : null,
  run.desired ? h("div", { class: "sub" }, `${run.desired} requested`) : null];

// The queue in the order its runs will start: move a run up or down (its priority), or remove it.
function queueTable(queued, after) {
  const move = async (run, by) => {
    try { await api.patch(runPath(run.id), { priority: run.priority + by }); after(); } catch (e) { showError(e); }
  };
  if (!queued.length) return h("p", { class: "sub", id: "queue-empty" }, "No run is waiting: a new run starts on a free learner pool.");
  return h("table", { class: "queue" }, h("thead", {}, h("tr", {},
    ...["#", "Run", "Priority", "Tenant", "Queued", ""].map((t) => h("th", {}, t)))),
  h("tbody", {}, ...queued.map((run) => h("tr", { "data-run": run.id },
    h("td", { class: "num" }, String(run.queue_position)),
    h("td", {}, link(`#/runs/${run.id}`, run.name), h("div", { class: "sub" }, run.id)),
    h("td", { class: "num" }, String(run.priority), " ",
      h("button", { title: "Raise its priority", onclick: () => move(run, 1) }, "▲"),
      h("button", { title: "Lower its priority", onclick: () => move(run, -1) }, "▼")),
    h("td", {}, run.tenant),
    h("td", {}, when(run.updated_at)),
    h("td", {}, h("button", { class: "danger", onclick: () => act(run, "stop", after) }, "Remove"))))));
}

async function runsPage() {
  const table = h("tbody");
  const queue = h("section", { id: "queue" });
  const refresh = async () => {
    const [{ runs }, { runs: queued }] = await Promise.all([api.get("/v1/runs"), api.get("/v1/runs", { state: "queued" })]);
    fill(queue, h("h2", {}, `Queue (${queued.length})`), queueTable(queued, refresh));
    fill(table, ...runs.reverse().map((run) => h("tr", {},
      h("td", {}, link(`#/runs/${run.id}`, run.name), h("div", { class: "sub" }, run.id)),
      h("td", {}, state(run)),
      h("td", { class: "num" }, `${run.step} / ${run.steps}`),
      h("td", { class: "num" }, num(run.latest_metrics?.["reward/mean"])),
      h("td", { class: "num" }, pct(run.latest_eval?.greedy_solve_rate)),
      h("td", { class: "num" }, pct(run.latest_eval?.sampled_solve_rate)),
      h("td", {}, run.tenant, run.learner ? h("div", { class: "sub" }, run.learner) : null),
      h("td", {}, when(run.created_at)),
      h("td", {}, controls(run, refresh)))));
  };
  fill(page,
    h("h1", {}, "Runs"),
    queue,
    h("h2", {}, "All runs"),
    h("table", { class: "runs" }, h("thead", {}, h("tr", {},
      ...["Run", "State", "Step", "Reward", "Greedy solve", "Sampled solve", "Tenant / pool", "Created", ""]
        .map((t) => h("th", {}, t)))),
    table),
    startForm(refresh));
  await refresh();
  const timer = setInterval(() => refresh().catch(showError), 5000);
  leave.signal.addEventListener("abort", () => clearInterval(timer));
}

function startForm(refresh) {
  const preview = h("div", { class: "preview" });
  const file = h("input", { type: "file", accept: ".yaml,.yml,.toml", id: "config-file" });
  const check = async () => {
    const chosen = file.files[0];
    if (!chosen) return;
    const format = chosen.name.endsWith(".toml") ? "toml" : "yaml";
    try {
      const { config } = await api.post("/v1/configs/parse", { text: await chosen.text(), format });
      const start = async () => {
        try {
          const run = await api.post("/v1/runs", { config });
          location.hash = `#/runs/${run.id}`;
        } catch (e) { showError(e); }
      };
      fill(preview,
        h("p", {}, `${config.name}: ${config.steps} steps of ${config.grpo.tasks_per_step} x ${config.grpo.group_size} `
          + `episodes, model ${config.model}, priority ${config.priority}`),
        h("details", {}, h("summary", {}, "Resolved config"), h("pre", {}, JSON.stringify(config, null, 2))),
        h("button", { onclick: start }, "Start run"),
        h("span", { class: "sub" }, " (it waits in the queue while every learner pool is busy)"));
    } catch (e) {
      fill(preview, h("p", { class: "error" }, e.message));
    }
  };
  file.addEventListener("change", check, { signal: leave.signal });
  return h("section", { class: "start" }, h("h2", {}, "Start a run"),
    h("label", {}, "Run config file (YAML or TOML, as in configs/) ", file), preview);
}

// A run -------------------------------------------------------------------------------------------
async function runPage(runId) {
  const metrics = new Map(), evals = new Map();
  const header = h("div"), charts = h("div", { class: "charts" }), adapters = h("tbody");
  const config = h("pre");
  const [run] = await Promise.all([api.get(runPath(runId)), api.get(`${runPath(runId)}/metrics`)
    .then((r) => r.metrics.forEach((m) => metrics.set(m.step, m))), api.get(`${runPath(runId)}/evals`)
    .then((r) => r.evals.forEach((e) => evals.set(e.step, e)))]);
  const drawHeader = (run) => fill(header,
    h("h1", {}, run.name, " ", badge(run.state)),
    h("p", { class: "sub" }, `${run.id} · step ${run.step} of ${run.steps} · adapter v${run.adapter_version} · `
      + `checkpoint at step ${run.checkpoint_step} · created ${when(run.created_at)} · tenant ${run.tenant} · `
      + (run.queue_position ? `#${run.queue_position} in the queue, priority ${run.priority}`
        : `learner pool ${run.learner || "–"}`)),
    run.failure_reason ? h("p", { class: "error failure" }, run.failure_reason) : null,
    h("p", {}, controls(run, reloadRun), " ", link(`#/runs/${runId}/episodes`, "Episodes"), " · ",
      link(`#/runs/${runId}/compare`, "Compare eval steps")));
  const reloadRun = () => api.get(runPath(runId)).then(drawHeader).catch(showError);
  const reloadAdapters = async () => {
    const { adapters: versions } = await api.get(`${runPath(runId)}/adapters`);
    fill(adapters, ...versions.map((a) => h("tr", {}, h("td", { class: "num" }, `v${a.version}`),
      h("td", {}, a.created_at ? when(a.created_at) : "–"), h("td", { class: "num" }, `${(a.bytes / 1024).toFixed(1)} KiB`),
      h("td", {}, h("code", {}, a.path)))));
  };
  const drawCharts = () => {
    const steps = [...metrics.values()].sort((a, b) => a.step - b.step);
    const evalSteps = [...evals.values()].sort((a, b) => a.step - b.step);
    const series = (rows, key, name) => ({ name, points: rows.map((r) => [r.step, r[key] ?? null]) });
    const timeKeys = [...new Set(steps.flatMap((m) => Object.keys(m).filter((k) => k.startsWith("time/"))))].sort();
    fill(charts,
      lineChart([series(steps, "reward/mean", "reward"), series(steps, "train/solve_rate", "train solve")],
        { title: "Training reward and solve rate", yMin: 0, yMax: 1 }),
      lineChart([series(evalSteps, "greedy_solve_rate", "greedy"), series(evalSteps, "sampled_solve_rate", "sampled")],
        { title: "Eval solve rate", yMin: 0, yMax: 1 }),
      lineChart(timeKeys.map((k) => series(steps, k, k.slice(5, -2))), { title: "Step time (s)", yMin: 0 }));
  };
  config.textContent = JSON.stringify(run.config, null, 2);
  drawHeader(run);
  drawCharts();
  fill(page, header, charts,
    h("h2", {}, "Adapter versions"), h("table", {}, h("thead", {}, h("tr", {},
      ...["Version", "Published", "Size", "Path"].map((t) => h("th", {}, t)))), adapters),
    h("details", {}, h("summary", {}, "Config"), config));
  await reloadAdapters();
  api.followEvents(runId, (kind, data) => {
    if (kind === "step") { metrics.set(data.step, data); drawCharts(); reloadRun(); }
    else if (kind === "eval") { evals.set(data.step, data); drawCharts(); }
    else if (kind === "adapter") reloadAdapters().catch(showError);
    else if (kind === "state") reloadRun();
  }, leave.signal).catch(showError);
}

// Episodes ----------------------------------------------------------------------------------------
async function episodesPage(runId, query) {
  const filters = { kind: query.get("kind") || "", step: query.get("step") || "",
    solved: query.get("solved") || "", seed: query.get("seed") || "" };
  const { episodes } = await api.get(`${runPath(runId)}/episodes`, { ...filters, limit: 500 });
  const select = (name, options) => h("select", { name }, ...options.map(([value, text]) =>
    h("option", { value, selected: filters[name] === value }, text)));
  const form = h("form", { class: "filters", onsubmit: (event) => {
    event.preventDefault();
    const chosen = new URLSearchParams([...new FormData(event.target)].filter(([, v]) => v !== ""));
    location.hash = `#/runs/${runId}/episodes?${chosen}`;
  } },
  h("label", {}, "Kind ", select("kind", [["", "any"], ["train", "train"], ["eval", "eval"]])),
  h("label", {}, "Step ", h("input", { name: "step", type: "number", min: 0, value: filters.step })),
  h("label", {}, "Outcome ", select("solved", [["", "any"], ["true", "solved"], ["false", "not solved"]])),
  h("label", {}, "Task (seed) ", h("input", { name: "seed", type: "number", min: 0, value: filters.seed })),
  h("button", { type: "submit" }, "Filter"));
  fill(page,
    h("p", {}, link(`#/runs/${runId}`, `← run ${runId}`)), h("h1", {}, "Episodes"), form,
    h("p", { class: "sub" }, `${episodes.length} episodes${episodes.length === 500 ? " (the first 500)" : ""}`),
    h("table", { class: "episodes" }, h("thead", {}, h("tr", {},
      ...["Episode", "Step", "Kind", "Task", "Turns", "Reward", "Ended", "Invalid", "Adapter", "Frames"]
        .map((t) => h("th", {}, t)))),
    h("tbody", {}, ...episodes.map((e) => h("tr", {},
      h("td", {}, link(`#/runs/${runId}/episodes/${encodeURIComponent(e.id)}`, e.id)),
      h("td", { class: "num" }, e.step), h("td", {}, e.kind), h("td", { class: "num" }, e.seed),
      h("td", { class: "num" }, e.actions.length), h("td", { class: "num" }, num(e.reward, 2)),
      h("td", {}, badge(ending(e), e.end || (e.solved ? "solved" : "unsolved"))),
      h("td", { class: "num" }, (e.invalid_turns || []).filter(Boolean).length),
      h("td", { class: "num" }, `v${e.adapter_version}`), h("td", { class: "num" }, e.frames.length))))));
}

// Turn t (0-based) is what the agent saw and what it did; turn n (n = actions) is where it ended.
// An observation may have any number of images: `frame_turns[i]` is the turn of frame i (older
// records have none: one frame per turn).
function framesOfTurn(episode, t) {
  const turns = episode.frame_turns && episode.frame_turns.length ? episode.frame_turns : episode.frames.map((_, i) => i);
  return turns.flatMap((turn, i) => (turn === t ? [i] : []));
}

function turnCard(runId, episode, t, onpick) {
  const frames = framesOfTurn(episode, t).map((i, k) => {
    const frame = h("img", { alt: `turn ${t + 1} frame${k ? ` ${k + 1}` : ""}`, class: "frame" });
    api.frameUrl(`${runPath(runId)}/episodes/${encodeURIComponent(episode.id)}/frames/${i}`)
      .then((url) => { frame.src = url; }).catch(showError);
    return frame;
  });
  const frame = frames.length ? h("span", { class: "frames" }, ...frames)
    : h("span", { class: "frames no-image" }, "(text only)");
  const last = t === episode.actions.length;
  const invalid = !last && (episode.invalid_turns || [])[t];
  return h("figure", { class: `turn${invalid ? " invalid" : ""}`, "data-turn": t, onclick: () => onpick(t) },
    frame, h("figcaption", {}, last ? `end: ${ending(episode)}`
      : h("span", {}, `${t + 1}. `, h("code", {}, episode.actions[t].trim() || "(empty)"))));
}

function logprobText(values) {
  if (!values || !values.length) return "–";
  const total = values.reduce((a, b) => a + b, 0);
  return `${values.map((v) => v.toFixed(3)).join(", ")}  (sum ${total.toFixed(3)}, p = ${Math.exp(total).toFixed(3)})`;
}

function episodeSummary(e) {
  return h("dl", { class: "summary" },
    ...[["Step", `${e.step} (${e.kind})`], ["Task (seed)", e.seed], ["Reward", num(e.reward, 2)],
      ["Ended", ending(e)], ["Moves", `${e.moves ?? "–"} (optimal ${e.optimal_moves ?? "–"})`],
      ["Invalid actions", (e.invalid_turns || []).filter(Boolean).length], ["Adapter", `v${e.adapter_version}`]]
      .flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, String(v))]));
}

async function episodePage(runId, episodeId) {
  const episode = await api.get(`${runPath(runId)}/episodes/${encodeURIComponent(episodeId)}`);
  const n = episode.actions.length;
  const big = h("img", { class: "frame big", alt: "frame" });
  const detail = h("div", { class: "detail" });
  const cards = h("div", { class: "turns" });
  let current = 0;
  const show = (t) => {
    current = Math.max(0, Math.min(n, t));
    cards.querySelectorAll(".turn").forEach((card) => card.classList.toggle("current", +card.dataset.turn === current));
    const thumb = cards.querySelector(`[data-turn="${current}"] img`);
    big.src = thumb?.src || "";
    const last = current === n;
    fill(detail,
      h("h2", { id: "turn-title" }, last ? `End (after ${n} turns)` : `Turn ${current + 1} of ${n}`),
      last ? h("p", {}, `Ended: ${ending(episode)}, reward ${num(episode.reward, 2)}`)
        : h("div", {},
          h("p", {}, "Action: ", h("code", { class: "action" }, episode.actions[current])),
          (episode.invalid_turns || [])[current] ? h("p", { class: "error" }, "The env could not read this action.") : null,
          h("p", {}, "Log-prob per token: ", h("code", {}, logprobText((episode.logprobs || [])[current])))),
      h("p", { class: "sub" }, "← / → step through turns, Home / End jump."));
  };
  for (let t = 0; t <= n; t++) cards.append(turnCard(runId, episode, t, show));
  cards.querySelectorAll("img").forEach((img) => img.addEventListener("load", () => {
    const card = img.closest(".turn");
    if (+card.dataset.turn === current && card.querySelector("img") === img) big.src = img.src;
  }, { signal: leave.signal }));
  document.addEventListener("keydown", (event) => {
    const moves = { ArrowRight: current + 1, ArrowLeft: current - 1, Home: 0, End: n };
    if (event.key in moves && !["INPUT", "SELECT"].includes(event.target.tagName)) {
      event.preventDefault();
      show(moves[event.key]);
    }
  }, { signal: leave.signal });
  fill(page,
    h("p", {}, link(`#/runs/${runId}/episodes?step=${episode.step}&kind=${episode.kind}`, `← episodes of step ${episode.step}`)),
    h("h1", {}, `Episode ${episode.id}`), episodeSummary(episode),
    episode.frames.length ? null : h("p", { class: "sub" }, "No frames were kept for this episode (see frames.train in the run config)."),
    h("div", { class: "viewer" }, big, detail), cards);
  show(0);
}

// Compare -----------------------------------------------------------------------------------------
async function comparePage(runId, query) {
  const { episodes } = await api.get(`${runPath(runId)}/episodes`, { kind: "eval", limit: 10000 });
  const steps = [...new Set(episodes.map((e) => e.step))].sort((a, b) => a - b);
  const seeds = [...new Set(episodes.map((e) => e.seed))];
  const chosen = { seed: query.get("seed") ?? String(seeds[0] ?? ""), a: query.get("a") ?? String(steps[0] ?? ""),
    b: query.get("b") ?? String(steps[steps.length - 1] ?? "") };
  const select = (name, values, label) => h("label", {}, label, " ", h("select", { name, onchange: (event) => {
    location.hash = `#/runs/${runId}/compare?${new URLSearchParams({ ...chosen, [name]: event.target.value })}`;
  } }, ...values.map((v) => h("option", { value: v, selected: String(v) === chosen[name] }, String(v)))));
  const column = (step) => {
    const e = episodes.find((x) => String(x.step) === step && String(x.seed) === chosen.seed);
    if (!e) return h("div", { class: "column" }, h("p", {}, `No eval episode of this task at step ${step}.`));
    const other = episodes.find((x) => String(x.step) === (step === chosen.a ? chosen.b : chosen.a)
      && String(x.seed) === chosen.seed);
    const cards = h("div", { class: "turns" });
    for (let t = 0; t <= e.actions.length; t++) {
      const card = turnCard(runId, e, t, () => { location.hash = `#/runs/${runId}/episodes/${encodeURIComponent(e.id)}`; });
      if (other && t < e.actions.length && other.actions[t]?.trim() !== e.actions[t].trim()) card.classList.add("differs");
      cards.append(card);
    }
    return h("div", { class: "column" }, h("h2", {}, `Step ${step}`), episodeSummary(e), cards);
  };
  fill(page,
    h("p", {}, link(`#/runs/${runId}`, `← run ${runId}`)), h("h1", {}, "Compare an eval task at two steps"),
    h("div", { class: "filters" }, select("seed", seeds, "Task (seed)"), select("a", steps, "Step"), select("b", steps, "against step")),
    h("p", { class: "sub" }, "Turns whose action differs between the two steps are outlined."),
    h("div", { class: "compare" }, column(chosen.a), column(chosen.b)));
}

// Routing -----------------------------------------------------------------------------------------
async function route() {
  leave.abort();
  leave = new AbortController();
  document.getElementById("forget-token").hidden = !api.token();
  const [path, search] = location.hash.replace(/^#/, "").split("?");
  const query = new URLSearchParams(search || "");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  fill(page, h("p", { class: "sub" }, "Loading…"));
  try {
    if (parts[0] === "runs" && parts.length === 2) await runPage(parts[1]);
    else if (parts[0] === "runs" && parts[2] === "episodes" && parts.length === 4) await episodePage(parts[1], parts[3]);
    else if (parts[0] === "runs" && parts[2] === "episodes") await episodesPage(parts[1], query);
    else if (parts[0] === "runs" && parts[2] === "compare") await comparePage(parts[1], query);
    else await runsPage();
    document.body.dataset.ready = location.hash || "#/";
  } catch (error) {
    showError(error);
  }
}

window.addEventListener("hashchange", route);
route();
