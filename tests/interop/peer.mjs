// A remote RFC 9420 member written with ts-mls, an MLS implementation
// independent of the fabric's (docs/interop.md): it holds one group, reads
// the fabric's output from the transport endpoint it serves (where `fabric
// bridge` posts), and writes to the fabric's transport endpoint in the
// fabric-native/1 binding (docs/protocol.md).
import { createServer } from "node:http";
import { createHash, createCipheriv, createDecipheriv, randomBytes } from "node:crypto";
import { decode, encode } from "@msgpack/msgpack";
import {
  createApplicationMessage,
  createCommit,
  decodeMlsMessage,
  defaultCapabilities,
  defaultLifetime,
  emptyPskIndex,
  encodeMlsMessage,
  generateKeyPackage,
  getCiphersuiteFromName,
  getCiphersuiteImpl,
  joinGroup,
  mlsExporter,
  processPrivateMessage,
  processPublicMessage,
} from "ts-mls";

/** The fabric's cipher suite, 0x0001 (docs/protocol.md). */
export const SUITE = "MLS_128_DHKEMX25519_AES128GCM_SHA256_Ed25519";
/** The components GroupContext extension (docs/mls-engine.md). */
export const COMPONENTS = 0xf0fa;
const PROFILE = 0x8001;

export const hex = (b) => Buffer.from(b).toString("hex");
export const unhex = (s) => new Uint8Array(Buffer.from(s, "hex"));
export const messageID = (mls) => createHash("sha256").update(mls).digest("hex");

/** seal is fabric-native/1 sealing: nonce(12) || ChaCha20-Poly1305(key, nonce, mls, aad ""). */
export function seal(key, mls) {
  const nonce = randomBytes(12);
  const c = createCipheriv("chacha20-poly1305", key, nonce, { authTagLength: 16 });
  return Buffer.concat([nonce, c.update(mls), c.final(), c.getAuthTag()]);
}

function open(key, payload) {
  if (payload.length < 28) return undefined;
  const d = createDecipheriv("chacha20-poly1305", key, payload.subarray(0, 12), { authTagLength: 16 });
  d.setAuthTag(payload.subarray(payload.length - 16));
  try {
    return Buffer.concat([d.update(payload.subarray(12, payload.length - 16)), d.final()]);
  } catch {
    return undefined;
  }
}

/** textPayload is an xmtp.org/text:1.0 app payload (docs/protocol.md). */
export function textPayload(text) {
  return encode({
    content_type: { authority_id: "xmtp.org", type_id: "text", version_major: 1, version_minor: 0 },
    parameters: {},
    content: new TextEncoder().encode(text),
  });
}

// MLS variable-length integers (RFC 9420 §2.1.2), as the components codec
// uses them.
function readV(b, i) {
  const prefix = b[i] >> 6;
  if (prefix === 0) return [b[i], i + 1];
  if (prefix === 1) return [((b[i] & 0x3f) << 8) | b[i + 1], i + 2];
  if (prefix === 2) return [((b[i] & 0x3f) * 2 ** 24) + (b[i + 1] << 16) + (b[i + 2] << 8) + b[i + 3], i + 4];
  throw new Error("components: bad varint");
}

function writeV(n) {
  if (n < 64) return [n];
  if (n < 16384) return [0x40 | (n >> 8), n & 0xff];
  return [0x80 | (n >>> 24), (n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff];
}

const vec = (bytes) => [...writeV(bytes.length), ...bytes];

/** decodeComponents reads AppComponents into a Map of component id to body. */
export function decodeComponents(data) {
  const out = new Map();
  let [len, i] = readV(data, 0);
  const end = i + len;
  while (i < end) {
    const id = (data[i] << 8) | data[i + 1];
    let n;
    [n, i] = readV(data, i + 2);
    out.set(id, data.subarray(i, i + n));
    i += n;
  }
  return out;
}

function encodeComponents(entries) {
  const body = [];
  for (const id of [...entries.keys()].sort((a, b) => a - b)) {
    body.push(id >> 8, id & 0xff, ...vec(entries.get(id)));
  }
  return new Uint8Array(vec(body));
}

/** groupName reads the profile component's name. */
export function groupName(entries) {
  const p = entries.get(PROFILE);
  if (!p) return undefined;
  const [n, i] = readV(p, 0);
  return new TextDecoder().decode(p.subarray(i, i + n));
}

function withName(entries, name) {
  const p = entries.get(PROFILE);
  let desc = new Uint8Array();
  if (p) {
    const [n, i] = readV(p, 0);
    const [m, j] = readV(p, i + n);
    desc = p.subarray(j, j + m);
  }
  const next = new Map(entries);
  next.set(PROFILE, new Uint8Array([...vec(new TextEncoder().encode(name)), ...vec(desc)]));
  return next;
}

/**
 * Peer is one ts-mls member. Messages the fabric posts to its endpoint wait
 * in arrival order until it holds the key that opens them; what ts-mls
 * refuses is kept in refusals, with its reason.
 */
export class Peer {
  static async create() {
    const impl = await getCiphersuiteImpl(getCiphersuiteFromName(SUITE));
    const identity = randomBytes(32);
    const caps = defaultCapabilities();
    caps.extensions = [...caps.extensions, COMPONENTS];
    const kp = await generateKeyPackage({ credentialType: "basic", identity }, caps, defaultLifetime, [], impl);
    return new Peer(impl, identity, kp);
  }

  constructor(impl, identity, kp) {
    this.impl = impl;
    this.inbox = hex(identity);
    this.kp = kp;
    this.state = undefined;
    this.keys = new Map(); // epoch -> group event key
    this.pending = []; // transport messages not opened yet
    this.received = []; // decrypted app payloads
    this.refusals = []; // {what, reason}
    this.posts = 0;
  }

  keyPackage() {
    return encodeMlsMessage({ keyPackage: this.kp.publicPackage, wireformat: "mls_key_package", version: "mls10" });
  }

  get epoch() {
    return this.state?.groupContext.epoch;
  }

  get groupID() {
    return this.state && hex(this.state.groupContext.groupId);
  }

  /** components reads the group's components extension. */
  components() {
    const ext = this.state.groupContext.extensions.find((e) => e.extensionType === COMPONENTS);
    return ext && decodeComponents(ext.extensionData);
  }

  /** memberLeaf returns the leaf index of an inbox's first leaf. */
  memberLeaf(inbox) {
    for (const [i, n] of this.state.ratchetTree.entries()) {
      if (n?.nodeType === "leaf" && hex(n.leaf.credential.identity) === inbox) return i / 2;
    }
    return undefined;
  }

  members() {
    return this.state.ratchetTree.filter((n) => n?.nodeType === "leaf").map((n) => hex(n.leaf.credential.identity));
  }

  get removed() {
    return this.state?.groupActiveState.kind === "removedFromGroup";
  }

  async adopt(state) {
    this.state = state;
    if (!this.removed) {
      const key = await mlsExporter(state.keySchedule.exporterSecret, "fabric", new TextEncoder().encode("group-event"), 32, this.impl);
      this.keys.set(state.groupContext.epoch, Buffer.from(key));
    }
  }

  /** listen serves the transport endpoint `fabric bridge` posts to. */
  async listen() {
    this.server = createServer((req, res) => {
      const chunks = [];
      req.on("data", (c) => chunks.push(c));
      req.on("end", () => {
        if (req.method !== "POST" || !/^\/v1\/tenants\/[^/]+\/transport$/.test(req.url)) {
          res.writeHead(404, { "Content-Type": "application/json" }).end(JSON.stringify({ error: { code: "not_found", message: "no such route" } }));
          return;
        }
        let msgs;
        try {
          const body = decode(Buffer.concat(chunks));
          msgs = (body.messages ?? [body]).map((m) => (m instanceof Uint8Array ? decode(m) : m));
        } catch (e) {
          res.writeHead(400, { "Content-Type": "application/json" }).end(JSON.stringify({ error: { code: "bad_request", message: String(e) } }));
          return;
        }
        this.posts++;
        const results = msgs.map((m) => {
          this.pending.push(m);
          return { message_id: messageID(m.payload), status: "queued" };
        });
        res.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify({ results }));
        this.pump();
      });
    });
    await new Promise((r) => this.server.listen(0, "127.0.0.1", r));
    this.url = `http://127.0.0.1:${this.server.address().port}`;
  }

  close() {
    this.server?.close();
  }

  /** pump processes what waits, one at a time, until nothing more opens. */
  pump() {
    this.pumping = (this.pumping ?? Promise.resolve()).then(async () => {
      for (let progress = true; progress; ) {
        progress = false;
        for (const m of [...this.pending]) {
          if (await this.take(m)) {
            this.pending.splice(this.pending.indexOf(m), 1);
            progress = true;
          }
        }
      }
    });
    return this.pumping;
  }

  /** take processes one transport message; false while no key opens it. */
  async take(m) {
    let mls = m.payload;
    if (m.kind === "sealed") {
      mls = undefined;
      for (const key of this.keys.values()) {
        if ((mls = open(key, Buffer.from(m.payload)))) break;
      }
      if (!mls) return false;
    }
    const msg = decodeMlsMessage(mls, 0)?.[0];
    try {
      switch (msg?.wireformat) {
        case "mls_welcome":
          if (!this.state) {
            await this.adopt(await joinGroup(msg.welcome, this.kp.publicPackage, this.kp.privatePackage, emptyPskIndex, this.impl));
          }
          return true;
        case "mls_public_message": {
          if (this.removed) return true;
          if (msg.publicMessage.content.epoch < this.epoch) return true; // a past epoch: a commit lost, or one this peer joined after
          const r = await processPublicMessage(this.state, msg.publicMessage, emptyPskIndex, this.impl);
          await this.adopt(r.newState);
          return true;
        }
        case "mls_private_message": {
          const r = await processPrivateMessage(this.state, msg.privateMessage, emptyPskIndex, this.impl);
          this.state = r.newState;
          if (r.kind === "applicationMessage") this.received.push(decode(r.message));
          return true;
        }
      }
      this.refusals.push({ what: `a ${msg?.wireformat ?? "malformed"} message`, reason: "not handled" });
    } catch (e) {
      this.refusals.push({ what: msg.wireformat, reason: e.message });
    }
    return true;
  }

  /** text returns a sealed application message of the current epoch. */
  async text(text) {
    const r = await createApplicationMessage(this.state, textPayload(text), this.impl);
    const mls = encodeMlsMessage({ privateMessage: r.privateMessage, wireformat: "mls_private_message", version: "mls10" });
    const sealed = seal(this.keys.get(this.epoch), mls);
    this.state = r.newState;
    return { id: messageID(mls), kind: "sealed", payload: sealed };
  }

  /**
   * commit makes a commit of proposals as a PublicMessage, sealed under the
   * current epoch's key, and its Welcome when it adds (the ratchet tree in
   * its GroupInfo unless treeInWelcome is false); next is the state after
   * it, to adopt once the fabric accepted it.
   */
  async commit(proposals = [], { treeInWelcome = true } = {}) {
    const r = await createCommit(
      { state: this.state, cipherSuite: this.impl },
      { extraProposals: proposals, wireAsPublicMessage: true, ratchetTreeExtension: treeInWelcome },
    );
    const mls = encodeMlsMessage(r.commit);
    const out = { id: messageID(mls), kind: "sealed", payload: seal(this.keys.get(this.epoch), mls), next: r.newState };
    if (r.welcome) {
      const w = encodeMlsMessage({ welcome: r.welcome, wireformat: "mls_welcome", version: "mls10" });
      out.welcome = { id: messageID(w), kind: "mls", payload: w };
    }
    return out;
  }

  /** rename is a GroupContextExtensions proposal setting the group's name. */
  renameProposal(name) {
    const extensions = this.state.groupContext.extensions.map((e) =>
      e.extensionType === COMPONENTS ? { extensionType: COMPONENTS, extensionData: encodeComponents(withName(this.components(), name)) } : e,
    );
    return { proposalType: "group_context_extensions", groupContextExtensions: { extensions } };
  }

  addProposal(keyPackageHex) {
    const m = decodeMlsMessage(unhex(keyPackageHex), 0)?.[0];
    if (m?.wireformat !== "mls_key_package") throw new Error("not a KeyPackage");
    return { proposalType: "add", add: { keyPackage: m.keyPackage } };
  }

  removeProposal(inbox) {
    return { proposalType: "remove", remove: { removed: this.memberLeaf(inbox) } };
  }
}
