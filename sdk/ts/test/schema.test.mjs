// The SDK's types are generated from the contract the Go code is checked
// against (api/events.schema.json), so they cannot drift from the gateway.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { allKinds, kindMembers } from "../dist/index.js";

const schema = JSON.parse(readFileSync(new URL("../../../api/events.schema.json", import.meta.url), "utf8"));

test("every kind of the schema is in the SDK with its payload member", () => {
  assert.deepEqual([...allKinds], schema.$defs.EventKind.enum);
  for (const branch of schema.$defs.ClientEvent.oneOf) {
    const kind = branch.properties.kind.const;
    assert.equal(kindMembers[kind], branch.required.find((r) => r !== "kind"), kind);
  }
});
