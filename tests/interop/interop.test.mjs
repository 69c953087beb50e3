// Issue 28, "Any RFC 9420 peer": a member written with ts-mls, an MLS
// implementation independent of the fabric's, against a real all-in-one.
// It writes to the fabric's transport endpoint (fabric-native/1) and reads
// the hosted clients' output through `fabric bridge`, which posts to the
// transport endpoint the peer serves (docs/interop.md). One scenario, each
// step awaiting the last: join by Welcome, texts both ways, commits both
// ways, hosted clients added into a group that carries the components
// extension by the fabric and by the peer, a removal each way.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import { Fabric } from "../../sdk/ts/test/fabric.mjs";
import { Peer, COMPONENTS, groupName, hex } from "./peer.mjs";

const fabric = new Fabric();
let peer;
let bridge;
let bridgeLog = "";
const tmp = mkdtempSync(join(tmpdir(), "fabric-interop-"));

before(async () => {
  await fabric.start();
  peer = await Peer.create();
  await peer.listen();
  const tokenFile = join(tmp, "peer-token");
  writeFileSync(tokenFile, "a token the peer's endpoint does not check\n");
  bridge = spawn(
    fabric.binary(),
    ["bridge", "-nats-url", fabric.natsURL, "-from-data", fabric.data, "-to", peer.url, "-token-file", tokenFile, "-listen", "127.0.0.1:0"],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  bridge.stdout.on("data", (b) => (bridgeLog += b));
  bridge.stderr.on("data", (b) => (bridgeLog += b));
});

after(async () => {
  if (bridge && bridge.exitCode === null) {
    const exited = new Promise((r) => bridge.on("exit", r));
    bridge.kill("SIGTERM");
    await exited;
  }
  peer?.close();
  await fabric.close();
  rmSync(tmp, { recursive: true, force: true });
});

/** until polls cond (async) every 50 ms for up to 60 s; what() says what was awaited. */
async function until(what, cond) {
  const deadline = Date.now() + 60_000;
  for (;;) {
    // What ts-mls refused fails the step at once, with its reason.
    assert.deepEqual(peer.refusals, [], `ts-mls refused what the fabric sent while awaiting: ${what()}`);
    const v = await cond();
    if (v) return v;
    if (Date.now() > deadline) {
      assert.fail(`${what()}\nbridge: ${bridgeLog}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function register() {
  const inbox = hex(randomBytes(32));
  const r = await fabric.api("POST", "/v1/tenants/dev/clients", { inbox_id: inbox });
  return { id: r.client_id, inbox, keyPackage: r.key_packages[0] };
}

const clientPath = (c) => `/v1/tenants/dev/clients/${c.id}`;

async function operate(c, method, path, body) {
  const resp = await fetch(fabric.url + clientPath(c) + path, {
    method,
    headers: { Authorization: `Bearer ${fabric.adminToken}`, "Content-Type": "application/json", "Idempotency-Key": hex(randomBytes(8)) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await resp.text();
  assert.equal(resp.status, 202, `${method} ${path}: ${text}`);
  return JSON.parse(text);
}

/** done awaits an operation's record `done`. */
async function done(c, op) {
  let rec;
  await until(
    () => `operation ${op.operation_id} not done: ${JSON.stringify(rec)}`,
    async () => {
      rec = await fabric.api("GET", `${clientPath(c)}/operations/${op.operation_id}`);
      assert.notEqual(rec.status, "failed", `operation failed: ${JSON.stringify(rec)}`);
      return rec.status === "done";
    },
  );
  return rec;
}

/** post sends one transport message of the peer's to the fabric's intake. */
async function post(m) {
  const body = { v: 1, group: peer.groupID, kind: m.kind, payload: hex(m.payload) };
  const resp = await fetch(`${fabric.url}/v1/tenants/dev/transport`, {
    method: "POST",
    headers: { Authorization: `Bearer ${fabric.ingestToken}`, "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  const text = await resp.text();
  assert.equal(resp.status, 200, text);
  return JSON.parse(text).results[0];
}

async function outcome(id) {
  const resp = await fetch(`${fabric.url}/v1/tenants/dev/outcomes/${id}`, { headers: { Authorization: `Bearer ${fabric.ingestToken}` } });
  return resp.status === 404 ? undefined : JSON.parse(await resp.text());
}

/**
 * commit posts the peer's commit (and its Welcome), awaits the fabric's
 * acceptance (a commit may read `deferred` first: docs/interop.md) and
 * then adopts the state after it.
 */
async function commit(proposals, opts) {
  const c = await peer.commit(proposals, opts);
  assert.equal((await post(c)).status, "queued");
  let rec;
  await until(
    () => `the peer's commit ${c.id} is not accepted: ${JSON.stringify(rec)}`,
    async () => {
      rec = await outcome(c.id);
      assert.ok(rec?.status !== "rejected" && !["stale", "invalidated"].includes(rec?.disposition), `the fabric refused the peer's commit: ${JSON.stringify(rec)}`);
      return rec?.disposition === "accepted";
    },
  );
  await peer.adopt(c.next);
  if (c.welcome) assert.equal((await post(c.welcome)).status, "queued");
  return c;
}

async function messages(c) {
  return (await fabric.api("GET", `${clientPath(c)}/conversations/${peer.groupID}/messages?limit=500`)).messages;
}

async function conversation(c) {
  const resp = await fetch(`${fabric.url}${clientPath(c)}/conversations/${peer.groupID}`, { headers: { Authorization: `Bearer ${fabric.adminToken}` } });
  return resp.status === 404 ? undefined : JSON.parse(await resp.text());
}

/** hostedReads awaits a text the peer sent in c's readable messages. */
async function hostedReads(c, text) {
  await until(
    () => `client ${c.id} never read ${JSON.stringify(text)}`,
    async () => (await messages(c)).some((m) => m.sender_inbox_id === peer.inbox && m.content?.text === text),
  );
}

/** peerReads awaits a text in the peer's decrypted messages. */
async function peerReads(text) {
  await until(
    () => `the peer never read ${JSON.stringify(text)} (read: ${JSON.stringify(peer.received.map((p) => new TextDecoder().decode(p.content)))})`,
    () => peer.received.some((p) => p.content_type.type_id === "text" && new TextDecoder().decode(p.content) === text),
  );
}

async function peerAtEpochWith(what, cond) {
  await until(
    () => `the peer did not follow ${what}: epoch ${peer.epoch}, members ${JSON.stringify(peer.state && peer.members())}`,
    () => peer.state && cond(),
  );
}

test("a ts-mls peer joins, talks and commits with hosted clients, and adds and removes them", async (t) => {
  const one = await register();
  const two = await register();
  const three = await register();
  const four = await register();

  await t.test("hosted client one creates a group with the peer's KeyPackage; the peer joins from the Welcome", async () => {
    const op = await operate(one, "POST", "/conversations", {
      name: "interop",
      admins: [one.inbox, peer.inbox].sort(),
      key_packages: [hex(peer.keyPackage())],
    });
    await done(one, op);
    await peerAtEpochWith("the Welcome", () => peer.groupID === op.group_id);
    assert.equal(peer.epoch, 1n);
    assert.deepEqual(peer.members().sort(), [one.inbox, peer.inbox].sort());
    assert.equal(groupName(peer.components()), "interop", "the group carries the components extension 0xF0FA");
  });

  await t.test("the hosted client's KeyPackage and leaf list 0xF0FA in their capabilities", () => {
    const own = peer.state.ratchetTree.find((n) => n?.nodeType === "leaf" && hex(n.leaf.credential.identity) === one.inbox);
    assert.ok(own.leaf.capabilities.extensions.includes(COMPONENTS), `the leaf lists ${own.leaf.capabilities.extensions}`);
    assert.ok(peer.addProposal(two.keyPackage).add.keyPackage.leafNode.capabilities.extensions.includes(COMPONENTS));
  });

  await t.test("texts both ways", async () => {
    await done(one, await operate(one, "POST", `/conversations/${peer.groupID}/messages`, { text: "hello, ts-mls" }));
    await peerReads("hello, ts-mls");
    const m = await peer.text("hello, fabric");
    assert.equal((await post(m)).status, "queued");
    await hostedReads(one, "hello, fabric");
  });

  await t.test("commits both ways: the peer renames and updates its leaf, the hosted client renames and updates its leaf", async () => {
    await commit([peer.renameProposal("renamed by ts-mls")]);
    await until(
      () => "the hosted client never read the peer's name",
      async () => (await conversation(one)).components.group_name === "renamed by ts-mls",
    );
    await commit([]);
    await done(one, await operate(one, "PATCH", `/conversations/${peer.groupID}`, { name: "renamed by the fabric" }));
    await peerAtEpochWith("the hosted client's rename", () => groupName(peer.components()) === "renamed by the fabric");
    const epoch = peer.epoch;
    await done(one, await operate(one, "POST", `/conversations/${peer.groupID}/update`));
    await peerAtEpochWith("the hosted client's self-update", () => peer.epoch === epoch + 1n);
  });

  await t.test("the hosted client adds a second hosted client: the peer follows the add", async () => {
    await done(one, await operate(one, "POST", `/conversations/${peer.groupID}/members`, { key_packages: [two.keyPackage] }));
    await peerAtEpochWith("the add of hosted client two", () => peer.members().includes(two.inbox));
    await until(() => "hosted client two never joined", async () => (await conversation(two))?.membership === "active");
    await done(two, await operate(two, "POST", `/conversations/${peer.groupID}/messages`, { text: "two is here" }));
    await peerReads("two is here");
  });

  await t.test("the peer adds a third hosted client by its KeyPackage: it joins from the peer's Welcome", async () => {
    await commit([peer.addProposal(three.keyPackage)]);
    await until(() => "hosted client three never joined", async () => (await conversation(three))?.membership === "active");
    const m = await peer.text("welcome, three");
    assert.equal((await post(m)).status, "queued");
    for (const c of [one, two, three]) await hostedReads(c, "welcome, three");
  });

  await t.test("a Welcome without the ratchet_tree extension is refused, and its outcome says why", async () => {
    const c = await commit([peer.addProposal(four.keyPackage)], { treeInWelcome: false });
    let rec;
    await until(
      () => `the Welcome's outcome: ${JSON.stringify(rec)}`,
      async () => (rec = await outcome(c.welcome.id))?.status === "rejected",
    );
    assert.equal(rec.category, "invalid_encoding");
    assert.match(rec.reason, /ratchet_tree/);
    assert.equal(await conversation(four), undefined, "hosted client four holds no conversation");
  });

  await t.test("the peer removes hosted clients three and four; hosted client one removes the peer", async () => {
    await commit([peer.removeProposal(three.inbox), peer.removeProposal(four.inbox)]);
    await until(() => "hosted client three was never removed", async () => (await conversation(three)).membership === "removed");
    await done(one, await operate(one, "DELETE", `/conversations/${peer.groupID}/members/${peer.inbox}`));
    await peerAtEpochWith("its removal", () => peer.removed);
    const members = await fabric.api("GET", `${clientPath(one)}/conversations/${peer.groupID}/members`);
    assert.deepEqual(members.members.map((m) => m.inbox_id).sort(), [one.inbox, two.inbox].sort());
  });

  assert.deepEqual(peer.refusals, [], "ts-mls refused nothing the fabric sent");
});
