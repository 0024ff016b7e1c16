// The client: one connection (TCP or TLS) with HELLO, heartbeats, pipelined requests matched by
// id, a bounded window of unconfirmed publishes, consumers, and reconnection with backoff that
// subscribes again.
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
  type UserEntry,
  validateMessage,
  writeRecord,
  Opcode,
} from "./codec.js";
import { ConnectionError, FerryMQError, ServerError, serverError, TimeoutError, TopicConfigMismatch } from "./errors.js";
import {
  BATCH_COUNT_MAX,
  FRAME_BYTES_DEFAULT,
  FRAME_HEADER_BYTES,
  NAME_BYTES_MAX,
  NO_PARTITION,
  PROTOCOL_VERSION,
} from "./limits.js";
import { toBytes, toMessageInput, type BytesLike, type OutgoingMessage } from "./message.js";
import { Subscription, type SubscribeOptions } from "./subscription.js";
import { ProtocolError, Writer } from "./wire.js";

export interface ReconnectOptions {
  /** First wait after a loss; doubled after each failed attempt, with jitter. */
  initialDelayMs?: number;
  maxDelayMs?: number;
  /** Attempts before giving up; unbounded by default. */
  maxAttempts?: number;
}

export interface ClientOptions {
  /** `host:port`; `$FERRYMQ_ADDR` by default, else 127.0.0.1:7070. */
  url?: string;
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
const textEncoder = new TextEncoder();

type State = "connecting" | "connected" | "reconnecting" | "closed";

/** Parses `host:port` (or `[v6]:port`, or a bare host). */
function parseUrl(url: string): { host: string; port: number } {
  const trimmed = url.replace(/^ferrymq(s)?:\/\//, "");
  const m = /^(\[[^\]]+\]|[^:]+)(?::(\d+))?$/.exec(trimmed);
  if (!m) throw new FerryMQError("invalid_argument", `"${url}" is not host:port`);
  return { host: m[1]!.replace(/^\[|\]$/g, ""), port: m[2] ? Number(m[2]) : DEFAULT_PORT };
}

export class Client {
  private readonly options: ClientOptions;
  private readonly host: string;
  private readonly port: number;
  private socket: Socket | null = null;
  /** Deliveries of a known consumer are decoded straight into its Messages. */
  private readonly makeDelivery = (consumerId: number) => this.consumers.get(consumerId)?.makeMessage ?? null;
  private stream = new FrameStream(FRAME_BYTES_DEFAULT, this.makeDelivery);
  private state: State = "connecting";
  private pending = new Map<number, Pending>();
  private nextId = 1;
  private generation = 0;
  private consumers = new Map<number, Subscription>();
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

  private constructor(options: ClientOptions) {
    this.options = options;
    const url = options.url ?? (globalThis.process?.env?.FERRYMQ_ADDR || undefined);
    const parsed = url !== undefined ? parseUrl(url) : { host: "127.0.0.1", port: DEFAULT_PORT };
    this.host = options.host ?? parsed.host;
    this.port = options.port ?? parsed.port;
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
        await client.open();
        break;
      } catch (e) {
        const left = deadline - Date.now();
        // Only an unreachable broker is waited for; one that refuses is final.
        if (!(e instanceof ConnectionError && e.code === "connect_failed") || left <= 0) {
          client.state = "closed";
          throw e;
        }
        await new Promise((r) => setTimeout(r, Math.min(left, delay * (0.5 + Math.random() / 2))));
        delay = Math.min(reconnect.maxDelayMs ?? 5_000, delay * 2);
      }
    }
    client.state = "connected";
    return client;
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
        await this.open();
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

  private shutdown(error: unknown): void {
    this.state = "closed";
    if (this.heartbeat !== null) clearInterval(this.heartbeat);
    this.heartbeat = null;
    this.socket?.destroy();
    this.socket = null;
    this.failPending(error);
    for (const w of this.windowWaiters.splice(0)) w.reject(error);
    for (const w of this.readyWaiters.splice(0)) w.reject(error);
    for (const s of this.subscriptions) s.finish(error instanceof ConnectionError && error.code === "closed" ? null : error);
    this.subscriptions.clear();
    this.consumers.clear();
  }

  /** Closes the connection: acks gathered so far are sent first; waiting requests fail. */
  async close(): Promise<void> {
    if (this.state === "closed") return;
    for (const s of this.subscriptions) s.flush();
    const socket = this.socket;
    this.socket = null;
    this.shutdown(new ConnectionError("closed", "the client was closed"));
    if (socket !== null) {
      if (this.corked) socket.uncork();
      // The acks just flushed leave before the socket closes.
      await new Promise<void>((r) => socket.end(r));
      socket.destroy();
    }
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
        const s = this.consumers.get(frame.consumerId);
        if (s !== undefined) s.deliver(frame.deliveries);
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
  async subscribe(topic: string, options: SubscribeOptions = {}): Promise<Subscription> {
    const s = new Subscription(this, topic, options);
    await this.ready();
    await this.attach(s);
    this.subscriptions.add(s);
    return s;
  }

  private async attach(s: Subscription): Promise<void> {
    const generation = this.generation;
    // DELIVER may follow SUBSCRIBED in the same read: the consumer must be known by then.
    await this.requestNow(s.subscribeFrame(), "SUBSCRIBED", 0, (r) => {
      this.consumers.set(r.consumerId, s);
      s.attached(r.consumerId, r.subscription, r.partitions, generation);
    });
  }

  /** @internal a subscription closed itself. */
  forget(s: Subscription): void {
    this.subscriptions.delete(s);
    if (this.consumers.get(s.consumerId) === s) this.consumers.delete(s.consumerId);
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
    await this.request({ type: "CREATE_TOPIC", name, config, ifNotExists: options.ifNotExists ?? false }, "OK");
    if (!options.ifNotExists) return;
    const asked = Object.entries(config).filter(([, v]) => v !== undefined && v !== 0 && v !== 0n && v !== "0" && v !== "default");
    if (asked.length === 0) return;
    let existing: TopicConfig;
    try {
      existing = (await this.describeTopic(name)).config;
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

  async deleteTopic(name: string): Promise<void> {
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


