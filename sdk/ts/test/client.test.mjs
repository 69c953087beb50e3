// The SDK against a real all-in-one fabric (issue 20): a page's connection
// token in the connect frame, filtered subscriptions as an async iterator
// and a callback, the 1024 bound and lagged (EVENT-030, EVENT-031), and
// resume after the server restarts.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { Client, GatewayError, EndedError, Reader, APIError, initialCredit } from "../dist/index.js";
import { Fabric, inbox } from "./fabric.mjs";

const fabric = new Fabric();
before(() => fabric.start());
after(() => fabric.close());

const quiet = { onError: () => {} };

test("a connection token in the connect frame subscribes with a filter, as an async iterator", async () => {
  const client = await fabric.newClient();
  const c = await Client.connect(fabric.wsURL, { token: await fabric.connectionToken([client]), ...quiet });
  try {
    const consent = await c.subscribe(client, { kinds: ["consent.changed"] });
    const other = await c.subscribe(client, { kinds: ["identity.own_installation_added"] });
    await fabric.consent(client, inbox(1), "allowed");
    const ev = await consent.next();
    assert.equal(ev.kind, "consent.changed");
    assert.equal(ev.kind === "consent.changed" && ev.consent_changed.state, "allowed");
    // Its id, which a fabric.commit_superseded would name in withdrawn_event_ids.
    assert.match(ev.id ?? "", /^[0-9a-f]{64}$/);
    await fabric.consent(client, inbox(1), "denied");
    for await (const e of consent) {
      assert.equal(e.kind === "consent.changed" && e.consent_changed.state, "denied");
      assert.notEqual(e.id, ev.id);
      break;
    }
    // The filter kept the consent events from the other subscription.
    assert.equal(other.held(), 0);
    other.close();
    await assert.rejects(other.next(), EndedError);
  } finally {
    c.close();
  }
});

test("a filter without kinds selects every kind, as SSE without a kinds parameter does (issue 28)", async () => {
  const client = await fabric.newClient();
  const c = await Client.connect(fabric.wsURL, { token: await fabric.connectionToken([client]), ...quiet });
  try {
    const every = await c.subscribe(client, {});
    await fabric.consent(client, inbox(1), "allowed");
    await fabric.api("PUT", `/v1/tenants/dev/clients/${client}/hmac-keys`, { root_key: "ab".repeat(16) });
    assert.equal((await every.next()).kind, "consent.changed");
    assert.equal((await every.next()).kind, "hmac_keys.updated");
  } finally {
    c.close();
  }
});

test("a refused token is the gateway's code and reason", async () => {
  await assert.rejects(Client.connect(fabric.wsURL, { token: "a.b.c", reconnect: false, ...quiet }), (err) => {
    assert.ok(err instanceof GatewayError);
    assert.equal(err.code, "unauthenticated");
    assert.equal(err.message, "gateway: unauthenticated: invalid token");
    return true;
  });
  const client = await fabric.newClient();
  const c = await Client.connect(fabric.wsURL, { token: await fabric.connectionToken([client]), ...quiet });
  try {
    await assert.rejects(c.subscribe("abab", { kinds: [] }), (err) => err instanceof GatewayError && err.code === "forbidden");
  } finally {
    c.close();
  }
});

test("a callback gets events one at a time, and its error ends nothing (EVENT-050, EVENT-051)", async () => {
  const client = await fabric.newClient();
  const errors = [];
  const c = await Client.connect(fabric.wsURL, { token: await fabric.connectionToken([client]), onError: (e) => errors.push(e) });
  try {
    let running = 0;
    const states = [];
    let resolveAll;
    const all = new Promise((r) => (resolveAll = r));
    const sub = await c.subscribeFn(client, { kinds: ["consent.changed"] }, async (ev) => {
      running++;
      assert.equal(running, 1, "two callbacks at once");
      await new Promise((r) => setTimeout(r, 5));
      states.push(ev.consent_changed.state);
      running--;
      if (states.length === 1) throw new Error("boom");
      if (states.length === 4) resolveAll();
    });
    for (const state of ["allowed", "denied", "allowed", "denied"]) await fabric.consent(client, inbox(2), state);
    await all;
    assert.deepEqual(states, ["allowed", "denied", "allowed", "denied"]);
    assert.ok(errors.some((e) => e.message === "boom"));
    sub.close();
    await sub.done;
  } finally {
    c.close();
  }
});

test("a subscription that stops reading holds at most 1024 events, then one lagged counts the rest, and a resume after it replays none of them (EVENT-030, EVENT-031)", async () => {
  const client = await fabric.newClient();
  const c = await Client.connect(fabric.wsURL, { token: await fabric.connectionToken([client]), minBackoffMs: 50, maxBackoffMs: 500, ...quiet });
  try {
    const sub = await c.subscribe(client, { kinds: ["consent.changed"] });
    const total = initialCredit + 76;
    for (let i = 0; i < total; i++) await fabric.consent(client, inbox(3), i % 2 === 0 ? "allowed" : "denied");
    let received = 0;
    let discarded = 0;
    while (received + discarded < total) {
      const ev = await sub.next();
      if (ev.kind === "lagged") {
        assert.equal(received, initialCredit, "lagged before the bound was reached");
        discarded += ev.lagged.discarded;
      } else {
        received++;
      }
    }
    assert.equal(received, initialCredit);
    assert.equal(discarded, 76);
    // The lagged carries the sequence of the last event it counts: the
    // resume after a restart continues after it, so the next event is the
    // new one, not a counted one replayed.
    await fabric.stop();
    await fabric.start();
    await fabric.consent(client, inbox(4), "allowed");
    assert.equal((await sub.next()).consent_changed.entity, inbox(4));
    assert.equal(sub.held(), 0);
  } finally {
    c.close();
  }
});

test("after the server restarts the subscription resumes where it stopped", async () => {
  const client = await fabric.newClient();
  const c = await Client.connect(fabric.wsURL, { token: await fabric.connectionToken([client]), minBackoffMs: 50, maxBackoffMs: 500, ...quiet });
  try {
    const sub = await c.subscribe(client, { kinds: ["consent.changed"] });
    await fabric.consent(client, inbox(5), "allowed");
    assert.equal((await sub.next()).consent_changed.entity, inbox(5));
    await fabric.stop();
    await fabric.start();
    // Stored before the SDK is back or after: either way handed off once.
    await fabric.consent(client, inbox(6), "allowed");
    await fabric.consent(client, inbox(7), "allowed");
    assert.equal((await sub.next()).consent_changed.entity, inbox(6));
    assert.equal((await sub.next()).consent_changed.entity, inbox(7));
    assert.equal(sub.held(), 0);
  } finally {
    c.close();
  }
});

test("the read API: a consent change an event reports is readable when the event arrives (EVENT-010)", async () => {
  const client = await fabric.newClient();
  const token = (await fabric.api("POST", "/v1/tenants/dev/connection-tokens", { clients: [client], scopes: ["events", "read"] })).token;
  const c = await Client.connect(fabric.wsURL, { token, ...quiet });
  const reader = new Reader(fabric.url, "dev", { token });
  try {
    const sub = await c.subscribe(client, { kinds: ["consent.changed"] });
    await fabric.consent(client, inbox(11), "allowed");
    const ev = await sub.next();
    const page = await reader.consent(client);
    const rec = page.consent.find((r) => r.entity === ev.consent_changed.entity);
    assert.equal(rec?.state, "allowed");
    const conversations = await reader.conversations(client, { limit: 10 });
    assert.deepEqual(conversations.conversations, []);
    await assert.rejects(reader.consent("abab"), (err) => err instanceof APIError && err.status === 403);
  } finally {
    c.close();
  }
});
