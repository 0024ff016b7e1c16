// Every call the dashboard makes to the broker goes through `request`: same origin, JSON in and
// out, and the API's own error message when it refuses. The types mirror the broker's OpenAPI
// document (/openapi.json), the fields the dashboard reads.

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

/**
 * Told of every answer's standing: `false` when the broker answered 401 (the session expired or
 * was never opened), `true` when it took a request again.
 */
let onAuthorization: ((authorized: boolean) => void) | null = null;
export function setAuthorizationHandler(handler: ((authorized: boolean) => void) | null) {
  onAuthorization = handler;
}

/**
 * Sent as `X-CSRF-Token` with every state-changing request once the broker hands one out with a
 * session; empty while the broker runs without users.
 */
let csrfToken = "";
export function setCsrfToken(token: string) {
  csrfToken = token;
}

export async function request<T>(method: string, path: string, body?: unknown): Promise<T> {
  const headers: Record<string, string> = { accept: "application/json" };
  if (body !== undefined) headers["content-type"] = "application/json";
  if (method !== "GET" && csrfToken) headers["x-csrf-token"] = csrfToken;
  let response: Response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "same-origin",
      cache: "no-store",
    });
  } catch (error) {
    throw new ApiError(0, "unreachable", `the broker did not answer (${(error as Error).message})`);
  }
  if (response.ok) onAuthorization?.(true);
  if (response.status === 204) return undefined as T;
  const text = await response.text();
  let parsed: unknown = undefined;
  try {
    parsed = text ? JSON.parse(text) : undefined;
  } catch {
    // Not JSON: reported below with the status.
  }
  if (!response.ok && response.status !== 503) {
    if (response.status === 401) onAuthorization?.(false);
    const detail = (parsed as ErrorBody | undefined)?.error;
    throw new ApiError(
      response.status,
      detail?.code ?? "http_" + response.status,
      detail?.message ?? `HTTP ${response.status} ${response.statusText}`,
    );
  }
  if (response.status === 503 && !(parsed as Status | undefined)?.status) {
    const detail = (parsed as ErrorBody | undefined)?.error;
    throw new ApiError(503, detail?.code ?? "unavailable", detail?.message ?? "the broker is unavailable");
  }
  return parsed as T;
}

export const get = <T>(path: string) => request<T>("GET", path);
export const post = <T>(path: string, body: unknown) => request<T>("POST", path, body);
export const del = (path: string) => request<void>("DELETE", path);

/** A path segment: names are letters, digits, `.`, `_`, `-`, but a typed one may be anything. */
export const seg = (s: string) => encodeURIComponent(s);

interface ErrorBody {
  error?: { code?: string; message?: string };
}

export interface Fault {
  topic: string;
  partition: number;
  damaged: boolean;
  reason: string;
}

export interface Status {
  status: "ok" | "degraded";
  version: string;
  uptime_ms: number;
  topics: number;
  faults: Fault[];
}

export interface Latency {
  count: number;
  mean: number | null;
  p50: number | null;
  p90: number | null;
  p99: number | null;
  p999: number | null;
  max: number | null;
}

export interface SubscriptionStats {
  name: string;
  ephemeral: boolean;
  consumers: number;
  messages_out: number;
  bytes_out: number;
  backlog: number;
  in_flight: number;
  acked: number;
  redelivered: number;
  gave_up: number;
  deliver_latency_us: Latency;
  ack_latency_us: Latency;
  /** Whether an operator paused its deliveries. */
  paused?: boolean;
}

export interface Connection {
  id: number;
  listener: "binary" | "http";
  peer: string;
  user: string;
  client_name: string;
  tls: boolean;
  connected_ms: number;
  subscriptions: number;
  consumers: number;
  messages_in: number;
  bytes_in: number;
  messages_out: number;
  bytes_out: number;
  credit: number;
  unacked: number;
}

export interface ConnectionPage {
  connections: Connection[];
  total: number;
  next_after: number | null;
}

export interface TopicStats {
  name: string;
  messages_in: number;
  bytes_in: number;
  messages_out: number;
  bytes_out: number;
  depth: number;
  depth_bytes: number;
  dropped: number;
  publishers: number;
  subscribers: number;
  subscriptions: SubscriptionStats[];
}

export interface Topic {
  name: string;
  partitions: number;
  storage: "disk" | "memory";
  overflow: string;
  max_messages: number | null;
  max_bytes: number | null;
  fsync: string;
  retention_ms: number | null;
  messages: number;
  bytes: number;
  subscriptions: string[];
}

export interface DeadLetterRef {
  id: string;
  partition: number;
  offset: number;
  /** Once requeued: the id of its copy in the subscription's topic. */
  requeued_as?: string;
}

export type MessageState = "pending" | "delayed" | "in_flight" | "acked" | "dead_lettered" | "settled";

export interface Entry {
  id: string;
  partition: number;
  offset: number;
  state: MessageState;
  attempts: number;
  published_ms: number | null;
  first_delivered_ms: number | null;
  settled_ms: number | null;
  due_ms: number | null;
  result?: string;
  result_base64?: string;
  reason: string | null;
  dead_letter: DeadLetterRef | null;
}

export interface SubscriptionEntry extends Entry {
  subscription: string;
}

export interface MessageStatus {
  topic: string;
  id: string;
  partition: number;
  offset: number;
  published_ms: number;
  priority: number;
  key?: string;
  key_base64?: string;
  body_bytes: number;
  subscriptions: SubscriptionEntry[];
}

export interface MessageContent {
  topic: string;
  id: string;
  published_ms: number;
  priority: number;
  delay_ms: number | null;
  key?: string;
  key_base64?: string;
  headers: [string, string][];
  body?: string;
  body_base64?: string;
  body_bytes: number;
}

export interface MessagePage {
  messages: Entry[];
  next_page: string | null;
}

export interface PublishReply {
  ids: string[];
  durability: string;
}

export interface RequeueReply {
  requeued: number;
  skipped: number;
}

/** A node of the cluster as the answering node sees it (`GET /cluster`); figures `null` when down. */
export interface ClusterNode {
  id: number;
  /** Where clients reach it (its binary protocol listener), once it announced it. */
  addr: string | null;
  up: boolean;
  /** Why it gave no answer (down, unreachable, slower than a second); `null` when it answered. */
  error: string | null;
  version: string | null;
  uptime_ms: number | null;
  resident_bytes: number | null;
  disk_total_bytes: number | null;
  disk_available_bytes: number | null;
  disk_used_bytes: number | null;
  /** How many partitions it leads, and of how many it holds a replica. */
  leader_of: number | null;
  replica_of: number | null;
}

export interface ClusterFollower {
  node: number;
  /** Entries behind the leader; `null`: nothing known to be replicated to it yet. */
  lag_entries: number | null;
}

export interface ClusterPartition {
  topic: string;
  partition: number;
  group: number;
  /** `null` while the partition's group elects. */
  leader: number | null;
  replicas: number[];
  followers: ClusterFollower[];
  under_replicated: boolean;
}

export interface ClusterElection {
  group: number;
  /** `null` for the metadata group (group 0). */
  topic: string | null;
  partition: number | null;
  term: number;
  leader: number;
  /** When the answering node first saw it. */
  at_ms: number;
}

export interface ClusterState {
  cluster_id: string;
  /** The node that answered. */
  node_id: number;
  /** `null` while the metadata group elects. */
  metadata_leader: number | null;
  nodes: ClusterNode[];
  partitions: ClusterPartition[];
  under_replicated: number;
  /** Leader changes the answering node saw, newest first. */
  elections: ClusterElection[];
}
