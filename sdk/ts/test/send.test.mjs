// The operations API through the SDK against a real all-in-one (issue 19):
// a hosted client creates a group and sends, each call idempotent, its
// outcome reported by the client's events and readable as a record.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { Client, Operations, APIError } from "../dist/index.js";
import { Fabric } from "./fabric.mjs";

const fabric = new Fabric();
before(() => fabric.start());
after(() => fabric.close());

async function done(ops, client, id) {
  for (let i = 0; i < 400; i++) {
    const rec = await ops.operation(client, id);
    if (rec.status === "done") return rec;
    assert.notEqual(rec.status, "failed", `operation failed: ${JSON.stringify(rec)}`);
    await new Promise((r) => setTimeout(r, 25));
  }
  assert.fail(`operation ${id} never done`);
}

test("a hosted client creates a group and sends a text: conversation.joined created, message.status_changed published, records done", async () => {
  const client = await fabric.newClient();
  const token = (await fabric.api("POST", "/v1/tenants/dev/connection-tokens", { clients: [client], scopes: ["events", "send"] })).token;
  const c = await Client.connect(fabric.wsURL, { token, onError: () => {} });
  try {
    const sub = await c.subscribe(client, { kinds: ["conversation.joined", "message.status_changed"] });
    const ops = new Operations(fabric.url, "dev", { token });

    const created = await ops.createConversation(client, "create-1", { name: "team" });
    assert.equal(created.status, "queued");
    assert.deepEqual(await ops.createConversation(client, "create-1", { name: "team" }), created, "the same Idempotency-Key is the same operation");
    const joined = await sub.next();
    assert.equal(joined.kind, "conversation.joined");
    assert.equal(joined.conversation_joined.origin, "created");
    assert.equal(joined.conversation_joined.group_id, created.group_id);

    const sent = await ops.sendText(client, created.group_id, "send-1", "hello");
    const status = await sub.next();
    assert.equal(status.kind, "message.status_changed");
    assert.equal(status.message_status_changed.current, "published");
    assert.equal(status.message_status_changed.group_id, created.group_id);
    const rec = await done(ops, client, sent.operation_id);
    assert.equal(rec.kind, "send_message");
    assert.deepEqual(rec.message_ids, [status.message_status_changed.message_id]);
    assert.equal((await done(ops, client, created.operation_id)).kind, "create_conversation");

    await assert.rejects(ops.sendText(client, created.group_id, "", "x"), (e) => e instanceof APIError && e.status === 400);
    const eventsOnly = (await fabric.api("POST", "/v1/tenants/dev/connection-tokens", { clients: [client], scopes: ["events"] })).token;
    await assert.rejects(
      new Operations(fabric.url, "dev", { token: eventsOnly }).sendText(client, created.group_id, "send-2", "x"),
      (e) => e instanceof APIError && e.status === 403,
    );
  } finally {
    c.close();
  }
});
