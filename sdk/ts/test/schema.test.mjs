// The SDK's types are generated from the contract the Go code is checked
// against (api/events.schema.json), so they cannot drift from the gateway.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { generate } from "../scripts/gen-types.mjs";
import { allKinds, kindMembers } from "../dist/index.js";

const schema = JSON.parse(readFileSync(new URL("../../../api/events.schema.json", import.meta.url), "utf8"));

test("src/schema.ts is what the schema generates", () => {
  assert.equal(readFileSync(new URL("../src/schema.ts", import.meta.url), "utf8"), generate(schema));
});

test("every kind of the schema has its payload member", () => {
  assert.deepEqual([...allKinds], schema.$defs.EventKind.enum);
  for (const k of allKinds) assert.ok(kindMembers[k], `no member for ${k}`);
});
