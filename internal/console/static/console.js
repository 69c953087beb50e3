// The console's page: it mints a connection token for the client it
// watches with the operator's admin token (never sent anywhere else), opens
// the gateway's WebSocket with that token in the connect frame, subscribes
// with the chosen filter and returns credit as it shows each event
// (docs/wire-formats.md); it reads the client's conversations from the read
// API and polls /readyz, /metrics and the tenant's subscriptions.
const $ = (id) => document.getElementById(id);
const wsURL = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/events`;
let ws = null;
const stats = { count: 0, lagged: 0, discarded: 0 };

async function api(method, path, token, body) {
  const resp = await fetch(path, {
    method,
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json", Accept: "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await resp.text();
  if (!resp.ok) {
    let msg = text;
    try {
      msg = JSON.parse(text).error.message;
    } catch {
      // not the API's error body
    }
    throw new Error(`${resp.status}: ${msg}`);
  }
  return text ? JSON.parse(text) : null;
}

function status(text, ok = true) {
  $("status").textContent = text;
  $("status").className = ok ? "ok" : "bad";
}

function showStats() {
  $("count").textContent = stats.count;
  $("lagged").textContent = stats.lagged;
  $("discarded").textContent = stats.discarded;
  $("held").textContent = 0; // each event is credited as it is shown
}

function addEvent(seq, ev) {
  const row = document.createElement("tr");
  const member = Object.keys(ev).find((k) => k !== "kind");
  for (const text of [seq ?? "", ev.kind, JSON.stringify(member ? ev[member] : {})]) {
    const td = document.createElement("td");
    td.textContent = text;
    row.append(td);
  }
  row.lastChild.className = "json";
  row.dataset.kind = ev.kind;
  $("events").tBodies[0].prepend(row);
  while ($("events").tBodies[0].rows.length > 200) $("events").tBodies[0].lastChild.remove();
}

async function loadConversations(tenant, client, token) {
  const body = $("groups-table").tBodies[0];
  try {
    const page = await api("GET", `/v1/tenants/${tenant}/clients/${client}/conversations?limit=50`, token);
    body.replaceChildren();
    for (const c of page.conversations) {
      const row = document.createElement("tr");
      const state = `${c.conversation_type}, epoch ${c.epoch}, ${c.membership}, ${c.members.inboxes} members (${c.members.installations} installations), ${c.messages} messages, consent ${c.consent_state}${c.paused ? ", paused" : ""}`;
      for (const text of [c.group_id, state]) {
        const td = document.createElement("td");
        td.textContent = text;
        row.append(td);
      }
      body.append(row);
    }
  } catch (err) {
    body.replaceChildren();
    const row = body.insertRow();
    row.insertCell().textContent = `conversations unavailable: ${err.message}`;
  }
}

// The tenant's hosted clients, a page at a time (GET …/clients, admin), to
// choose the one to watch; More appends the next page.
let clientsCursor = "";
async function listClients(more) {
  const admin = $("token").value.trim();
  const tenant = $("tenant").value.trim();
  if (!admin || !tenant) return status("the admin token and the tenant first", false);
  const choice = $("client-choice");
  if (!more) {
    clientsCursor = "";
    choice.replaceChildren(new Option("choose a client…", ""));
  }
  try {
    const cursor = clientsCursor ? `&cursor=${encodeURIComponent(clientsCursor)}` : "";
    const page = await api("GET", `/v1/tenants/${tenant}/clients?limit=100${cursor}`, admin);
    for (const c of page.clients) choice.add(new Option(`${c.client_id.slice(0, 16)}… inbox ${c.inbox_id.slice(0, 12)}…`, c.client_id));
    clientsCursor = page.next_cursor ?? "";
    $("more-clients").hidden = !clientsCursor;
    status(`${choice.options.length - 1} clients listed`);
  } catch (err) {
    status(`clients unavailable: ${err.message}`, false);
  }
}

// Every subscription of the tenant on this gateway: its queue against the
// bound (EVENT-030) and its losses (EVENT-031).
async function loadSubscriptions() {
  const admin = $("token").value.trim();
  const tenant = $("tenant").value.trim();
  if (!admin || !tenant) return;
  const body = $("subs-table").tBodies[0];
  try {
    const list = await api("GET", `/v1/tenants/${tenant}/subscriptions`, admin);
    body.replaceChildren();
    for (const s of list.subscriptions) {
      const row = body.insertRow();
      for (const text of [s.client_id, s.transport, s.queued, `${s.held} / ${s.capacity}`, s.lagged, s.discarded]) {
        row.insertCell().textContent = String(text);
      }
    }
  } catch (err) {
    body.replaceChildren();
    body.insertRow().insertCell().textContent = `subscriptions unavailable: ${err.message}`;
  }
}

async function watch(e) {
  e.preventDefault();
  stop();
  const admin = $("token").value.trim();
  const tenant = $("tenant").value.trim();
  const client = $("client").value.trim();
  let kinds = [...$("kinds").selectedOptions].map((o) => o.value);
  if (kinds.length === 0) kinds = [...$("kinds").options].map((o) => o.value);
  const filter = { kinds };
  const groups = $("groups").value.split(",").map((g) => g.trim()).filter(Boolean);
  if (groups.length) filter.group_ids = groups;
  let token;
  try {
    ({ token } = await api("POST", `/v1/tenants/${tenant}/connection-tokens`, admin, { clients: [client], scopes: ["events", "read"], ttl_seconds: 3600 }));
  } catch (err) {
    status(`connection token refused: ${err.message}`, false);
    return;
  }
  Object.assign(stats, { count: 0, lagged: 0, discarded: 0 });
  showStats();
  $("events").tBodies[0].replaceChildren();
  void loadConversations(tenant, client, token);
  const sock = new WebSocket(wsURL, "fabric.v1.json");
  ws = sock;
  sock.onopen = () => sock.send(JSON.stringify({ op: "connect", token }));
  sock.onmessage = (m) => {
    const f = JSON.parse(m.data);
    switch (f.op) {
      case "connected":
        sock.send(JSON.stringify({ op: "subscribe", id: 1, client_id: client, filter }));
        break;
      case "subscribed":
        status(`watching ${client}`);
        $("stop").disabled = false;
        void poll();
        break;
      case "event":
        if (f.event.kind === "lagged") {
          stats.lagged++;
          stats.discarded += f.event.lagged.discarded;
        } else {
          stats.count++;
          if (f.event.kind.startsWith("conversation.")) void loadConversations(tenant, client, token);
          sock.send(JSON.stringify({ op: "credit", sub: f.sub, n: 1 }));
        }
        addEvent(f.seq, f.event);
        showStats();
        break;
      case "ended":
        status(`subscription ended: ${f.reason}`, false);
        break;
      case "error":
        status(`${f.code}: ${f.message}`, false);
        break;
    }
  };
  sock.onclose = (ev) => {
    if (ws === sock) status(`closed ${ev.code} ${ev.reason}`, ev.code === 1000);
  };
}

function stop() {
  if (ws) {
    const sock = ws;
    ws = null;
    sock.close(1000, "stopped");
  }
  $("stop").disabled = true;
}

// The roles' health and the gateway's key metrics, every 5 s.
const shown = [
  ["fabric_fanout_connections", "connections"],
  ["fabric_fanout_subscriptions", "subscriptions"],
  ["fabric_fanout_events_sent_total", "events sent"],
  ["fabric_fanout_lagged_events_total", "lagged handed off"],
  ["fabric_fanout_discarded_events_total", "discarded"],
  ["fabric_fanout_queue_depth_sum", "queue depth (sum)"],
  ["fabric_fanout_queue_depth_count", "queue depth (samples)"],
  ["fabric_fanout_connect_refusals_total", "connect refusals"],
];

async function poll() {
  void loadSubscriptions();
  try {
    const ready = await fetch("/readyz");
    $("health").innerHTML = "";
    const span = document.createElement("span");
    span.textContent = ready.ok ? "ready" : `not ready: ${(await ready.text()).trim()}`;
    span.className = ready.ok ? "ok" : "bad";
    $("health").append(span);
    const text = await (await fetch("/metrics")).text();
    const sums = new Map();
    for (const line of text.split("\n")) {
      if (line.startsWith("#")) continue;
      const m = line.match(/^([a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$/);
      if (m) sums.set(m[1], (sums.get(m[1]) ?? 0) + Number(m[3]));
    }
    const body = $("metrics").tBodies[0];
    body.replaceChildren();
    for (const [name, label] of shown) {
      const row = body.insertRow();
      row.insertCell().textContent = label;
      row.insertCell().textContent = sums.has(name) ? String(sums.get(name)) : "–";
    }
  } catch (err) {
    $("health").textContent = `unreachable: ${err.message}`;
  }
}

async function start() {
  const kinds = await (await fetch("kinds.json")).json();
  for (const k of kinds) $("kinds").add(new Option(k, k));
  $("watch").addEventListener("submit", watch);
  $("stop").addEventListener("click", stop);
  $("list-clients").addEventListener("click", () => void listClients(false));
  $("more-clients").addEventListener("click", () => void listClients(true));
  $("client-choice").addEventListener("change", () => {
    if ($("client-choice").value) $("client").value = $("client-choice").value;
  });
  void poll();
  setInterval(poll, 5000);
  document.body.dataset.ready = "true";
}

void start();
