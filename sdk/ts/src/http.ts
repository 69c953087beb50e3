// One request path for the SDK's HTTP calls (the read API and the
// operations): the bearer token, JSON bodies, and the API's error body
// {"error":{"code","message"}} as an APIError.

/** An error answer of the fabric's HTTP API. */
export class APIError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(`fabric API: ${status} ${code}: ${message}`);
    this.name = "APIError";
  }
}

/** How a call authenticates and reaches the network. */
export interface HTTPOptions {
  /** A bearer token of the scopes the calls need. */
  token?: string;
  /** Obtains the token for every call. */
  tokenFn?: () => string | Promise<string>;
  fetch?: typeof fetch;
}

/** A call's method, extra headers and JSON body. */
export interface Call {
  method?: string;
  headers?: Record<string, string>;
  body?: unknown;
}

/** Sends one call and decodes its JSON answer; an error answer throws APIError. */
export async function request<T>(opts: HTTPOptions, url: string, call: Call = {}): Promise<T> {
  const token = opts.tokenFn ? await opts.tokenFn() : opts.token;
  const headers: Record<string, string> = { Authorization: `Bearer ${token}`, Accept: "application/json", ...call.headers };
  let body: string | undefined;
  if (call.body !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(call.body);
  }
  const resp = await (opts.fetch ?? fetch)(url, { method: call.method ?? "GET", headers, body });
  const text = await resp.text();
  if (!resp.ok) {
    let e = { code: "", message: text };
    try {
      e = JSON.parse(text).error ?? e;
    } catch {
      // not the API's error body
    }
    throw new APIError(resp.status, e.code, e.message);
  }
  return JSON.parse(text) as T;
}

/** The base of a tenant's hosted client's routes. */
export function clientURL(baseURL: string, tenant: string, clientId: string): string {
  return `${baseURL.replace(/\/+$/, "")}/v1/tenants/${encodeURIComponent(tenant)}/clients/${encodeURIComponent(clientId)}`;
}
