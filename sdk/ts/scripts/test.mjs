// test checks that the committed src/schema.ts is what
// api/events.schema.json makes, builds the SDK, and runs the tests against a
// real all-in-one with Node's test runner.
// Node before 22 has WebSocket only behind a flag.
import { execFileSync } from "node:child_process";
import { readdirSync } from "node:fs";

const run = (args) => {
  try {
    execFileSync(process.execPath, args, { stdio: "inherit" });
  } catch {
    process.exit(1); // the command said why
  }
};
run(["scripts/gen-types.mjs", "--check"]);
run(["node_modules/typescript/bin/tsc", "-p", "tsconfig.json"]);
const flags = typeof WebSocket === "undefined" ? ["--experimental-websocket"] : [];
const files = readdirSync("test").filter((f) => f.endsWith(".test.mjs")).map((f) => `test/${f}`);
run([...flags, "--test", ...files]);
