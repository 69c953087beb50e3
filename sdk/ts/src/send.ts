// The operations API (docs/outbound.md) as pkg/client's Operations: a
// hosted client creates conversations, sends, adds and removes members,
// changes components, leaves and updates its leaf. Each call takes an
// idempotency key: the same key and request from the same client on the
// same route and conversation is the same operation, sent once however
// often it is called (the key with another request is refused 409). A call returns once
// the operation is stored; operation() reads how it went, and the
// client's events report it (conversation.joined with origin created,
// message.status_changed, …).
import type {
  Bytes,
  ConversationChanges,
  CreateConversation,
  Operation,
  OperationAccepted,
  SendMessage,
} from "./schema.js";
import { clientURL, request, type HTTPOptions } from "./http.js";

/** A token of scope send (or admin) naming the clients it speaks for. */
export type OperationsOptions = HTTPOptions;

/** Makes a tenant's hosted clients speak, at the fabric's HTTP API base URL. */
export class Operations {
  constructor(
    private readonly baseURL: string,
    private readonly tenant: string,
    private readonly opts: OperationsOptions,
  ) {}

  /** Creates a group ({name} alone: the client is its only member) or, with dm_key_package, a DM. */
  createConversation(clientId: string, idempotencyKey: string, body: CreateConversation): Promise<OperationAccepted> {
    return this.op(clientId, "POST", "/conversations", idempotencyKey, body);
  }

  /** Sends a text message. */
  sendText(clientId: string, groupId: Bytes, idempotencyKey: string, text: string): Promise<OperationAccepted> {
    return this.send(clientId, groupId, idempotencyKey, { text });
  }

  /** Sends an application message: a text, a reply, a reaction, a deletion or another content type's bytes. */
  send(clientId: string, groupId: Bytes, idempotencyKey: string, msg: SendMessage): Promise<OperationAccepted> {
    return this.op(clientId, "POST", `/conversations/${groupId}/messages`, idempotencyKey, msg);
  }

  /** Adds the members of the KeyPackages (hex) in one commit; each gets a Welcome. */
  addMembers(clientId: string, groupId: Bytes, idempotencyKey: string, keyPackages: Bytes[]): Promise<OperationAccepted> {
    return this.op(clientId, "POST", `/conversations/${groupId}/members`, idempotencyKey, { key_packages: keyPackages });
  }

  /** Removes every installation of an inbox. */
  removeMember(clientId: string, groupId: Bytes, idempotencyKey: string, inboxId: string): Promise<OperationAccepted> {
    return this.op(clientId, "DELETE", `/conversations/${groupId}/members/${encodeURIComponent(inboxId)}`, idempotencyKey);
  }

  /** Changes the components the changes name. */
  updateConversation(clientId: string, groupId: Bytes, idempotencyKey: string, changes: ConversationChanges): Promise<OperationAccepted> {
    return this.op(clientId, "PATCH", `/conversations/${groupId}`, idempotencyKey, changes);
  }

  /** Publishes the client's leave request; another member commits it. */
  leave(clientId: string, groupId: Bytes, idempotencyKey: string): Promise<OperationAccepted> {
    return this.op(clientId, "POST", `/conversations/${groupId}/leave`, idempotencyKey);
  }

  /** Commits a new leaf for the client (post-compromise security). */
  selfUpdate(clientId: string, groupId: Bytes, idempotencyKey: string): Promise<OperationAccepted> {
    return this.op(clientId, "POST", `/conversations/${groupId}/update`, idempotencyKey);
  }

  /** Reads an operation's current record. */
  operation(clientId: string, operationId: Bytes): Promise<Operation> {
    return request<Operation>(this.opts, `${clientURL(this.baseURL, this.tenant, clientId)}/operations/${operationId}`);
  }

  private op(clientId: string, method: string, path: string, idempotencyKey: string, body?: unknown): Promise<OperationAccepted> {
    return request<OperationAccepted>(this.opts, clientURL(this.baseURL, this.tenant, clientId) + path, {
      method,
      headers: { "Idempotency-Key": idempotencyKey },
      body,
    });
  }
}
