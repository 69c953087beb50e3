// The package builds and packs from its own folder, away from the
// repository (issue 28): a copy of its files, with only its own
// node_modules beside them, runs `npm pack`, and the tarball holds the
// compiled SDK, its types, the README and the license, and nothing else.
import { test } from "node:test";
import assert from "node:assert/strict";
import { cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = fileURLToPath(new URL("..", import.meta.url));

test("npm pack works in a copy of the package's folder alone", async () => {
  const dir = mkdtempSync(join(tmpdir(), "fabric-sdk-pack-"));
  try {
    const pkg = join(dir, "pkg");
    for (const f of ["package.json", "package-lock.json", "tsconfig.json", "README.md", "LICENSE", "src", "scripts"]) {
      cpSync(join(here, f), join(pkg, f), { recursive: true });
    }
    symlinkSync(join(here, "node_modules"), join(pkg, "node_modules"));
    const out = execFileSync("npm", ["pack", "--json", "--pack-destination", dir], { cwd: pkg, encoding: "utf8" });
    const [packed] = JSON.parse(out.slice(out.indexOf("[")));
    const files = packed.files.map((f) => f.path).sort();
    for (const want of ["LICENSE", "README.md", "package.json", "dist/index.js", "dist/index.d.ts", "dist/schema.d.ts"]) {
      assert.ok(files.includes(want), `${want} is not in the package: ${files}`);
    }
    assert.deepEqual(files.filter((f) => !f.startsWith("dist/") && !["LICENSE", "README.md", "package.json"].includes(f)), []);

    const unpacked = join(dir, "unpacked");
    mkdirSync(unpacked);
    execFileSync("tar", ["-xzf", join(dir, packed.filename), "-C", unpacked]);
    const meta = JSON.parse(readFileSync(join(unpacked, "package", "package.json"), "utf8"));
    assert.equal(meta.license, "Apache-2.0");
    assert.equal(meta.private, undefined);
    assert.equal(meta.repository.directory, "sdk/ts");
    const sdk = await import(pathToFileURL(join(unpacked, "package", "dist", "index.js")).href);
    assert.ok(sdk.allKinds.includes("message.received") && typeof sdk.Client === "function");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("the package's LICENSE is the repository's", () => {
  assert.equal(readFileSync(join(here, "LICENSE"), "utf8"), readFileSync(join(here, "..", "..", "LICENSE"), "utf8"));
});
