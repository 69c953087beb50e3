// The SDK in real headless Chromium (issue 20): a page served from another
// origin connects with a connection token in its connect frame, subscribes
// with a filter, stalls into lagged, resumes after the server restarts, and
// reads through the read API (CORS).
// Debian's chromium, driven by playwright-core; .ci/run installs both (and
// fails without them; elsewhere the test skips).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { createServer } from "node:http";
import { join, dirname, normalize } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";
import { Fabric, freePort, inbox } from "./fabric.mjs";

const chromiumPath = process.env.CHROMIUM ?? "/usr/bin/chromium";
const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const fabric = new Fabric(["-allowed-origins", "127.0.0.1:*"]);
let pages, browser, pageURL;

before(async () => {
  await fabric.start();
  // The page and the SDK from another origin than the gateway's.
  pages = createServer((req, res) => {
    const path = normalize(new URL(req.url, "http://x").pathname);
    const file = path === "/" ? join(root, "test", "page", "index.html") : join(root, path);
    if (!file.startsWith(root) || !existsSync(file)) {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { "Content-Type": file.endsWith(".js") ? "text/javascript" : "text/html" });
    res.end(readFileSync(file));
  });
  const port = await freePort();
  await new Promise((resolve) => pages.listen(port, "127.0.0.1", resolve));
  pageURL = `http://127.0.0.1:${port}/`;
  browser = await chromium.launch({ executablePath: chromiumPath, args: ["--no-sandbox"] });
});

after(async () => {
  await browser?.close();
  pages?.close();
  await fabric.close();
});

test("in Chromium: connect frame, filter, lagged after 1024, resume after a restart, the read API from another origin", { skip: !existsSync(chromiumPath) && !process.env.CI && `no Chromium at ${chromiumPath}` }, async () => {
  const client = await fabric.newClient();
  const token = await fabric.connectionToken([client], 600, ["events", "read"]);
  const page = await browser.newPage();
  await page.goto(`${pageURL}#${new URLSearchParams({ ws: fabric.wsURL, token, client })}`);
  await page.waitForFunction(() => document.title === "ready");
  await page.evaluate(() => window.fabricTest.subscribe(["consent.changed"]));

  // The page stalls: 1100 events, of which it holds 1024 and one lagged counts the rest.
  const total = 1100;
  for (let i = 0; i < total; i++) await fabric.consent(client, inbox(8), i % 2 === 0 ? "allowed" : "denied");
  const got = await page.evaluate((n) => window.fabricTest.drain(n), total);
  assert.deepEqual(got, { received: 1024, discarded: total - 1024, lagged: 1 });

  // The resume continues after the lagged's sequence: none of the counted
  // events comes back.
  await fabric.stop();
  await fabric.start();
  await fabric.consent(client, inbox(10), "allowed");
  assert.equal(await page.evaluate(() => window.fabricTest.next()), inbox(10));
  assert.equal(await page.evaluate(() => window.fabricTest.held()), 0);
  // The page reads through the read API from its own origin (CORS): the
  // consent records of the two entities it changed.
  assert.equal(await page.evaluate(() => window.fabricTest.consent()), 2);
  await page.close();
});
