// The read API (docs/read-api.md) as pkg/client's Reader: what a hosted
// client holds, its conversations, members, messages, consent and identity
// records. A read issued when an event arrives sees the change the event
// reports (EVENT-010).
import type {
  Bytes,
  ConsentPage,
  ConsentState,
  ContentTypeID,
  Conversation,
  ConversationPage,
  ConversationType,
  IdentityPage,
  MemberList,
  Message,
  MessagePage,
} from "./schema.js";
import { clientURL, request, type HTTPOptions } from "./http.js";

export { APIError } from "./http.js";

/** A page: at most limit records after cursor, a previous page's next_cursor. */
export interface Page {
  limit?: number;
  cursor?: string;
}

export interface ConversationQuery extends Page {
  type?: ConversationType;
  consentState?: ConsentState;
  paused?: boolean;
  updatedSince?: Date;
}

export interface MessageQuery extends Page {
  contentTypes?: ContentTypeID[];
  sentAfter?: Date;
  sentBefore?: Date;
  descending?: boolean;
}

/** A token of scope read (or admin) naming the clients it reads. */
export type ReaderOptions = HTTPOptions;

/** Reads a tenant's hosted clients at the fabric's HTTP API base URL. */
export class Reader {
  constructor(
    private readonly baseURL: string,
    private readonly tenant: string,
    private readonly opts: ReaderOptions,
  ) {}

  /** A page of a client's conversations, newest activity first. */
  conversations(clientId: string, q: ConversationQuery = {}): Promise<ConversationPage> {
    const v = page(q);
    if (q.type) v.set("type", q.type);
    if (q.consentState) v.set("consent_state", q.consentState);
    if (q.paused !== undefined) v.set("paused", String(q.paused));
    if (q.updatedSince) v.set("updated_since", String(q.updatedSince.getTime()));
    return this.get(clientId, "/conversations", v);
  }

  conversation(clientId: string, groupId: Bytes): Promise<Conversation> {
    return this.get(clientId, `/conversations/${groupId}`);
  }

  members(clientId: string, groupId: Bytes): Promise<MemberList> {
    return this.get(clientId, `/conversations/${groupId}/members`);
  }

  /** A page of a conversation's messages in canonical order. */
  messages(clientId: string, groupId: Bytes, q: MessageQuery = {}): Promise<MessagePage> {
    const v = page(q);
    if (q.contentTypes?.length) {
      v.set("content_types", q.contentTypes.map((t) => `${t.authority_id}/${t.type_id}:${t.version_major}`).join(","));
    }
    if (q.sentAfter) v.set("sent_after", String(q.sentAfter.getTime()));
    if (q.sentBefore) v.set("sent_before", String(q.sentBefore.getTime()));
    if (q.descending) v.set("direction", "descending");
    return this.get(clientId, `/conversations/${groupId}/messages`, v);
  }

  message(clientId: string, messageId: Bytes): Promise<Message> {
    return this.get(clientId, `/messages/${messageId}`);
  }

  consent(clientId: string, p: Page = {}): Promise<ConsentPage> {
    return this.get(clientId, "/consent", page(p));
  }

  identities(clientId: string, p: Page = {}): Promise<IdentityPage> {
    return this.get(clientId, "/identities", page(p));
  }

  private get<T>(clientId: string, path: string, q?: URLSearchParams): Promise<T> {
    const qs = q && q.toString() ? `?${q}` : "";
    return request<T>(this.opts, `${clientURL(this.baseURL, this.tenant, clientId)}${path}${qs}`);
  }
}

function page(p: Page): URLSearchParams {
  const v = new URLSearchParams();
  if (p.limit) v.set("limit", String(p.limit));
  if (p.cursor) v.set("cursor", p.cursor);
  return v;
}
