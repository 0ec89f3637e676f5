// The coordinator's REST API as the console uses it: the bearer token (kept in sessionStorage),
// JSON requests, frames as blob URLs and server-sent events read over fetch (both so that the
// token travels in a header, never in a URL).

const TOKEN_KEY = "mmrl-api-token";

export class Unauthorized extends Error {}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

function headers(extra = {}) {
  const h = { ...extra };
  if (token()) h.Authorization = `Bearer ${token()}`;
  return h;
}

async function send(path, init = {}) {
  const reply = await fetch(path, { ...init, headers: headers(init.headers) });
  if (reply.status === 401) throw new Unauthorized("the API needs a token");
  if (!reply.ok) {
    let detail = reply.statusText;
    try {
      const body = await reply.json();
      detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
    } catch (_) { /* not JSON */ }
    throw new Error(`${init.method || "GET"} ${path}: ${reply.status} ${detail}`);
  }
  return reply;
}

export async function get(path, params = {}) {
  const query = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== "" && v != null));
  const reply = await send(query.toString() ? `${path}?${query}` : path);
  return reply.json();
}

async function sendJson(method, path, body) {
  const init = { method };
  if (body !== undefined) Object.assign(init, { body: JSON.stringify(body), headers: { "Content-Type": "application/json" } });
  return (await send(path, init)).json();
}

export const post = (path, body) => sendJson("POST", path, body);
export const patch = (path, body) => sendJson("PATCH", path, body);

const frameUrls = new Map(); // frame path -> blob URL, kept for the session (frames do not change)

export async function frameUrl(path) {
  if (!frameUrls.has(path)) {
    frameUrls.set(path, send(path).then(async (reply) => URL.createObjectURL(await reply.blob())));
  }
  try {
    return await frameUrls.get(path);
  } catch (error) {
    frameUrls.delete(path);
    throw error;
  }
}

// Calls onEvent(kind, data) for every event of the run (all of them from the first, then live
// ones) until the stream ends (the run is over) or `signal` aborts it.
export async function followEvents(runId, onEvent, signal) {
  const reply = await send(`/v1/runs/${encodeURIComponent(runId)}/events`, { signal });
  const reader = reply.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let kind = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) kind = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      if (data) onEvent(kind, JSON.parse(data));
    }
  }
}
