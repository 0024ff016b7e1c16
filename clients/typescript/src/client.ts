// The client: one connection (TCP or TLS) with HELLO, heartbeats, pipelined requests matched by
// id, a bounded window of unconfirmed publishes, consumers, and reconnection with backoff that
// subscribes again. In a cluster it also knows the nodes (CLUSTER_INFO) and sends what needs a
// leader (publishes, topic creation and deletion) to that leader, over connections of its own
// to the other nodes (peers), following the leader after not_leader or a lost connection.
//
// Invariants:
// - every request waiting for an answer is in `pending` under a unique non-zero id, and leaves
//   it exactly once: answered, failed with the connection, or timed out;
// - messages in unconfirmed PUBLISH frames never exceed `publishWindow` (one batch larger than
//   the window may go alone), so a stalled broker stalls publishers instead of growing memory;
// - every promise the client creates internally has a handler: errors reach the caller of the
//   request or `onError`, never an unhandled rejection.

import { isIP, connect as netConnect, type Socket } from "node:net";
import { connect as tlsConnect, type ConnectionOptions as TlsOptions } from "node:tls";

import {
  Action,
  type ActionName,
  beginFrame,
  CLOSING_ERROR_CODES,
  encodeFrame,
  endFrame,
  FrameStream,
  type Durability,
  type Frame,
  type FrameInput,
  type FrameType,
  type ListKind,
  type MessageEntry,
  type MessageInput,
  type MessageStatusInfo,
  type Range,
  Role,
  type RoleName,
  type TokenEntry,
  type TopicConfig,
  type TopicConfigInput,
  type TopicInfo,
  type TopicStats,
  type U64Input,
  type ClusterInfo,
  type ConnectionEntry,
  type UserEntry,
  validateMessage,
  writeRecord,
  Opcode,
} from "./codec.js";
import { ConnectionError, FerryMQError, NotLeaderError, ServerError, serverError, TimeoutError, TopicConfigMismatch } from "./errors.js";
import {
  BATCH_COUNT_MAX,
  FRAME_BYTES_DEFAULT,
  FRAME_HEADER_BYTES,
  NAME_BYTES_MAX,
  NO_PARTITION,
  PROTOCOL_VERSION,
} from "./limits.js";
import { DEDUP_ID_HEADER, toBytes, toMessageInput, type BytesLike, type OutgoingMessage } from "./message.js";
import { type Attachment, Subscription, type SubscribeOptions } from "./subscription.js";
import { ProtocolError, Writer } from "./wire.js";

export interface ReconnectOptions {
  /** First wait after a loss; doubled after each failed attempt, with jitter. */
  initialDelayMs?: number;
  maxDelayMs?: number;
  /** Attempts before giving up; unbounded by default. */
  maxAttempts?: number;
}

export interface ClientOptions {
  /**
   * `host:port`, or several separated by commas (the nodes of a cluster); `$FERRYMQ_ADDR` by
   * default (commas too), else 127.0.0.1:7070.
   */
  url?: string;
  /**
   * Seed addresses of a cluster's nodes, `host:port` each: the client connects to the first
   * that answers and learns the others from it (CLUSTER_INFO). Takes precedence over `url`.
   */
  urls?: string[];
  host?: string;
  port?: number;
  user?: string;
  password?: string;
  /** An API token: sent as HELLO with an empty user and the token as password. */
  token?: string;
  /** TLS with these node:tls options (`true` for the defaults). */
  tls?: boolean | TlsOptions;
  clientName?: string;
  /** Wished heartbeat interval; 0 takes the server's (5000 ms). */
  heartbeatMs?: number;
  connectTimeoutMs?: number;
  /** How long a request waits for its answer; 30 s by default, 0 for ever. */
  requestTimeoutMs?: number;
  /** Messages in unconfirmed publishes at most; 100 000 by default. */
  publishWindow?: number;
  /** Reconnect after a lost connection (on by default; `false` to fail instead). */
  reconnect?: boolean | ReconnectOptions;
  /**
   * Errors no request is waiting for: ERROR pushes, handler failures, reconnect attempts.
   * Without it they are emitted as process warnings (`FerryMQWarning`).
   */
  onError?: (error: unknown) => void;
  /** Called after each successful reconnection. */
  onReconnect?: () => void;
  /**
   * Opt-in: `connect` keeps trying (with the reconnect backoff) for up to this many ms while
   * the broker cannot be reached, for a broker that is not up yet. Absent or 0: the first
   * failure rejects. A refusal by the broker (bad credentials) rejects at once.
   */
  waitOnFirstConnectMs?: number;
  /**
   * How long a request that needs a leader (a publish, creating or deleting a topic) follows
   * a cluster's leaders, after not_leader or a lost connection, before it fails with the last
   * error; 15 000 ms by default, negative: never follows. A publish whose outcome is unknown
   * (sent, the connection lost before the answer) is sent again only when every message of it
   * has a deduplication id; otherwise it fails with a ConnectionError (`outcomeUnknown`).
   */
  leaderTimeoutMs?: number;
}

export interface PublishOptions {
  /** An explicit partition (a custom resolver); the broker chooses by key when absent. */
  partition?: number;
}

export interface PublishReceipt {
  /** `<partition>-<offset>` */
  id: string;
  partition: number;
  offset: bigint;
  durability: Durability;
}

export class BatchReceipt {
  readonly durability: Durability;
  /** The offsets assigned, in message order. */
  readonly ranges: Range[];
  readonly count: number;

  constructor(durability: Durability, ranges: Range[]) {
    this.durability = durability;
    this.ranges = ranges;
    let n = 0;
    for (const r of ranges) n += r.count;
    this.count = n;
  }

  /** The id of each message, in the order published. */
  ids(): string[] {
    const out: string[] = [];
    for (const r of this.ranges) for (let i = 0; i < r.count; i++) out.push(`${r.partition}-${r.offset + BigInt(i)}`);
    return out;
  }
}

export type RequeueSelectionInput =
  | { kind: "all" }
  | { kind: "range"; partition: number; firstOffset: U64Input; lastOffset: U64Input };

/** Roles as bits ({@link Role}) or by name: `["monitor"]`. */
export type RolesInput = number | readonly RoleName[];

/** Topic actions as bits ({@link Action}) or by name: `["publish", "consume"]`. */
export type ActionsInput = number | readonly ActionName[];

/**
 * A new API token, returned once by {@link Client.createToken}: the broker keeps only its
 * SHA-256. The token is a non-enumerable property, so that logging or serialising the object
 * (console.log, JSON.stringify, util.inspect) never shows it; read `created.token` to use it.
 */
export class CreatedToken {
  readonly name: string;
  /** Unix ms after which the token is refused; 0n = never. */
  readonly expiresMs: bigint;
  declare readonly token: string;

  constructor(name: string, token: string, expiresMs: bigint) {
    this.name = name;
    this.expiresMs = expiresMs;
    Object.defineProperty(this, "token", { value: token, enumerable: false, writable: false });
  }

  toString(): string {
    return `CreatedToken(${this.name}, token <redacted>, expires ${this.expiresMs === 0n ? "never" : `${this.expiresMs} ms`})`;
  }

  toJSON(): { name: string; expiresMs: string } {
    return { name: this.name, expiresMs: this.expiresMs.toString() };
  }

  [Symbol.for("nodejs.util.inspect.custom")](): string {
    return this.toString();
  }
}

function bitsOf<K extends string>(input: number | readonly K[], table: Record<K, number>, what: string): number {
  if (typeof input === "number") return input;
  let bits = 0;
  for (const name of input) {
    const bit = table[name];
    if (bit === undefined) {
      throw new FerryMQError("invalid_argument", `unknown ${what} ${JSON.stringify(name)}; one of ${Object.keys(table).join(", ")}`);
    }
    bits |= bit;
  }
  return bits;
}

interface Pending {
  expect: FrameType;
  resolve: (f: Frame) => void;
  reject: (e: unknown) => void;
  timer: ReturnType<typeof setTimeout> | null;
  /** Messages this request holds in the publish window. */
  window: number;
  /** Runs as the answer is routed, before any later frame of the same read. */
  onAnswer: ((f: Frame) => void) | undefined;
}

interface ServerInfo {
  version: number;
  heartbeatMs: number;
  frameBytesMax: number;
  messageBytesMax: number;
  server: string;
}

const DEFAULT_PORT = 7070;
/** Handshake refusals that do not change by trying again. */
const REFUSALS = new Set(["authentication_failed", "unsupported_version"]);
const DEFAULT_REQUEST_TIMEOUT_MS = 30_000;
const DEFAULT_CONNECT_TIMEOUT_MS = 10_000;
const DEFAULT_PUBLISH_WINDOW = 100_000;
const DEFAULT_LEADER_TIMEOUT_MS = 15_000;
/** The route of a request that needs the cluster metadata's leader. */
const METADATA_ROUTE = "\u0000metadata";
const textEncoder = new TextEncoder();

type State = "connecting" | "connected" | "reconnecting" | "closed";

/** Parses `host:port` (or `[v6]:port`, or a bare host). */
function parseUrl(url: string): { host: string; port: number } {
  const trimmed = url.trim().replace(/^ferrymq(s)?:\/\//, "");
  const m = /^(\[[^\]]+\]|[^:]+)(?::(\d+))?$/.exec(trimmed);
  if (!m) throw new FerryMQError("invalid_argument", `"${url}" is not host:port`);
  const port = m[2] ? Number(m[2]) : DEFAULT_PORT;
  if (port < 1 || port > 65535) throw new FerryMQError("invalid_argument", `"${url}": port ${port} is not within 1..=65535`);
  return { host: m[1]!.replace(/^\[|\]$/g, ""), port };
}

/** `host:port`, with brackets around an IPv6 host. */
function formatAddr(host: string, port: number): string {
  return isIP(host) === 6 ? `[${host}]:${port}` : `${host}:${port}`;
}

/** The route of a request that needs the leader of a partition (-1: the broker picks it). */
function partitionRoute(topic: string, partition: number): string {
  return `${topic}\u0000${partition}`;
}

/** Whether every message carries a deduplication id, which makes sending the batch again safe. */
function allDeduplicated(messages: readonly (OutgoingMessage | BytesLike)[]): boolean {
  if (messages.length === 0) return false;
  for (const m of messages) {
    if (typeof m === "string" || m instanceof Uint8Array) return false;
    if (m.dedupId !== undefined && m.dedupId !== "") continue;
    const headers = m.headers === undefined ? [] : Array.isArray(m.headers) ? m.headers : Object.entries(m.headers);
    if (!headers.some(([name, value]) => name === DEDUP_ID_HEADER && value !== "")) return false;
  }
  return true;
}

/**
 * Whether a request that failed with `error` may go to the leader again: it was not carried
 * out (not_leader, shutting_down, never sent), or sending it twice is harmless (`safe`).
 */
function followable(error: unknown, safe: boolean): boolean {
  if (error instanceof NotLeaderError) return true;
  // storage_unavailable stored nothing; in a cluster it also answers a dedup id whose first
  // publish is still being replicated: sent again once that one is answered.
  if (error instanceof ServerError) return error.code === "shutting_down" || (safe && error.code === "storage_unavailable");
  if (error instanceof ConnectionError) return !error.outcomeUnknown || safe;
  if (error instanceof TimeoutError) return safe;
  return false;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

export class Client {
  private readonly options: ClientOptions;
  private host: string;
  private port: number;
  /** The addresses given, `host:port` each: where (re)connecting starts. */
  private readonly seeds: string[];
  /** A connection to one node that another client made (a peer): no discovery, no following. */
  private readonly isNode: boolean;
  private readonly leaderTimeoutMs: number;
  /** A node said it belongs to a cluster. */
  private clustered = false;
  /** Node id (decimal) → client address, as the cluster named them. */
  private nodes = new Map<string, string>();
  /** Route → the address of the node last found to lead it. */
  private routes = new Map<string, string>();
  /** Connections to other nodes, by address. */
  private peers = new Map<string, Client>();
  private dialing = new Map<string, Promise<Client>>();
  private endedResolve!: (error: unknown) => void;
  /** @internal resolves with the reason once the client has closed for good. */
  readonly ended: Promise<unknown> = new Promise((resolve) => (this.endedResolve = resolve));
  private socket: Socket | null = null;
  /** Deliveries of a known consumer are decoded straight into its Messages. */
  private readonly makeDelivery = (consumerId: number) => this.consumers.get(consumerId)?.makeMessage ?? null;
  private stream = new FrameStream(FRAME_BYTES_DEFAULT, this.makeDelivery);
  private state: State = "connecting";
  private pending = new Map<number, Pending>();
  private nextId = 1;
  private generation = 0;
  private consumers = new Map<number, Attachment>();
  private subscriptions = new Set<Subscription>();
  private info: ServerInfo | null = null;
  private heartbeat: ReturnType<typeof setInterval> | null = null;
  private lastSent = 0;
  private lastReceived = 0;
  private corked = false;
  private windowUsed = 0;
  private windowWaiters: { n: number; resolve: () => void; reject: (e: unknown) => void }[] = [];
  private readyWaiters: { resolve: () => void; reject: (e: unknown) => void }[] = [];
  private readonly requestTimeoutMs: number;
  private readonly publishWindow: number;
  /** The refusal that ended reconnection: what later requests fail with. */
  private refusal: ServerError | null = null;

  private constructor(options: ClientOptions, isNode = false) {
    this.options = options;
    this.isNode = isNode;
    const url = options.url ?? (globalThis.process?.env?.FERRYMQ_ADDR || undefined);
    const list = options.urls ?? (url !== undefined ? url.split(",").filter((u) => u.trim() !== "") : []);
    if (options.urls !== undefined && options.urls.length === 0) {
      throw new FerryMQError("invalid_argument", "urls is empty: give at least one node's host:port");
    }
    const parsed = list.map(parseUrl);
    if (parsed.length === 0) parsed.push({ host: "127.0.0.1", port: DEFAULT_PORT });
    if (options.host !== undefined || options.port !== undefined) {
      parsed.splice(0, parsed.length, { host: options.host ?? parsed[0]!.host, port: options.port ?? parsed[0]!.port });
    }
    this.seeds = [...new Set(parsed.map((p) => formatAddr(p.host, p.port)))];
    this.host = parsed[0]!.host;
    this.port = parsed[0]!.port;
    this.leaderTimeoutMs = options.leaderTimeoutMs ?? DEFAULT_LEADER_TIMEOUT_MS;
    this.requestTimeoutMs = options.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
    this.publishWindow = options.publishWindow ?? DEFAULT_PUBLISH_WINDOW;
    if (options.token !== undefined && options.user) {
      throw new FerryMQError("invalid_argument", "give either a token or a user and password, not both");
    }
  }

  /** Connects and completes the handshake; fails with the server's error (e.g. bad credentials). */
  static async connect(options: ClientOptions = {}): Promise<Client> {
    const client = new Client(options);
    const waitMs = options.waitOnFirstConnectMs ?? 0;
    const deadline = Date.now() + waitMs;
    const reconnect = typeof options.reconnect === "object" ? options.reconnect : {};
    let delay = reconnect.initialDelayMs ?? 100;
    for (;;) {
      try {
        await client.openAny();
        break;
      } catch (e) {
        const left = deadline - Date.now();
        // Only an unreachable broker is waited for; one that refuses is final.
        if (!(e instanceof ConnectionError && e.code === "connect_failed") || left <= 0) {
          client.state = "closed";
          client.endedResolve(e);
          throw e;
        }
        await new Promise((r) => setTimeout(r, Math.min(left, delay * (0.5 + Math.random() / 2))));
        delay = Math.min(reconnect.maxDelayMs ?? 5_000, delay * 2);
      }
    }
    client.state = "connected";
    await client.discover();
    return client;
  }

  /** @internal a connection of its own to the node at `addr`, for a peer or a cluster subscription. */
  static async connectNode(options: ClientOptions, addr: string): Promise<Client> {
    const { urls: _urls, host: _host, port: _port, onReconnect: _onReconnect, ...rest } = options;
    const client = new Client({ ...rest, url: addr, reconnect: false, waitOnFirstConnectMs: 0 }, true);
    try {
      await client.open();
    } catch (e) {
      client.state = "closed";
      client.endedResolve(e);
      throw e;
    }
    client.state = "connected";
    return client;
  }

  /** The address of the node this connection is to (or is being made to). */
  get address(): string {
    return formatAddr(this.host, this.port);
  }

  /**
   * Opens a connection to the first candidate that answers: the seeds, then the nodes the
   * cluster named. A refusal (bad credentials) is final; if no node answers, the error names
   * each address and why.
   */
  private async openAny(): Promise<void> {
    const candidates = this.candidates();
    const failures: string[] = [];
    let last: unknown = null;
    for (const addr of candidates) {
      const { host, port } = parseUrl(addr);
      this.host = host;
      this.port = port;
      try {
        await this.open();
        return;
      } catch (e) {
        if (!(e instanceof ConnectionError && e.code === "connect_failed")) throw e;
        if ((this.state as State) === "closed") throw e;
        last = e;
        failures.push(e.message);
      }
    }
    if (candidates.length === 1) throw last;
    throw new ConnectionError("connect_failed", `no node answered of ${candidates.join(", ")}: ${failures.join("; ")}`, { cause: last });
  }

  /** The addresses to try for any node: the seeds, then the other nodes the cluster named. */
  private candidates(): string[] {
    const out = [...this.seeds];
    const ids = [...this.nodes.keys()].sort((a, b) => (BigInt(a) < BigInt(b) ? -1 : 1));
    for (const id of ids) {
      const addr = this.nodes.get(id)!;
      if (!out.includes(addr)) out.push(addr);
    }
    return out;
  }

  // --- the cluster ----------------------------------------------------------------------

  /** Whether requests that need a leader look for it: in a cluster, or with several seeds. */
  private following(): boolean {
    return !this.isNode && this.leaderTimeoutMs >= 0 && (this.clustered || this.seeds.length > 1);
  }

  /** Asks the node just connected to for the cluster; a failure is not the caller's. */
  private async discover(): Promise<void> {
    if (this.isNode || this.leaderTimeoutMs < 0 || this.state !== "connected" || (this.info?.version ?? 0) < 3) return;
    try {
      this.learn(await this.requestNow({ type: "CLUSTER_INFO" }, "CLUSTER_INFO_REPLY", 0));
    } catch {
      // Learnt later, when a request needs it.
    }
  }

  /**
   * The cluster's nodes, its metadata leader and each replicated partition's leader and
   * replicas, as the node asked sees them. A broker that runs alone answers `nodeId` 0n and
   * empty lists. In a cluster a node that cannot be reached is skipped for the next one known.
   */
  async clusterInfo(): Promise<ClusterInfo> {
    const node = this.following() && this.state !== "connected" ? await this.anyNode() : this;
    const { type: _type, ...info } = await node.request({ type: "CLUSTER_INFO" }, "CLUSTER_INFO_REPLY");
    this.learn(info);
    return info;
  }

  /** Records what a node said of the cluster. */
  private learn(info: ClusterInfo): void {
    if (info.nodeId === 0n) return;
    this.clustered = true;
    for (const n of info.nodes) if (n.addr !== "") this.nodes.set(n.id.toString(), n.addr);
    const set = (key: string, leader: bigint) => {
      const addr = leader !== 0n ? this.nodes.get(leader.toString()) : undefined;
      if (addr !== undefined) this.routes.set(key, addr);
      else this.routes.delete(key);
    };
    set(METADATA_ROUTE, info.metadataLeader);
    const byTopic = new Map<string, bigint>();
    for (const p of info.partitions) {
      set(partitionRoute(p.topic, p.partition), p.leader);
      const l = byTopic.get(p.topic);
      // Partitions led by different nodes: let not_leader say where each publish goes.
      byTopic.set(p.topic, l === undefined || l === p.leader ? p.leader : 0n);
    }
    for (const [topic, leader] of byTopic) set(partitionRoute(topic, -1), leader);
  }

  /**
   * Records where an error says the leader is. True when a not_leader named a leader at
   * another address than the one tried: worth trying at once.
   */
  private learnFrom(error: unknown, key: string, tried: string): boolean {
    if (!(error instanceof NotLeaderError)) {
      if (this.routes.get(key) === tried) this.routes.delete(key);
      return false;
    }
    this.clustered = true;
    let addr = error.leaderAddr;
    if (addr !== "") this.nodes.set(error.leader.toString(), addr);
    else if (error.leader !== 0n) addr = this.nodes.get(error.leader.toString()) ?? "";
    if (addr === "") {
      this.routes.delete(key);
      return false;
    }
    this.routes.set(key, addr);
    if (error.topic !== "" && error.partition >= 0) this.routes.set(partitionRoute(error.topic, error.partition), addr);
    return addr !== tried;
  }

  /** Asks any node reachable for the cluster. */
  private async refresh(): Promise<void> {
    try {
      const node = await this.anyNode();
      this.learn(await node.requestNow({ type: "CLUSTER_INFO" }, "CLUSTER_INFO_REPLY", 0));
    } catch {
      // The next attempt finds out.
    }
  }

  /** A connection to the node at `addr`: the main one, or a peer, dialled when needed. */
  private async nodeClient(addr: string): Promise<Client> {
    if (this.state === "closed") throw this.refusal ?? new ConnectionError("closed", "the client is closed");
    if (this.state === "connected" && this.socket !== null && this.address === addr) return this;
    const peer = this.peers.get(addr);
    if (peer !== undefined && peer.isConnected()) return peer;
    let dial = this.dialing.get(addr);
    if (dial === undefined) {
      dial = Client.connectNode(this.options, addr).finally(() => this.dialing.delete(addr));
      this.dialing.set(addr, dial);
    }
    const client = await dial;
    if ((this.state as State) === "closed") {
      await client.close();
      throw new ConnectionError("closed", "the client is closed");
    }
    const old = this.peers.get(addr);
    if (old !== undefined && old !== client) void old.close();
    this.peers.set(addr, client);
    return client;
  }

  /** A connection to any node: the main one, a peer, or the first candidate that answers. */
  private async anyNode(): Promise<Client> {
    if (this.state === "connected" && this.socket !== null) return this;
    for (const peer of this.peers.values()) if (peer.isConnected()) return peer;
    const failures: string[] = [];
    for (const addr of this.candidates()) {
      try {
        return await this.nodeClient(addr);
      } catch (e) {
        if ((this.state as State) === "closed") throw e;
        failures.push(e instanceof Error ? e.message : String(e));
      }
    }
    throw new ConnectionError("connect_failed", `no node of the cluster answered: ${failures.join("; ")}`);
  }

  /** The connection for a request that needs the leader of `key`: where it was last found, else any node. */
  private leaderNode(key: string): Promise<Client> {
    const addr = this.routes.get(key);
    return addr === undefined ? this.anyNode() : this.nodeClient(addr);
  }

  /**
   * Sends a request that needs the leader of `key` (`attempt` sends it once on a connection)
   * and follows the leader after not_leader or a lost connection, with backoff, until it
   * succeeds, fails in a way following cannot mend, or `leaderTimeoutMs` passes (then the last
   * error). `safe`: sending it twice is harmless.
   */
  private async leaderRequest<T>(key: string, safe: boolean, attempt: (node: Client) => Promise<T>): Promise<T> {
    const deadline = Date.now() + this.leaderTimeoutMs;
    let tried = "";
    let error: unknown;
    try {
      const node = await this.leaderNode(key);
      tried = node.address;
      return await attempt(node);
    } catch (e) {
      error = e;
    }
    let delay = 20;
    let quick = 0;
    while (followable(error, safe) && this.state !== "closed") {
      const left = deadline - Date.now();
      if (left <= 0) break;
      if (this.learnFrom(error, key, tried) && quick < 3) {
        quick++;
      } else {
        quick = 0;
        await sleep(Math.min(delay, left));
        delay = Math.min(500, delay * 2);
        await this.refresh();
      }
      let node: Client;
      try {
        node = await this.leaderNode(key);
      } catch (e) {
        error = e;
        tried = "";
        continue;
      }
      tried = node.address;
      try {
        return await attempt(node);
      } catch (e) {
        error = e;
      }
    }
    throw error;
  }

  /** The server's limits and name from HELLO_OK. */
  get server(): ServerInfo {
    if (this.info === null) throw new ConnectionError("closed", "not connected");
    return this.info;
  }

  isConnected(): boolean {
    return this.state === "connected" && this.socket !== null;
  }

  // --- connection -----------------------------------------------------------------------

  private open(): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const tls = this.options.tls;
      const socket: Socket = tls
        ? // SNI carries a host name only: none for an IP address (RFC 6066).
          tlsConnect({ host: this.host, port: this.port, ...(isIP(this.host) === 0 ? { servername: this.host } : {}), ...(tls === true ? {} : tls) })
        : netConnect({ host: this.host, port: this.port });
      socket.setNoDelay(true);
      const generation = ++this.generation;
      this.stream = new FrameStream(FRAME_BYTES_DEFAULT, this.makeDelivery);
      let settled = false;
      const timeoutMs = this.options.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS;
      const timer = setTimeout(() => {
        fail(new ConnectionError("connect_failed", `no HELLO_OK from ${this.host}:${this.port} within ${timeoutMs} ms`));
      }, timeoutMs);
      const fail = (e: unknown) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        // A handshake that failed was never a connection: its close must not start a
        // reconnection (a refused connect() would otherwise keep the process alive).
        if (this.socket === socket) this.socket = null;
        socket.destroy();
        reject(e);
      };
      socket.once(tls ? "secureConnect" : "connect", () => {
        this.socket = socket;
        const token = this.options.token;
        const hello = encodeFrame(
          {
            type: "HELLO",
            versionMin: PROTOCOL_VERSION,
            versionMax: PROTOCOL_VERSION,
            heartbeatMs: this.options.heartbeatMs ?? 0,
            clientName: this.options.clientName ?? "ferrymq-typescript/0.1",
            user: token !== undefined ? "" : (this.options.user ?? ""),
            password: token !== undefined ? token : (this.options.password ?? ""),
          },
          this.allocateId(),
        );
        socket.write(hello);
      });
      socket.on("data", (chunk: Buffer) => {
        if (generation !== this.generation) return;
        this.lastReceived = Date.now();
        try {
          this.stream.push(new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.byteLength), (id, frame) => {
            if (!settled) {
              // The handshake: the first frame is HELLO_OK or the refusal.
              if (frame.type === "HELLO_OK") {
                settled = true;
                clearTimeout(timer);
                this.info = { ...frame };
                this.stream.setFrameBytesMax(frame.frameBytesMax);
                this.startHeartbeat(frame.heartbeatMs, generation);
                resolve();
              } else if (frame.type === "ERROR") {
                fail(serverError(frame.code, frame.message));
              } else {
                fail(new ConnectionError("connect_failed", `expected HELLO_OK, got ${frame.type}`));
              }
              return;
            }
            this.route(id, frame);
          });
        } catch (e) {
          // A malformed frame from the server: nothing after it can be trusted.
          const err = e instanceof ProtocolError ? e : new FerryMQError("internal", String(e), { cause: e });
          if (!settled) fail(err);
          else this.lose(err, generation);
        }
      });
      socket.on("error", (e) => {
        if (!settled) fail(new ConnectionError("connect_failed", `cannot connect to ${this.host}:${this.port}: ${e.message}`, { cause: e }));
        else this.lose(new ConnectionError("connection_lost", `connection to ${this.host}:${this.port} failed: ${e.message}`, { cause: e, outcomeUnknown: true }), generation);
      });
      socket.on("close", () => {
        if (!settled) fail(new ConnectionError("connect_failed", `${this.host}:${this.port} closed the connection during the handshake`));
        else this.lose(new ConnectionError("connection_lost", `connection to ${this.host}:${this.port} closed`, { outcomeUnknown: true }), generation);
      });
    });
  }

  private startHeartbeat(intervalMs: number, generation: number): void {
    if (this.heartbeat !== null) clearInterval(this.heartbeat);
    this.lastSent = this.lastReceived = Date.now();
    this.heartbeat = setInterval(() => {
      if (generation !== this.generation || this.socket === null) return;
      const now = Date.now();
      if (now - this.lastReceived >= 3 * intervalMs) {
        this.socket.destroy();
        this.lose(new ConnectionError("connection_lost", `no frame from the server for ${now - this.lastReceived} ms (3 heartbeats)`, { outcomeUnknown: true }), generation);
        return;
      }
      if (now - this.lastSent >= intervalMs) this.write(encodeFrame({ type: "PING" }, 0));
    }, Math.max(50, Math.floor(intervalMs / 2)));
    this.heartbeat.unref();
  }

  /** The connection of `generation` is gone: fail what waits on it, then reconnect or close. */
  private lose(error: unknown, generation: number): void {
    if (generation !== this.generation || this.state === "closed" || this.socket === null) return;
    this.socket.destroy();
    this.socket = null;
    if (this.heartbeat !== null) clearInterval(this.heartbeat);
    this.heartbeat = null;
    this.retireConsumers();
    this.failPending(error);
    const reconnect = this.options.reconnect ?? true;
    if (reconnect === false) {
      this.shutdown(error);
      return;
    }
    this.state = "reconnecting";
    this.reportError(error);
    this.reconnectLoop(reconnect === true ? {} : reconnect).catch((e) => this.reportError(e));
  }

  /** The consumers of a lost connection are gone: what they delivered comes again. */
  private retireConsumers(): void {
    for (const a of this.consumers.values()) a.sub.retire(a);
    this.consumers.clear();
  }

  private failPending(error: unknown): void {
    const pending = [...this.pending.values()];
    this.pending.clear();
    for (const p of pending) {
      if (p.timer !== null) clearTimeout(p.timer);
      this.releaseWindow(p.window);
      p.reject(error);
    }
  }

  private async reconnectLoop(options: ReconnectOptions): Promise<void> {
    const initial = options.initialDelayMs ?? 100;
    const max = options.maxDelayMs ?? 5_000;
    const attempts = options.maxAttempts ?? Infinity;
    let delay = initial;
    let lastRefusal: string | null = null;
    for (let attempt = 1; attempt <= attempts; attempt++) {
      await new Promise((r) => setTimeout(r, delay * (0.5 + Math.random() / 2)));
      if (this.state === "closed") return;
      try {
        await this.openAny();
      } catch (e) {
        if ((this.state as State) === "closed") return;
        this.reportError(e);
        // Credentials refused twice alike will be refused for ever: stop, so that the process
        // can end, rather than knock every few seconds.
        if (e instanceof ServerError && REFUSALS.has(e.code)) {
          const key = `${e.code}\u0000${e.message}`;
          if (key === lastRefusal) {
            this.refusal = e;
            this.shutdown(e);
            return;
          }
          lastRefusal = key;
        } else {
          lastRefusal = null;
        }
        delay = Math.min(max, delay * 2);
        continue;
      }
      this.state = "connected";
      await this.discover();
      await this.resubscribe();
      // A loss during the resubscription started the next reconnection already.
      if ((this.state as State) === "connected") {
        for (const w of this.readyWaiters.splice(0)) w.resolve();
        this.options.onReconnect?.();
      }
      return;
    }
    this.shutdown(new ConnectionError("connection_lost", `gave up reconnecting to ${this.host}:${this.port} after ${attempts} attempts`));
  }

  /** Attaches every subscription again; one the broker now refuses ends with that error. */
  private async resubscribe(): Promise<void> {
    this.consumers.clear();
    for (const s of [...this.subscriptions]) {
      // A cluster subscription keeps its own connections to the nodes.
      if (s.clustered) continue;
      try {
        await this.attach(s);
      } catch (e) {
        // A lost connection leaves the subscription for the next reconnection.
        if (e instanceof ConnectionError) return;
        this.subscriptions.delete(s);
        s.finish(e);
        this.reportError(e);
      }
    }
  }

  /** Ends the client; returns what still closes (peers, cluster subscriptions' connections). */
  private shutdown(error: unknown): Promise<unknown> {
    this.state = "closed";
    if (this.heartbeat !== null) clearInterval(this.heartbeat);
    this.heartbeat = null;
    this.socket?.destroy();
    this.socket = null;
    this.retireConsumers();
    this.failPending(error);
    for (const w of this.windowWaiters.splice(0)) w.reject(error);
    for (const w of this.readyWaiters.splice(0)) w.reject(error);
    const closing: Promise<unknown>[] = [];
    const ending = error instanceof ConnectionError && error.code === "closed" ? null : error;
    for (const s of this.subscriptions) {
      if (s.clustered) closing.push(s.abandon(ending));
      else s.finish(ending);
    }
    this.subscriptions.clear();
    for (const peer of this.peers.values()) closing.push(peer.close());
    this.peers.clear();
    for (const dial of this.dialing.values()) closing.push(dial.then((c) => c.close(), () => undefined));
    this.endedResolve(error);
    return Promise.all(closing);
  }

  /** Closes the connection: acks gathered so far are sent first; waiting requests fail. */
  async close(): Promise<void> {
    if (this.state === "closed") return;
    for (const s of this.subscriptions) s.flush();
    const socket = this.socket;
    this.socket = null;
    const closing = this.shutdown(new ConnectionError("closed", "the client was closed"));
    if (socket !== null) {
      if (this.corked) socket.uncork();
      // The acks just flushed leave before the socket closes.
      await new Promise<void>((r) => socket.end(r));
      socket.destroy();
    }
    await closing;
  }

  /** @internal errors no request waits for. */
  reportError(error: unknown): void {
    if (this.options.onError) {
      try {
        this.options.onError(error);
      } catch {
        // An error handler that throws must not take the connection down with it.
      }
      return;
    }
    // Without a handler such errors are still shown, as process warnings, never dropped.
    process.emitWarning(error instanceof Error ? error : String(error), { type: "FerryMQWarning" });
  }

  // --- frames ---------------------------------------------------------------------------

  private route(id: number, frame: Frame): void {
    switch (frame.type) {
      case "DELIVER": {
        const a = this.consumers.get(frame.consumerId);
        if (a !== undefined) a.sub.deliver(frame.deliveries);
        else this.reportError(new FerryMQError("unknown_consumer", `DELIVER for consumer ${frame.consumerId}, which this client does not have`));
        return;
      }
      case "PING":
        if (id !== 0) this.write(encodeFrame({ type: "PONG" }, id));
        return;
      case "PONG":
        if (id === 0) return;
        break;
      default:
        break;
    }
    if (id === 0) {
      const error = frame.type === "ERROR" ? serverError(frame.code, frame.message) : new FerryMQError("internal", `unexpected ${frame.type} with request id 0`);
      if (frame.type === "ERROR" && CLOSING_ERROR_CODES.has(frame.code)) {
        // Every waiting request fails with the reason; the server closes after it.
        this.lose(error, this.generation);
      }
      this.reportError(error);
      return;
    }
    const p = this.pending.get(id);
    if (p === undefined) {
      this.reportError(new FerryMQError("internal", `a ${frame.type} answered request ${id}, which is not waiting`));
      return;
    }
    this.pending.delete(id);
    if (p.timer !== null) clearTimeout(p.timer);
    this.releaseWindow(p.window);
    if (frame.type === "ERROR") p.reject(serverError(frame.code, frame.message));
    else if (frame.type !== p.expect) p.reject(new FerryMQError("internal", `expected ${p.expect} for request ${id}, got ${frame.type}`));
    else {
      p.onAnswer?.(frame);
      p.resolve(frame);
    }
  }

  private allocateId(): number {
    for (;;) {
      const id = this.nextId;
      this.nextId = this.nextId === 0xffffffff ? 1 : this.nextId + 1;
      if (!this.pending.has(id)) return id;
    }
  }

  /** Queues bytes; writes gathered in one tick leave in one system call. */
  private write(bytes: Uint8Array): void {
    const socket = this.socket;
    if (socket === null) return;
    if (!this.corked) {
      this.corked = true;
      socket.cork();
      process.nextTick(() => {
        if (!this.corked) return;
        this.corked = false;
        socket.uncork();
      });
    }
    this.lastSent = Date.now();
    socket.write(bytes);
  }

  /** @internal writes what this tick gathered now, rather than at the end of the tick. */
  flushWrites(): void {
    if (this.corked && this.socket !== null) {
      this.corked = false;
      this.socket.uncork();
    }
  }

  /** @internal sends a frame with request id 0 (no answer on success). */
  send(frame: FrameInput): void {
    if (this.socket === null) return;
    this.write(encodeFrame(frame, 0));
  }

  /** Waits for the connection while reconnecting, at most the request timeout. */
  private async ready(): Promise<void> {
    if (this.state === "connected") return;
    if (this.state === "closed") throw this.refusal ?? new ConnectionError("closed", "the client is closed");
    const timeoutMs = this.requestTimeoutMs;
    await new Promise<void>((resolve, reject) => {
      const waiter = {
        resolve: () => {
          if (timer !== null) clearTimeout(timer);
          resolve();
        },
        reject: (e: unknown) => {
          if (timer !== null) clearTimeout(timer);
          reject(e);
        },
      };
      const timer =
        timeoutMs > 0
          ? setTimeout(() => {
              const i = this.readyWaiters.indexOf(waiter);
              if (i >= 0) this.readyWaiters.splice(i, 1);
              reject(new ConnectionError("connection_lost", `not reconnected to ${this.host}:${this.port} within ${timeoutMs} ms`));
            }, timeoutMs)
          : null;
      this.readyWaiters.push(waiter);
    });
  }

  /** @internal sends a request and waits for its answer of type `expect`. */
  async request<T extends FrameType>(frame: FrameInput | Uint8Array, expect: T, window = 0): Promise<Extract<Frame, { type: T }>> {
    await this.ready();
    return this.requestNow(frame, expect, window);
  }

  private requestNow<T extends FrameType>(
    frame: FrameInput | Uint8Array,
    expect: T,
    window: number,
    onAnswer?: (f: Extract<Frame, { type: T }>) => void,
  ): Promise<Extract<Frame, { type: T }>> {
    return new Promise((resolve, reject) => {
      if (this.socket === null) {
        this.releaseWindow(window);
        reject(new ConnectionError("connection_lost", "not connected"));
        return;
      }
      const id = this.allocateId();
      let bytes: Uint8Array;
      try {
        if (frame instanceof Uint8Array) {
          bytes = frame;
          new DataView(bytes.buffer, bytes.byteOffset, 12).setUint32(8, id, true);
        } else {
          bytes = encodeFrame(frame, id);
        }
      } catch (e) {
        this.releaseWindow(window);
        reject(e);
        return;
      }
      const max = this.info?.frameBytesMax ?? FRAME_BYTES_DEFAULT;
      if (bytes.length > max) {
        this.releaseWindow(window);
        reject(new FerryMQError("frame_too_large", `a ${bytes.length}-byte frame exceeds the server's limit of ${max} bytes: send fewer or smaller messages at once`));
        return;
      }
      const timeoutMs = this.requestTimeoutMs;
      const timer =
        timeoutMs > 0
          ? setTimeout(() => {
              if (this.pending.delete(id)) {
                this.releaseWindow(window);
                reject(new TimeoutError(`no answer to ${expect === "OK" ? "a request" : expect} ${id} within ${timeoutMs} ms; its outcome is unknown`));
              }
            }, timeoutMs)
          : null;
      this.pending.set(id, {
        expect,
        resolve: resolve as (f: Frame) => void,
        reject,
        timer,
        window,
        onAnswer: onAnswer as ((f: Frame) => void) | undefined,
      });
      this.write(bytes);
    });
  }

  // --- publish window -------------------------------------------------------------------

  private acquireWindow(n: number): Promise<void> | null {
    // One batch larger than the window goes alone rather than never.
    if (this.windowUsed === 0 || this.windowUsed + n <= this.publishWindow) {
      this.windowUsed += n;
      return null;
    }
    return new Promise((resolve, reject) => this.windowWaiters.push({ n, resolve, reject }));
  }

  private releaseWindow(n: number): void {
    if (n === 0) return;
    this.windowUsed -= n;
    while (this.windowWaiters.length > 0) {
      const w = this.windowWaiters[0]!;
      if (this.windowUsed !== 0 && this.windowUsed + w.n > this.publishWindow) break;
      this.windowWaiters.shift();
      this.windowUsed += w.n;
      w.resolve();
    }
  }

  /** Messages in unconfirmed publishes now. */
  get unconfirmed(): number {
    return this.windowUsed;
  }

  // --- publishing -----------------------------------------------------------------------

  /** Publishes one message; resolves with its id once the broker has stored it. */
  async publish(topic: string, message: OutgoingMessage | BytesLike, options: PublishOptions = {}): Promise<PublishReceipt> {
    const receipt = await this.publishBatch(topic, [message], options);
    const r = receipt.ranges[0];
    if (r === undefined) throw new FerryMQError("internal", "PUBLISHED without a range for a one-message publish");
    return { id: `${r.partition}-${r.offset}`, partition: r.partition, offset: r.offset, durability: receipt.durability };
  }

  /** Publishes a JSON value as the body (with a `content-type` header). */
  publishJson(topic: string, value: unknown, options: PublishOptions & Omit<OutgoingMessage, "body"> = {}): Promise<PublishReceipt> {
    const { partition, ...rest } = options;
    const headers: [string, string][] = [["content-type", "application/json"], ...toHeaderPairs(rest.headers)];
    return this.publish(topic, { ...rest, headers, body: JSON.stringify(value) }, partition === undefined ? {} : { partition });
  }

  /**
   * Publishes a batch in one PUBLISH frame, stored all or nothing. Waits while the publish
   * window is full. The batch must fit one frame (65 536 messages, `frameBytesMax`).
   */
  async publishBatch(topic: string, messages: (OutgoingMessage | BytesLike)[], options: PublishOptions = {}): Promise<BatchReceipt> {
    const frame = this.encodePublish(topic, messages, options.partition);
    const n = messages.length;
    const wait = this.acquireWindow(n);
    if (wait !== null) await wait;
    if (this.following()) {
      // In a cluster the batch goes to its partition's leader, followed after not_leader or a
      // lost connection; one in doubt is sent again only if every message has a dedup id.
      const key = partitionRoute(topic, options.partition ?? -1);
      try {
        const published = await this.leaderRequest(key, allDeduplicated(messages), (node) => node.requestNow(frame, "PUBLISHED", 0));
        return new BatchReceipt(published.durability, published.ranges);
      } finally {
        this.releaseWindow(n);
      }
    }
    let published: Extract<Frame, { type: "PUBLISHED" }>;
    try {
      await this.ready();
    } catch (e) {
      this.releaseWindow(n);
      throw e;
    }
    published = await this.requestNow(frame, "PUBLISHED", n);
    return new BatchReceipt(published.durability, published.ranges);
  }

  /** Encodes a PUBLISH frame (request id patched in when sent), checking every limit first. */
  private encodePublish(topic: string, messages: (OutgoingMessage | BytesLike)[], partition: number | undefined): Uint8Array {
    if (messages.length > BATCH_COUNT_MAX) {
      throw new FerryMQError("invalid_argument", `a batch of ${messages.length} messages is above the limit of ${BATCH_COUNT_MAX}: split it`);
    }
    if (partition !== undefined && (!Number.isInteger(partition) || partition < 0 || partition >= NO_PARTITION)) {
      throw new FerryMQError("invalid_argument", `partition ${partition} is not a partition number`);
    }
    const messageBytesMax = this.info?.messageBytesMax ?? Infinity;
    let size = FRAME_HEADER_BYTES + 2 + NAME_BYTES_MAX * 3 + 8;
    const inputs: MessageInput[] = new Array(messages.length);
    for (let i = 0; i < messages.length; i++) {
      const input = toMessageInput(messages[i]!);
      try {
        validateMessage(input, messageBytesMax);
      } catch (e) {
        if (e instanceof ProtocolError && e.field === "record.body" && input.body.length > messageBytesMax) {
          throw new FerryMQError("message_too_large", `message ${i} of the batch has a body of ${input.body.length} bytes, above the server's limit of ${messageBytesMax}`);
        }
        throw e;
      }
      inputs[i] = input;
      size += 18 + input.body.length + (input.key?.length ?? 0);
      if (input.headers) for (const [k, v] of input.headers) size += 4 + 3 * (k.length + v.length);
    }
    const w = new Writer(size);
    const at = beginFrame(w, Opcode.PUBLISH, 0);
    w.str16(topic, "publish.topic", NAME_BYTES_MAX, 1);
    w.u32(partition ?? NO_PARTITION);
    w.u32(inputs.length);
    for (const m of inputs) writeRecord(w, m);
    endFrame(w, at);
    return w.finish();
  }

  // --- consuming ------------------------------------------------------------------------

  /** Attaches a consumer. Iterate it with `for await`, or give `handler` for the callback form. */
  /**
   * Attaches a consumer. Iterate it with `for await`, or give `handler` for the callback form.
   *
   * In a cluster only a partition's leader delivers its messages and takes their acks, so the
   * subscription is attached on every node (over a connection of its own to each), their
   * deliveries merged, and each ack or nack sent to the node that delivered the message. A node
   * whose connection breaks is attached again (backing off from 50 ms to 1 s); the new leader
   * of its partitions resumes from the replicated cursor, so nothing acked with
   * `ackConfirmed` comes again.
   */
  async subscribe(topic: string, options: SubscribeOptions = {}): Promise<Subscription> {
    const s = new Subscription(this, topic, options);
    if (this.following()) {
      const info = await this.clusterInfo();
      const addrs = [...new Set(info.nodes.filter((n) => n.addr !== "").map((n) => n.addr))];
      if (info.nodeId !== 0n && addrs.length > 0) {
        await s.attachNodes(addrs, (addr) => Client.connectNode(this.options, addr));
        if ((this.state as State) === "closed") {
          await s.close();
          throw this.refusal ?? new ConnectionError("closed", "the client is closed");
        }
        this.subscriptions.add(s);
        return s;
      }
    }
    await this.ready();
    await this.attach(s);
    this.subscriptions.add(s);
    return s;
  }

  private async attach(s: Subscription): Promise<void> {
    // DELIVER may follow SUBSCRIBED in the same read: the consumer must be known by then.
    await this.requestNow(s.subscribeFrame(), "SUBSCRIBED", 0, (r) => {
      this.consumers.set(r.consumerId, s.attached(r.consumerId, r.subscription, r.partitions));
    });
  }

  /** @internal attaches `s` on this connection as its `slot` (a cluster subscription's node). */
  async attachOn(s: Subscription, slot: number): Promise<void> {
    await this.requestNow(s.subscribeFrame(), "SUBSCRIBED", 0, (r) => {
      this.consumers.set(r.consumerId, s.attachedOn(slot, this, r.consumerId, r.subscription, r.partitions));
    });
  }

  /** @internal a subscription closed itself (its attachment `a` here, or every one). */
  forget(s: Subscription, a?: Attachment): void {
    this.subscriptions.delete(s);
    for (const [id, c] of this.consumers) {
      if (a !== undefined ? c === a : c.sub === s) this.consumers.delete(id);
    }
  }

  // --- admin, status, listings ----------------------------------------------------------

  async ping(): Promise<void> {
    await this.request({ type: "PING" }, "PONG");
  }

  /**
   * Creates a topic. With `ifNotExists`, an existing topic is accepted only if it has the
   * configuration asked for: every field given (a 0 or "default" leaves it to the broker) is
   * compared with the existing topic's, and a difference rejects with `TopicConfigMismatch`
   * (code `conflict`), which carries the existing configuration. A user who may not inspect the
   * topic gets no comparison.
   */
  async createTopic(name: string, config: TopicConfigInput = {}, options: { ifNotExists?: boolean } = {}): Promise<void> {
    const frame: FrameInput = { type: "CREATE_TOPIC", name, config, ifNotExists: options.ifNotExists ?? false };
    // In a cluster, creating goes to the metadata leader, which is then asked to describe it.
    let node: Client = this;
    if (this.following()) {
      await this.leaderRequest(METADATA_ROUTE, options.ifNotExists ?? false, async (n) => {
        await n.requestNow(frame, "OK", 0);
        node = n;
      });
    } else {
      await this.request(frame, "OK");
    }
    if (!options.ifNotExists) return;
    const asked = Object.entries(config).filter(([, v]) => v !== undefined && v !== 0 && v !== 0n && v !== "0" && v !== "default");
    if (asked.length === 0) return;
    let existing: TopicConfig;
    try {
      existing = (await node.describeTopic(name)).config;
    } catch (e) {
      if (e instanceof ServerError && e.code === "forbidden") return;
      throw e;
    }
    const differences: string[] = [];
    for (const [field, value] of asked) {
      const have = (existing as unknown as Record<string, unknown>)[field];
      const same = typeof have === "bigint" ? have === BigInt(value as string | number | bigint) : have === value;
      if (!same) differences.push(`${field} ${String(have)} (asked ${String(value)})`);
    }
    if (differences.length > 0) throw new TopicConfigMismatch(name, existing, differences);
  }

  /** Deletes a topic; in a cluster the request goes to the metadata leader. */
  async deleteTopic(name: string): Promise<void> {
    if (this.following()) {
      await this.leaderRequest(METADATA_ROUTE, false, (n) => n.requestNow({ type: "DELETE_TOPIC", name }, "OK", 0));
      return;
    }
    await this.request({ type: "DELETE_TOPIC", name }, "OK");
  }

  async describeTopic(name: string): Promise<TopicInfo> {
    return (await this.request({ type: "DESCRIBE_TOPIC", name }, "TOPIC_INFO")).topic;
  }

  async listTopics(): Promise<TopicInfo[]> {
    return (await this.request({ type: "LIST_TOPICS" }, "TOPIC_LIST")).topics;
  }

  /** Statistics of one topic, or of every topic when `topic` is absent. */
  async stats(topic = ""): Promise<TopicStats[]> {
    return (await this.request({ type: "STATS", topic }, "STATS_REPLY")).topics;
  }

  async deleteSubscription(topic: string, subscription: string): Promise<void> {
    await this.request({ type: "DELETE_SUBSCRIPTION", topic, subscription }, "OK");
  }

  /** Where one message stands in each subscription; `id` is `<partition>-<offset>`. */
  async messageStatus(topic: string, id: string | { partition: number; offset: U64Input }): Promise<MessageStatusInfo> {
    const { partition, offset } = typeof id === "string" ? parseMessageId(id) : id;
    return (await this.request({ type: "MESSAGE_STATUS", topic, partition, offset }, "MESSAGE_STATUS_REPLY")).status;
  }

  /** One page of a subscription's messages of one kind; pass `nextPage` back for the next. */
  async listMessages(
    topic: string,
    subscription: string,
    kind: ListKind,
    options: { page?: Uint8Array; limit?: number } = {},
  ): Promise<{ entries: MessageEntry[]; nextPage: Uint8Array | null }> {
    const reply = await this.request(
      { type: "LIST_MESSAGES", topic, subscription, kind, page: options.page ?? new Uint8Array(0), limit: options.limit ?? 100 },
      "MESSAGE_LIST",
    );
    return { entries: reply.entries, nextPage: reply.nextPage.length > 0 ? reply.nextPage : null };
  }

  /** Every entry of a listing, page by page. */
  async *iterateMessages(topic: string, subscription: string, kind: ListKind, pageSize = 100): AsyncGenerator<MessageEntry> {
    let page: Uint8Array | undefined;
    for (;;) {
      const r = await this.listMessages(topic, subscription, kind, page === undefined ? { limit: pageSize } : { page, limit: pageSize });
      yield* r.entries;
      if (r.nextPage === null) return;
      page = r.nextPage;
    }
  }

  /** Publishes dead letters again to their source topic, for the subscription they died in. */
  async requeueDead(deadLetterTopic: string, selection: RequeueSelectionInput = { kind: "all" }): Promise<{ requeued: bigint; skipped: bigint }> {
    const r = await this.request({ type: "REQUEUE_DEAD", deadLetterTopic, selection }, "REQUEUED");
    return { requeued: r.requeued, skipped: r.skipped };
  }

  // --- operators ------------------------------------------------------------------------

  /**
   * Drops every message the topic retains, for every subscription (their cursors move to its
   * end; subscriptions and consumers stay). Needs the `purge` action (or `manage`). Resolves to
   * how many messages the topic retained before.
   */
  async purgeTopic(name: string): Promise<bigint> {
    return (await this.request({ type: "PURGE_TOPIC", name }, "PURGED")).messages;
  }

  /**
   * Pauses a subscription's deliveries (`paused` false resumes them): its consumers stay
   * attached, messages wait in its backlog. Needs the `pause` action (or `manage`).
   */
  async pauseSubscription(topic: string, subscription: string, paused = true): Promise<void> {
    await this.request({ type: "PAUSE_SUBSCRIPTION", topic, subscription, paused }, "OK");
  }

  /**
   * One page of the broker's open connections, in id order (the monitor or admin role): pass
   * `nextAfter` back as `after` for the next page; it is 0n on the last.
   */
  async listConnections(options: { after?: U64Input; limit?: number } = {}): Promise<{ total: bigint; nextAfter: bigint; connections: ConnectionEntry[] }> {
    const r = await this.request({ type: "LIST_CONNECTIONS", after: options.after ?? 0, limit: options.limit ?? 100 }, "CONNECTION_LIST");
    return { total: r.total, nextAfter: r.nextAfter, connections: r.connections };
  }

  /** Closes a connection by id (the admin role); an id not open is `invalid_argument`. */
  async closeConnection(id: U64Input): Promise<void> {
    await this.request({ type: "CLOSE_CONNECTION", id }, "OK");
  }

  // --- users, grants and tokens ---------------------------------------------------------
  // A refusal is a ServerError: `forbidden` without the admin role, `invalid_argument` for a
  // bad name, password length or pattern. Passwords and tokens never appear in errors or logs.

  /**
   * Adds a user (admin only). The broker hashes the password (Argon2id) and never stores or
   * logs it.
   *
   * @param user a name of 1..=255 letters, digits, `.`, `_`, `-`
   * @param password 8..=1024 bytes
   * @param roles `["admin"]` (everything, users included), `["monitor"]` (inspect every topic,
   *   `/metrics`), or bits ({@link Role}); none by default: rights come from grants
   */
  async addUser(user: string, password: string, roles: RolesInput = 0): Promise<void> {
    await this.request({ type: "USER_ADD", user, password, roles: bitsOf(roles, Role, "role") }, "OK");
  }

  /** Removes a user (admin only): its connections are closed at their next request. */
  async removeUser(user: string): Promise<void> {
    await this.request({ type: "USER_REMOVE", user }, "OK");
  }

  /**
   * Sets a password (8..=1024 bytes): the connection's own user's when `user` is empty or
   * absent; another user's needs the admin role.
   */
  async setPassword(password: string, user = ""): Promise<void> {
    await this.request({ type: "USER_PASSWD", user, password }, "OK");
  }

  /** Every user, by name, with its roles, grants and token count (admin only); never a password. */
  async listUsers(): Promise<UserEntry[]> {
    return (await this.request({ type: "USER_LIST" }, "USER_LIST_REPLY")).users;
  }

  /**
   * Grants `actions` on a topic pattern (merged into an existing grant on the same pattern),
   * and `roles` (admin only).
   *
   * @param pattern an exact topic name, a prefix ending in `*` such as `orders.*`, or `*`;
   *   empty when only roles are granted
   * @param actions `["publish", "consume", "inspect", "manage"]` or a subset, or bits ({@link Action})
   * @param options.roles roles to grant as well; none by default
   */
  async grant(user: string, pattern: string, actions: ActionsInput, options: { roles?: RolesInput } = {}): Promise<void> {
    await this.request(
      { type: "GRANT", user, pattern, actions: bitsOf(actions, Action, "action"), roles: bitsOf(options.roles ?? 0, Role, "role") },
      "OK",
    );
  }

  /**
   * Takes `actions` away from the grant on exactly `pattern` (a grant left with none goes), and
   * `roles` (admin only). `pattern` is empty when only roles are revoked.
   */
  async revoke(user: string, pattern: string, actions: ActionsInput, options: { roles?: RolesInput } = {}): Promise<void> {
    await this.request(
      { type: "REVOKE", user, pattern, actions: bitsOf(actions, Action, "action"), roles: bitsOf(options.roles ?? 0, Role, "role") },
      "OK",
    );
  }

  /**
   * Creates a named API token. The token is in the result this once: the broker keeps only its
   * SHA-256. Connect with it as `connect({ token })`.
   *
   * @param name unique per user, a name as for users
   * @param options.user whose token: the connection's own user by default; another user's
   *   needs the admin role
   * @param options.expiresMs unix ms after which the token is refused; never by default
   */
  async createToken(name: string, options: { user?: string; expiresMs?: U64Input } = {}): Promise<CreatedToken> {
    const r = await this.request(
      { type: "TOKEN_CREATE", user: options.user ?? "", name, expiresMs: options.expiresMs ?? 0 },
      "TOKEN_CREATED",
    );
    return new CreatedToken(r.name, r.token, r.expiresMs);
  }

  /**
   * A user's tokens, by name with their creation and expiry times, never their values: the
   * connection's own user's by default; another user's needs the admin role.
   */
  async listTokens(user = ""): Promise<TokenEntry[]> {
    return (await this.request({ type: "TOKEN_LIST", user }, "TOKEN_LIST_REPLY")).tokens;
  }

  /**
   * Revokes a token at once: connections using it are closed at their next request. The
   * connection's own user's by default; another user's needs the admin role.
   */
  async revokeToken(name: string, user = ""): Promise<void> {
    await this.request({ type: "TOKEN_REVOKE", user, name }, "OK");
  }
}


function toHeaderPairs(headers: OutgoingMessage["headers"]): [string, string][] {
  if (headers === undefined) return [];
  return Array.isArray(headers) ? headers : Object.entries(headers);
}

/** Parses a message id `<partition>-<offset>`. */
export function parseMessageId(id: string): { partition: number; offset: bigint } {
  const m = /^(\d{1,10})-(\d{1,20})$/.exec(id);
  const partition = m ? Number(m[1]) : NaN;
  const offset = m ? BigInt(m[2]!) : -1n;
  if (!m || partition > 0xffffffff || offset > (1n << 64n) - 1n) {
    throw new FerryMQError("invalid_argument", `"${id}" is not a message id <partition>-<offset>`);
  }
  return { partition, offset };
}


