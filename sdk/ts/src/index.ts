// The fabric's client SDK for browsers and Node: subscriptions to a hosted
// client's events over the gateway's WebSocket (subprotocol fabric.v1.json),
// authenticated by a connect frame, with the Go SDK's semantics (pkg/client):
// the 1024 bound counted end to end and lagged (EVENT-030, EVENT-031),
// credit returned as the app takes events, one callback at a time
// (EVENT-050), reconnect with resume from the last stream sequence.
import type { ClientEvent, EventFilter, Frame } from "./schema.js";

export * from "./schema.js";
export * from "./read.js";
export * from "./send.js";

/** The bound of EVENT-030: events held, counted end to end. */
export const initialCredit = 1024;

/** The error codes the gateway's connect close codes stand for. */
export const closeCodes: Record<number, string> = {
  4400: "malformed_frame",
  4401: "unauthenticated",
  4403: "forbidden",
  4408: "connect_timeout",
  4429: "too_many_connections",
};

/** A refusal by the gateway: an error frame, or a connection closed at its connect frame. */
export class GatewayError extends Error {
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(`gateway: ${code}: ${message}`);
    this.name = "GatewayError";
  }
}

/** Why a subscription ended. */
export class EndedError extends Error {
  constructor(
    readonly reason: string,
    readonly cause?: unknown,
  ) {
    super(`subscription ended: ${reason}`);
    this.name = "EndedError";
  }
}

export interface ConnectOptions {
  /** The token of the connect frame: a connection token a backend minted. */
  token?: string;
  /** Obtains the token for every dial, so a reconnect presents a fresh one; subscriptions ended by token_expired then resume. */
  tokenFn?: () => string | Promise<string>;
  /** Reconnect and resume when the connection drops (default true). */
  reconnect?: boolean;
  minBackoffMs?: number;
  maxBackoffMs?: number;
  /** Receives errors no call returns: a callback's error, a dropped connection. */
  onError?: (err: unknown) => void;
  /** The WebSocket class; the global one by default. */
  WebSocket?: typeof WebSocket;
}

export interface SubscribeOptions {
  /** Start from the stream: the client's events stored at or after this time first. */
  since?: Date;
  /** Start from the first of the client's events the stream holds. */
  fromStart?: boolean;
}

interface Item {
  ev: ClientEvent;
  gen: number;
  lagged: boolean;
}

/** A connection to the gateway. */
export class Client {
  private ws: WebSocket | null = null;
  private gen = 0;
  private nextReq = 0;
  private closed = false;
  private readonly subs = new Set<Subscription>();
  private byID = new Map<number, Subscription>();
  private pending = new Map<number, Subscription>();
  private queued: Subscription[] = [];
  private readonly credit = new Set<Subscription>();
  private creditScheduled = false;
  /** @internal */ readonly opts: Required<Omit<ConnectOptions, "token" | "tokenFn">> & Pick<ConnectOptions, "token" | "tokenFn">;

  private constructor(
    private readonly url: string,
    opts: ConnectOptions,
  ) {
    this.opts = {
      reconnect: true,
      minBackoffMs: 100,
      maxBackoffMs: 10_000,
      onError: (err) => console.warn("fabric client", err),
      WebSocket: globalThis.WebSocket,
      ...opts,
    };
  }

  /** Dials the gateway at url (ws:// or wss://, path /v1/events) and returns once the connect frame is accepted. */
  static async connect(url: string, opts: ConnectOptions): Promise<Client> {
    const c = new Client(url, opts);
    const ws = await c.dial();
    c.attach(ws);
    return c;
  }

  private async dial(): Promise<WebSocket> {
    const token = this.opts.tokenFn ? await this.opts.tokenFn() : this.opts.token;
    if (!token) throw new Error("client: no token");
    const ws = new this.opts.WebSocket(this.url, "fabric.v1.json");
    return new Promise((resolve, reject) => {
      let opened = false;
      ws.onopen = () => {
        opened = true;
        ws.send(JSON.stringify({ op: "connect", token }));
      };
      ws.onmessage = (m) => {
        const f = JSON.parse(String(m.data)) as Frame;
        if (f.op === "connected") {
          ws.onmessage = ws.onclose = ws.onerror = null;
          resolve(ws);
        } else {
          ws.close();
          reject(new Error(`client: the gateway answered ${f.op}, not connected`));
        }
      };
      ws.onclose = (e) => {
        const code = closeCodes[e.code];
        reject(code ? new GatewayError(code, e.reason) : new Error(`client: dial: closed ${e.code} ${e.reason}`));
      };
      // A handshake that fails (refused, not 101) may fire error without
      // close (Node 20's WebSocket).
      ws.onerror = () => {
        if (!opened) reject(new Error("client: dial: the WebSocket did not open"));
      };
    });
  }

  private attach(ws: WebSocket): void {
    this.ws = ws;
    this.gen++;
    const gen = this.gen;
    ws.onmessage = (m) => {
      try {
        this.handle(JSON.parse(String(m.data)) as Frame);
      } catch (err) {
        this.opts.onError(err);
      }
    };
    ws.onclose = (e) => {
      if (this.gen === gen && this.ws === ws) this.disconnected(new Error(`connection closed ${e.code} ${e.reason}`));
    };
    ws.onerror = () => {
      if (this.gen === gen && this.ws === ws) {
        ws.close();
        this.disconnected(new Error("connection failed"));
      }
    };
  }

  private send(f: Frame): void {
    this.ws?.send(JSON.stringify(f));
  }

  /** Creates a subscription read with next() or for await; returns once the gateway registered it (EVENT-014). */
  subscribe(clientId: string, filter: EventFilter, opts: SubscribeOptions = {}): Promise<Subscription> {
    return this.start(new Subscription(this, clientId, filter, opts, null));
  }

  /** Creates a subscription read by fn, one event at a time (EVENT-050); an error fn throws goes to onError and ends nothing (EVENT-051). */
  subscribeFn(
    clientId: string,
    filter: EventFilter,
    fn: (ev: ClientEvent) => void | Promise<void>,
    opts: SubscribeOptions = {},
  ): Promise<Subscription> {
    return this.start(new Subscription(this, clientId, filter, opts, fn));
  }

  private start(s: Subscription): Promise<Subscription> {
    if (this.closed) return Promise.reject(new EndedError("closed"));
    if (this.ws) this.request(s, 0, 0);
    else if (this.opts.reconnect) this.queued.push(s);
    else return Promise.reject(new Error("client: disconnected"));
    return s.answer.then(() => {
      if (s.callback) void s.runCallbacks();
      return s;
    });
  }

  /** @internal */
  request(s: Subscription, afterSeq: number, held: number): void {
    s.req = ++this.nextReq;
    s.gen = this.gen;
    this.pending.set(s.req, s);
    const f: Frame = { op: "subscribe", id: s.req, client_id: s.clientId, filter: s.filter };
    if (afterSeq > 0) {
      f.after_seq = afterSeq;
      if (held > 0) f.held = held;
    } else if (s.startTime > 0) f.start_time = s.startTime;
    else if (s.fromStart) f.from_start = true;
    this.send(f);
  }

  /** @internal Ends s: no handoff follows (EVENT-053). */
  end(s: Subscription, why: EndedError, unsubscribe: boolean): void {
    if (s.ended) return;
    s.ended = true;
    s.endErr = why;
    s.buf = [];
    this.subs.delete(s);
    if (s.id !== 0) {
      this.byID.delete(s.id);
      if (unsubscribe) this.send({ op: "unsubscribe", sub: s.id });
    }
    s.wake();
    if (!s.callback) s.markDone();
  }

  /** @internal Returns the credit of a completed handoff. */
  complete(s: Subscription, it: Item): void {
    if (s.ended || (s.id === 0 && s.req === 0)) return;
    // A lagged of an earlier connection was never sent by this one.
    if (it.lagged && it.gen !== s.gen) return;
    s.pendingCredit++;
    this.credit.add(s);
    if (!this.creditScheduled) {
      this.creditScheduled = true;
      queueMicrotask(() => this.flushCredit());
    }
  }

  private flushCredit(): void {
    this.creditScheduled = false;
    for (const s of this.credit) {
      if (s.id === 0 || s.pendingCredit === 0) continue; // awaiting its id
      this.send({ op: "credit", sub: s.id, n: s.pendingCredit });
      s.pendingCredit = 0;
      this.credit.delete(s);
    }
  }

  private handle(f: Frame): void {
    switch (f.op) {
      case "subscribed": {
        const s = this.pending.get(f.id ?? 0);
        if (!s) return;
        this.pending.delete(f.id ?? 0);
        s.req = 0;
        if (s.ended) {
          this.send({ op: "unsubscribe", sub: f.sub });
          return;
        }
        s.id = f.sub ?? 0;
        this.byID.set(s.id, s);
        if (s.lastSeq < (f.seq ?? 0) && s.resumedFrom === 0 && !s.fromStream) s.lastSeq = f.seq ?? 0;
        s.resumedFrom = 0;
        this.subs.add(s);
        if (s.pendingCredit > 0) {
          this.credit.add(s);
          this.flushCredit();
        }
        s.resolve(null);
        return;
      }
      case "event": {
        const s = this.byID.get(f.sub ?? 0);
        if (!s || !f.event) return;
        // The id apps match against withdrawn_event_ids, as the Go SDK's ClientEvent.ID.
        if (f.event_id) f.event.id = f.event_id;
        s.deliver(f.event, f.seq ?? 0, this.gen);
        return;
      }
      case "ended": {
        const s = this.byID.get(f.sub ?? 0);
        if (!s) return;
        const resumable = f.reason === "shutdown" || (f.reason === "token_expired" && this.opts.tokenFn);
        if (resumable && this.opts.reconnect) {
          this.byID.delete(s.id);
          s.id = 0;
          return;
        }
        this.end(s, new EndedError(f.reason ?? "ended"), false);
        return;
      }
      case "error": {
        const err = new GatewayError(f.code ?? "", f.message ?? "");
        const s = f.id ? this.pending.get(f.id) : undefined;
        if (!s) {
          this.opts.onError(err);
          return;
        }
        this.pending.delete(f.id ?? 0);
        s.req = 0;
        if (s.resumedFrom !== 0 || s.answered) this.end(s, new EndedError("resume refused", err), false);
        else s.resolve(err);
        return;
      }
    }
  }

  private disconnected(err: Error): void {
    this.ws = null;
    if (this.closed) return;
    this.opts.onError(new Error(`client: connection lost: ${err.message}`));
    for (const s of this.pending.values()) {
      s.req = 0;
      if (s.answered) continue; // a resume: it is in subs and resumes again
      if (this.opts.reconnect) this.queued.push(s);
      else s.resolve(new Error(`client: disconnected: ${err.message}`));
    }
    this.pending = new Map();
    this.byID = new Map();
    for (const s of this.subs) {
      s.id = 0;
      // Credit owed to the old connection dies with it; events still held
      // here are declared held on resume.
      s.pendingCredit = 0;
      if (!this.opts.reconnect) this.end(s, new EndedError("disconnected", err), false);
    }
    this.credit.clear();
    if (this.opts.reconnect) void this.redial();
  }

  private async redial(): Promise<void> {
    let backoff = this.opts.minBackoffMs;
    while (!this.closed) {
      await new Promise((r) => setTimeout(r, backoff));
      if (this.closed) return;
      try {
        const ws = await this.dial();
        if (this.closed) {
          ws.close();
          return;
        }
        this.attach(ws);
        for (const s of this.subs) {
          s.resumedFrom = s.lastSeq;
          this.request(s, s.lastSeq, s.held());
        }
        const queued = this.queued;
        this.queued = [];
        for (const s of queued) this.request(s, 0, 0);
        return;
      } catch (err) {
        this.opts.onError(err);
        backoff = Math.min(backoff * 2, this.opts.maxBackoffMs);
      }
    }
  }

  /** Ends every subscription and closes the connection; no event is handed off after it returns (EVENT-054). */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const s of [...this.subs]) this.end(s, new EndedError("closed"), false);
    for (const s of [...this.pending.values(), ...this.queued]) s.resolve(new EndedError("closed"));
    this.pending.clear();
    this.queued = [];
    this.ws?.close(1000, "closed");
    this.ws = null;
  }
}

/** One subscription: read it with next() or for await, or give it a callback with subscribeFn. */
export class Subscription implements AsyncIterable<ClientEvent> {
  /** @internal */ id = 0;
  /** @internal */ req = 0;
  /** @internal */ gen = 0;
  /** @internal */ buf: Item[] = [];
  /** @internal */ running: Item | null = null;
  /** @internal */ ended = false;
  /** @internal */ endErr: EndedError | null = null;
  /** @internal */ lastSeq = 0;
  /** @internal */ resumedFrom = 0;
  /** @internal */ pendingCredit = 0;
  /** @internal */ answered = false;
  /** @internal */ readonly answer: Promise<void>;
  /** @internal */ readonly startTime: number;
  /** @internal */ readonly fromStart: boolean;
  /** Resolves once the subscription has ended and, for a callback subscription, its callback has returned. */
  readonly done: Promise<void>;
  private settle!: (err: unknown) => void;
  private finish!: () => void;
  private waiter: (() => void) | null = null;

  /** @internal */
  constructor(
    private readonly c: Client,
    readonly clientId: string,
    readonly filter: EventFilter,
    opts: SubscribeOptions,
    /** @internal */ readonly callback: ((ev: ClientEvent) => void | Promise<void>) | null,
  ) {
    // No kinds selects every kind, as on SSE (issue 28); [] selects none.
    this.filter = { ...filter };
    const ms = opts.since ? opts.since.getTime() : 0;
    this.startTime = ms > 0 ? ms : 0;
    this.fromStart = !!opts.fromStart || (opts.since !== undefined && ms <= 0);
    this.answer = new Promise((resolve, reject) => {
      this.settle = (err) => (err ? reject(err) : resolve());
    });
    this.done = new Promise((resolve) => (this.finish = resolve));
  }

  /** @internal */ get fromStream(): boolean {
    return this.startTime !== 0 || this.fromStart;
  }

  /** @internal */ resolve(err: unknown): void {
    if (this.answered) return;
    this.answered = true;
    this.settle(err);
  }

  /** @internal */ markDone(): void {
    this.finish();
  }

  /** @internal */ wake(): void {
    const w = this.waiter;
    this.waiter = null;
    w?.();
  }

  /** @internal Queues a received event. */
  deliver(ev: ClientEvent, seq: number, gen: number): void {
    if (this.ended) return;
    if (this.buf.length > 2 * initialCredit) {
      throw new Error("client: gateway exceeded the subscription's credit");
    }
    const lagged = ev.kind === "lagged";
    this.buf.push({ ev, gen, lagged });
    // A lagged's seq is the last event it counts: a resume continues after
    // it, so no counted event is replayed (EVENT-001, EVENT-031).
    if (seq > this.lastSeq) this.lastSeq = seq;
    this.wake();
  }

  /** @internal Events held here that the gateway counts against the bound; a lagged is not counted (EVENT-030). */
  held(): number {
    let n = this.buf.filter((it) => !it.lagged).length;
    if (this.running && !this.running.lagged) n++;
    return Math.min(n, initialCredit);
  }

  private async pop(): Promise<Item> {
    for (;;) {
      if (this.ended) throw this.endErr;
      const it = this.buf.shift();
      if (it) return it;
      await new Promise<void>((resolve) => (this.waiter = resolve));
    }
  }

  /** The next event in emission order (EVENT-015); rejects with EndedError once the subscription has ended (EVENT-053). */
  async next(): Promise<ClientEvent> {
    if (this.callback) throw new Error("client: subscription is read by its callback");
    const it = await this.pop();
    this.c.complete(this, it); // the handoff is next() returning
    return it.ev;
  }

  async *[Symbol.asyncIterator](): AsyncIterator<ClientEvent> {
    for (;;) {
      try {
        yield await this.next();
      } catch (err) {
        if (err instanceof EndedError && err.reason === "closed") return;
        throw err;
      }
    }
  }

  /** @internal */
  async runCallbacks(): Promise<void> {
    const fn = this.callback;
    if (!fn) return;
    try {
      for (;;) {
        let it: Item;
        try {
          it = await this.pop();
        } catch {
          return;
        }
        this.running = it;
        try {
          await fn(it.ev);
        } catch (err) {
          this.c.opts.onError(err);
        }
        this.running = null;
        this.c.complete(this, it);
      }
    } finally {
      this.markDone();
    }
  }

  /** Ends the subscription: no event is handed off after it returns; a pending next() rejects (EVENT-053). */
  close(): void {
    this.c.end(this, new EndedError("closed"), true);
  }

  /** Why the subscription ended, or null while it is live. */
  get err(): EndedError | null {
    return this.endErr;
  }
}
