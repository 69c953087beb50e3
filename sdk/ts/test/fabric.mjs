// One helper starts a real all-in-one fabric (go run's binary, built once)
// for the SDK's tests, and talks to its HTTP API.
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createServer } from "node:net";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
let binary;

function build() {
  if (!binary) {
    const dir = mkdtempSync(join(tmpdir(), "fabric-sdk-bin-"));
    binary = join(dir, "fabric");
    execFileSync("go", ["build", "-o", binary, "./cmd/fabric"], { cwd: repo, stdio: "inherit" });
  }
  return binary;
}

export async function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
    srv.on("error", reject);
  });
}

/** A running all-in-one: start() again after stop() restarts it on the same port and data. */
export class Fabric {
  /** args are more flags of fabric run, such as -allowed-origins. */
  constructor(args = []) {
    this.data = mkdtempSync(join(tmpdir(), "fabric-sdk-data-"));
    this.args = args;
    this.proc = null;
  }

  async start() {
    this.port ??= await freePort();
    this.url = `http://127.0.0.1:${this.port}`;
    this.wsURL = `ws://127.0.0.1:${this.port}/v1/events`;
    const proc = spawn(build(), ["run", "-data", this.data, "-listen", `127.0.0.1:${this.port}`, "-nats-listen", "127.0.0.1:0", ...this.args], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    this.proc = proc;
    let out = "";
    let err = "";
    proc.stderr.on("data", (b) => (err += b));
    await new Promise((resolve, reject) => {
      proc.stdout.on("data", (b) => {
        out += b;
        const m = out.match(/^ {2}admin +(\S+)$/m);
        if (m && out.includes("try:")) {
          this.adminToken = m[1];
          this.ingestToken = out.match(/^ {2}ingest +(\S+)$/m)?.[1];
          this.natsURL = out.match(/^ {2}NATS +(\S+)$/m)?.[1];
          resolve();
        }
      });
      proc.on("exit", (code) => reject(new Error(`fabric exited ${code}: ${err}`)));
    });
  }

  async stop() {
    if (!this.proc) return;
    const proc = this.proc;
    this.proc = null;
    const exited = new Promise((resolve) => proc.on("exit", resolve));
    proc.kill("SIGTERM");
    await exited;
  }

  async close() {
    await this.stop();
    rmSync(this.data, { recursive: true, force: true });
  }

  async api(method, path, body, token = this.adminToken) {
    const resp = await fetch(this.url + path, {
      method,
      headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await resp.text();
    if (!resp.ok) throw new Error(`${method} ${path}: ${resp.status} ${text}`);
    return JSON.parse(text);
  }

  /** The fabric binary this helper built (go build ./cmd/fabric, once). */
  binary() {
    return build();
  }

  /** Runs fabric demo against this fabric and returns its hosted client's id. */
  demo() {
    const out = execFileSync(build(), ["demo", "-url", this.url, "-data", this.data, "-pause", "0s", "-watch=false"], { encoding: "utf8" });
    const m = out.match(/-client ([0-9a-f]+)/);
    if (!m) throw new Error(`demo printed no client: ${out}`);
    return m[1];
  }

  /** Registers a hosted client and returns its id. */
  async newClient() {
    const inbox = [...crypto.getRandomValues(new Uint8Array(32))].map((b) => b.toString(16).padStart(2, "0")).join("");
    return (await this.api("POST", "/v1/tenants/dev/clients", { inbox_id: inbox })).client_id;
  }

  /** Mints a connection token for clients, as a page's backend does. */
  async connectionToken(clients, ttlSeconds = 600, scopes = ["events"]) {
    return (await this.api("POST", "/v1/tenants/dev/connection-tokens", { clients, ttl_seconds: ttlSeconds, scopes })).token;
  }

  /** Sets a consent state; each change is one consent.changed event of the client. */
  async consent(client, entity, state) {
    return this.api("PUT", `/v1/tenants/dev/clients/${client}/consent`, { entity_kind: "inbox", entity, state });
  }
}

export const inbox = (n) => n.toString(16).padStart(64, "0");
