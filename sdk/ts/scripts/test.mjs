// test builds the SDK, checks src/schema.ts is what api/events.schema.json
// generates, and runs the tests against a real all-in-one with Node's test
// runner. Node before 22 has WebSocket only behind a flag.
import { execFileSync } from "node:child_process";
import { readdirSync } from "node:fs";

const run = (cmd, args) => execFileSync(cmd, args, { stdio: "inherit" });
run(process.execPath, ["scripts/gen-types.mjs", "--check"]);
run(process.execPath, ["node_modules/typescript/bin/tsc", "-p", "tsconfig.json"]);
const flags = typeof WebSocket === "undefined" ? ["--experimental-websocket"] : [];
const files = readdirSync("test").filter((f) => f.endsWith(".test.mjs")).map((f) => `test/${f}`);
try {
  run(process.execPath, [...flags, "--test", ...files]);
} catch {
  process.exit(1);
}
