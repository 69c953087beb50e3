// The console at /console/ in real headless Chromium (issue 20): with the
// admin token it lists the tenant's hosted clients, watches the demo's, shows its conversation,
// a live event and the gateway's metrics. Its screenshot goes to
// $CONSOLE_SCREENSHOT (docs/console.png was made with
// CONSOLE_SCREENSHOT=../../docs/console.png npm test), else a temporary file.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { Fabric, inbox } from "./fabric.mjs";

const chromiumPath = process.env.CHROMIUM ?? "/usr/bin/chromium";
const screenshot = process.env.CONSOLE_SCREENSHOT ?? join(tmpdir(), "fabric-console.png");
const fabric = new Fabric();
let browser;

before(async () => {
  await fabric.start();
  if (existsSync(chromiumPath)) browser = await chromium.launch({ executablePath: chromiumPath, args: ["--no-sandbox"] });
});

after(async () => {
  await browser?.close();
  await fabric.close();
});

test("the console lists the tenant's clients and watches one's live events, conversations and metrics", { skip: !existsSync(chromiumPath) && !process.env.CI && `no Chromium at ${chromiumPath}` }, async () => {
  const client = fabric.demo();
  const page = await browser.newPage({ viewport: { width: 1280, height: 820 } });
  await page.goto(`${fabric.url}/console/`);
  await page.waitForFunction(() => document.body.dataset.ready === "true");
  await page.fill("#token", fabric.adminToken);
  // The client is chosen from the tenant's list.
  await page.click("#list-clients");
  await page.waitForSelector(`#client-choice option[value="${client}"]`, { state: "attached" });
  await page.selectOption("#client-choice", client);
  assert.equal(await page.inputValue("#client"), client);
  await page.click("button[type=submit]");
  await page.waitForFunction(() => document.getElementById("status").textContent.startsWith("watching"));
  // The demo's conversation, from the read API.
  await page.waitForSelector("#groups-table tbody tr");
  const group = await page.textContent("#groups-table tbody tr");
  assert.match(group, /^[0-9a-f]+group, epoch \d+/, group);
  await fabric.consent(client, inbox(12), "allowed");
  await page.waitForSelector('#events tr[data-kind="consent.changed"]');
  // One consent change, one row; the demo's own events may still be arriving
  // (converge finishes them after the demo returns), and the count is every row.
  assert.equal(await page.$$eval('#events tr[data-kind="consent.changed"]', (r) => r.length), 1);
  const rows = await page.$$eval("#events tr[data-kind]", (r) => r.length);
  assert.ok(Number(await page.textContent("#count")) >= rows, "the count covers every listed event");
  // The gateway's metrics count the console's own connection and subscription.
  await page.waitForFunction(() => document.querySelector("#metrics tr td:nth-child(2)")?.textContent === "1");
  assert.equal(await page.textContent("#health"), "ready");
  // Its own subscription is among the tenant's, with its queue against the bound.
  await page.waitForFunction((c) => [...document.querySelectorAll("#subs-table tbody tr")].some((r) => r.cells[0]?.textContent === c && r.cells[3]?.textContent.endsWith("/ 1024")), client);
  await page.screenshot({ path: screenshot, fullPage: true });
  await page.close();
});
