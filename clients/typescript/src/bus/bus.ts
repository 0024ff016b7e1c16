// Senders, receivers, handlers and settings of the bus, byte-compatible with the Python and
// Rust bus through protocol/bus-vectors.json.
//
// A sender publishes a typed message to the topic of its type (by default the type's name; a
// template such as "{sender}.{type}" gives each sending service its own topics), into the
// partition equal to the message's shard. A topic has as many partitions as the bus has shards.
// A receiver subscribes to those topics under its own identity (every receiving service gets
// every message, the instances of one service share them) and listens to chosen shards
// ("1,2,4-7"), which become the subscription's partition ranges.
//
// What a receiver does with each message, and why:
// - unknown type, unknown serializer, or a body its serializer cannot read: dead-lettered at once
//   with the reason; delivering it again cannot help;
// - from a sender service it does not listen to: acked without handling (`skipped`);
// - `beforeHandle` returns false: acked without handling (`refused`);
// - `handle` throws (`failed`): reported to onError (by default a process warning), and nacked
//   with the error (name and message) as reason and a delay from the handler's RetryPolicy
//   (exponential backoff with jitter); on its last attempt it is dead-lettered with that reason,
//   so the dead letter says why;
// - otherwise `afterHandle` runs and the message is acked (`handled`); an error in `afterHandle`
//   goes to onError, since the message was handled.
//
// Up to `concurrency` handlers run at once with `prefetch` messages delivered ahead of them;
// `ordered` keeps one message per key in flight (the broker's ordered subscription), so a retry
// never overtakes later messages of its key. `drain()` (and `stop()`) takes no new message, lets
// the handlers in flight finish within a timeout and gives the messages no handler started back
// with NACK's `release` flag, so they come again without an attempt counted.
//
// Rights: a sender needs `publish` on its topics, a receiver `consume` on its topics. Creating
// missing topics needs `manage`: without it the bus uses the topics an administrator made.

import type { Client } from "../client.js";
import { FerryMQError, ServerError, TopicConfigMismatch } from "../errors.js";
import type { Message } from "../message.js";
import { parsePartitionList, type Subscription } from "../subscription.js";
import { checkValues, type Schema, type Values } from "./schema.js";
import { SerializerUnavailable, Serializers, UnknownSerializer, UnreadableBody } from "./serializers.js";
import { keyBytes, shardForKey } from "./shard.js";

export const HEADER_TYPE = "x-bus-type";
export const HEADER_SERIALIZER = "x-bus-serializer";
export const HEADER_SENDER = "x-bus-sender";
export const HEADER_SHARD = "x-bus-shard";
export const HEADER_PREPARED = "x-bus-prepared-ms";
export const HEADER_SENT = "x-bus-sent-ms";

/** A bus misconfiguration: a topic with the wrong partition count, a bad shard... */
export class BusError extends FerryMQError {
  constructor(message: string) {
    super("bus", message);
    this.name = "BusError";
  }
}

/** A handler failed: what `onError` receives for each failure. */
export class HandlerError extends BusError {
  /** The nack reason: `<handler> raised <error name>: <message>`, at most 1024 bytes. */
  readonly reason: string;
  readonly messageId: string;
  readonly type: string;
  readonly attempt: number;
  /** True when the message was dead-lettered (its last attempt). */
  readonly final: boolean;
  /** The delay before it is delivered again; 0 when final. */
  readonly delayMs: number;

  constructor(reason: string, info: { messageId: string; type: string; attempt: number; final: boolean; delayMs: number; cause: unknown }) {
    super(reason);
    this.name = "HandlerError";
    this.reason = reason;
    this.messageId = info.messageId;
    this.type = info.type;
    this.attempt = info.attempt;
    this.final = info.final;
    this.delayMs = info.delayMs;
    (this as { cause?: unknown }).cause = info.cause;
  }
}

/**
 * When a failed message is tried again: after `initialDelayMs`, multiplied by `multiplier` at
 * each attempt up to `maxDelayMs`, each delay spread by +-`jitter` (a fraction). The delay
 * travels in the NACK, so the broker holds the message meanwhile.
 *
 * `maxAttempts` is the subscription's: absent leaves it to the broker (its default), which then
 * dead-letters after the last attempt with its own reason; a number is sent in SUBSCRIBE and the
 * receiver dead-letters the last failure itself, with the handler's error as the dead letter's
 * `x-ferrymq-dead-reason`. Every receiver of one subscription must use the same `maxAttempts`.
 */
export interface RetryPolicy {
  maxAttempts?: number;
  /** 200 ms by default. */
  initialDelayMs?: number;
  /** 2 by default. */
  multiplier?: number;
  /** 60 000 ms by default. */
  maxDelayMs?: number;
  /** 0.2 by default: each delay is within +-20 % of its base. */
  jitter?: number;
}

/** The delay after attempt `attempt` (1-based) of `policy` failed. */
export function retryDelayMs(policy: RetryPolicy, attempt: number, random: () => number = Math.random): number {
  const initial = policy.initialDelayMs ?? 200;
  const base = Math.min(policy.maxDelayMs ?? 60_000, initial * (policy.multiplier ?? 2) ** Math.max(0, attempt - 1));
  const spread = base * (policy.jitter ?? 0.2) * (2 * random() - 1);
  return Math.max(0, Math.min(Math.floor(base + spread), 0xffffffff));
}

function checkPolicy(policy: RetryPolicy): void {
  const { maxAttempts, initialDelayMs = 0, multiplier = 2, maxDelayMs = 0, jitter = 0 } = policy;
  if (maxAttempts !== undefined && (!Number.isInteger(maxAttempts) || maxAttempts < 1 || maxAttempts > 0xffffffff)) {
    throw new BusError(`maxAttempts is at least 1 (or absent: the broker's), got ${maxAttempts}`);
  }
  if (initialDelayMs < 0 || maxDelayMs < 0 || multiplier < 1 || jitter < 0 || jitter > 1) {
    throw new BusError("a retry policy has delays >= 0, a multiplier >= 1 and a jitter within 0..=1");
  }
}

/** Released messages are ready again after this pause, so that the broker does not deliver
 * them again to the consumer that is leaving before its unsubscribe is through. */
export const RELEASE_DELAY_MS = 100;

export type ShardResolver = (key: Values[string], shardCount: number) => number;

export interface SettingsInput {
  /** Broker, host:port. */
  addr?: string;
  /** This service's name: the sender header, and the receivers' subscription name. */
  identity?: string;
  /** Shard count, the same for every service (each topic's partitions); 1..=1024. */
  shardCount?: number;
  /** Sender services to receive from; empty = every sender. */
  listenServices?: string[];
  /** Shards to receive, e.g. "1,2,4-7"; undefined = every shard. */
  listenShards?: string;
  /** json, deflate-json, msgpack or protobuf. */
  serializer?: string;
  /** The topic of a type: `{type}` is its name, `{sender}` the sending service. */
  topicTemplate?: string;
}

export interface Settings extends Required<Omit<SettingsInput, "listenShards">> {
  listenShards: string | undefined;
}

const ARGS: [string, string, keyof SettingsInput][] = [
  ["--addr", "FERRYMQ_ADDR", "addr"],
  ["--identity", "FERRYMQ_BUS_IDENTITY", "identity"],
  ["--shards", "FERRYMQ_BUS_SHARDS", "shardCount"],
  ["--listen-services", "FERRYMQ_BUS_LISTEN_SERVICES", "listenServices"],
  ["--listen-shards", "FERRYMQ_BUS_LISTEN_SHARDS", "listenShards"],
  ["--serializer", "FERRYMQ_BUS_SERIALIZER", "serializer"],
];

/**
 * The bus's settings from, in order of precedence: `options`, command-line arguments
 * (`--addr`, `--identity`, `--shards`, `--listen-services`, `--listen-shards`, `--serializer`),
 * environment variables (`FERRYMQ_ADDR`, `FERRYMQ_BUS_IDENTITY`, `FERRYMQ_BUS_SHARDS`,
 * `FERRYMQ_BUS_LISTEN_SERVICES`, `FERRYMQ_BUS_LISTEN_SHARDS`, `FERRYMQ_BUS_SERIALIZER`), defaults.
 */
export function loadSettings(
  options: SettingsInput = {},
  argv: readonly string[] = [],
  env: Record<string, string | undefined> = process.env,
): Settings {
  const picked: Record<string, string | undefined> = {};
  for (const [flag, variable, name] of ARGS) {
    let arg: string | undefined;
    for (let i = 0; i < argv.length; i++) {
      if (argv[i] === flag) arg = argv[i + 1];
      else if (argv[i]!.startsWith(flag + "=")) arg = argv[i]!.slice(flag.length + 1);
    }
    const value = arg ?? env[variable];
    if (value !== undefined && value !== "") picked[name] = value;
  }
  let shardCount = options.shardCount;
  if (shardCount === undefined && picked.shardCount !== undefined) {
    if (!/^\d+$/.test(picked.shardCount)) throw new BusError(`FERRYMQ_BUS_SHARDS is a number, got ${JSON.stringify(picked.shardCount)}`);
    shardCount = Number(picked.shardCount);
  }
  const settings: Settings = {
    addr: options.addr ?? picked.addr ?? "127.0.0.1:7070",
    identity: options.identity ?? picked.identity ?? "NoIdentification",
    shardCount: shardCount ?? 10,
    listenServices:
      options.listenServices ??
      (picked.listenServices ?? "")
        .split(",")
        .map((s) => s.trim())
        .filter((s) => s !== ""),
    listenShards: options.listenShards ?? picked.listenShards,
    serializer: options.serializer ?? picked.serializer ?? "json",
    topicTemplate: options.topicTemplate ?? "{type}",
  };
  if (!Number.isInteger(settings.shardCount) || settings.shardCount < 1 || settings.shardCount > 1024) {
    throw new BusError(`the shard count is 1..=1024 (a topic's partitions), got ${settings.shardCount}`);
  }
  const identityBytes = new TextEncoder().encode(settings.identity).length;
  if (identityBytes < 1 || identityBytes > 200) {
    throw new BusError("the identity is 1..=200 bytes: it names subscriptions and appears in topics");
  }
  if (settings.listenShards !== undefined) {
    for (const { last } of parsePartitionList(settings.listenShards)) {
      if (last >= settings.shardCount) {
        throw new BusError(`shard ${last} in ${JSON.stringify(settings.listenShards)} is not below the shard count ${settings.shardCount}`);
      }
    }
  }
  return settings;
}

function topicOf(settings: Settings, schema: Schema<unknown>, sender: string): string {
  if (schema.topic !== undefined) return schema.topic;
  return settings.topicTemplate.replaceAll("{type}", schema.name).replaceAll("{sender}", sender);
}

/** A message ready to send: its topic, shard, key bytes, body and headers. */
export interface PreparedMessage {
  topic: string;
  shard: number;
  key: Uint8Array;
  body: Uint8Array;
  headers: [string, string][];
  priority: number;
  deliverAfterMs: number | null;
}

export interface SendOptions {
  serializer?: string;
  shardResolver?: ShardResolver;
  priority?: number;
  deliverAfterMs?: number | null;
}

/**
 * Creates `topic` with `shardCount` partitions unless it exists (`create`), and resolves to its
 * partition count (with `inspect`; undefined without). Creating needs `manage` and reading the
 * count `inspect` on the topic: a user without them (a sender with only `publish`) gets
 * undefined, and the bus then relies on the topic an administrator made.
 */
export async function ensureTopic(
  client: Client,
  topic: string,
  shardCount: number,
  storage: "disk" | "memory" = "disk",
  create = true,
  inspect = true,
): Promise<number | undefined> {
  if (create) {
    try {
      await client.createTopic(topic, { partitions: shardCount, storage }, { ifNotExists: true });
    } catch (e) {
      // Another storage is the administrator's choice; the partitions are checked by the caller.
      if (e instanceof TopicConfigMismatch) return e.existing.partitions;
      if (!(e instanceof ServerError && e.code === "forbidden")) throw e;
    }
  }
  if (!inspect) return undefined;
  try {
    return (await client.describeTopic(topic)).config.partitions;
  } catch (e) {
    if (e instanceof ServerError && e.code === "forbidden") return undefined;
    throw e;
  }
}

async function ensureSenderTopic(client: Client, topic: string, shardCount: number, storage: "disk" | "memory", create: boolean): Promise<void> {
  const partitions = await ensureTopic(client, topic, shardCount, storage, create);
  if (partitions !== undefined && partitions !== shardCount) {
    throw new BusError(
      `topic ${JSON.stringify(topic)} has ${partitions} partitions but the bus has ${shardCount} shards: ` +
        "every service must use the same shard count (FERRYMQ_BUS_SHARDS)",
    );
  }
}

/** Publishes typed messages: `await sender.send(OrderPlaced, { order_id: 42, ... })`. */
export class Sender {
  readonly client: Client;
  readonly settings: Settings;
  readonly serializers: Serializers;
  private readonly storage: "disk" | "memory";
  private readonly createTopics: boolean;
  private readonly topicsReady = new Map<string, Promise<void>>();

  private constructor(client: Client, settings: Settings, serializers: Serializers, storage: "disk" | "memory", createTopics: boolean) {
    this.client = client;
    this.settings = settings;
    this.serializers = serializers;
    this.storage = storage;
    this.createTopics = createTopics;
  }

  /** `createTopics: false` never creates topics (no `manage` right needed). */
  static async create(
    client: Client,
    settings: Settings,
    options: { serializers?: Serializers; storage?: "disk" | "memory"; createTopics?: boolean } = {},
  ): Promise<Sender> {
    const serializers = options.serializers ?? (await Serializers.load());
    serializers.get(settings.serializer); // an unknown serializer fails here, not on the first send
    return new Sender(client, settings, serializers, options.storage ?? "disk", options.createTopics ?? true);
  }

  /** The topic, shard and broker message of `message`, without sending it. */
  prepare<T>(schema: Schema<T>, message: T, options: SendOptions = {}): PreparedMessage {
    const values = checkValues(schema as Schema<unknown>, schema.values(message) as Record<string, unknown>);
    const keyField = schema.fields.find((f) => f.name === schema.key)!;
    const key = values[schema.key]!;
    const n = this.settings.shardCount;
    let shard: number;
    if (options.shardResolver === undefined) {
      shard = shardForKey(keyField.type, key, n);
    } else {
      shard = options.shardResolver(key, n);
      if (!Number.isInteger(shard) || shard < 0 || shard >= n) {
        throw new BusError(`the shard resolver returned ${String(shard)} for ${String(key)}: a shard is 0..${n - 1}`);
      }
    }
    const name = options.serializer ?? this.settings.serializer;
    const body = this.serializers.get(name).dumps(schema as Schema<unknown>, values);
    return {
      topic: topicOf(this.settings, schema as Schema<unknown>, this.settings.identity),
      shard,
      key: keyBytes(keyField.type, key),
      body,
      headers: [
        [HEADER_TYPE, schema.name],
        [HEADER_SERIALIZER, name],
        [HEADER_SENDER, this.settings.identity],
        [HEADER_SHARD, String(shard)],
        [HEADER_PREPARED, String(Date.now())],
      ],
      priority: options.priority ?? 0,
      deliverAfterMs: options.deliverAfterMs ?? null,
    };
  }

  private ready(topic: string): Promise<void> {
    let p = this.topicsReady.get(topic);
    if (p === undefined) {
      p = ensureSenderTopic(this.client, topic, this.settings.shardCount, this.storage, this.createTopics);
      this.topicsReady.set(topic, p);
      p.catch(() => this.topicsReady.delete(topic));
    }
    return p;
  }

  /** Publishes one message to its shard and waits for the broker's receipt; returns its id. */
  async send<T>(schema: Schema<T>, message: T, options: SendOptions = {}): Promise<string> {
    const [id] = await this.sendMany(schema, [message], options);
    return id!;
  }

  /** Publishes many messages, one batch per shard, all in flight at once; ids in input order. */
  async sendMany<T>(schema: Schema<T>, messages: readonly T[], options: SendOptions = {}): Promise<string[]> {
    const groups = new Map<string, { topic: string; shard: number; items: { index: number; m: PreparedMessage }[] }>();
    messages.forEach((message, index) => {
      const m = this.prepare(schema, message, options);
      const k = `${m.topic}\u0000${m.shard}`;
      let g = groups.get(k);
      if (g === undefined) groups.set(k, (g = { topic: m.topic, shard: m.shard, items: [] }));
      g.items.push({ index, m });
    });
    const ids: string[] = new Array(messages.length);
    await Promise.all(
      [...groups.values()].map(async (g) => {
        await this.ready(g.topic);
        const sent = String(Date.now());
        for (let i = 0; i < g.items.length; i += 65_536) {
          const chunk = g.items.slice(i, i + 65_536);
          const receipt = await this.client.publishBatch(
            g.topic,
            chunk.map(({ m }) => ({
              body: m.body,
              key: m.key,
              headers: [...m.headers, [HEADER_SENT, sent] as [string, string]],
              priority: m.priority,
              deliverAfterMs: m.deliverAfterMs,
            })),
            { partition: g.shard },
          );
          receipt.ids().forEach((id, j) => (ids[chunk[j]!.index] = id));
        }
      }),
    );
    return ids;
  }
}

/** What a handler knows about the message it handles. */
export interface Context {
  delivery: Message;
  type: string;
  sender: string;
  shard: number;
  serializer: string;
  attempt: number;
}

export type Outcome = "handled" | "refused" | "failed" | "dead_lettered" | "skipped";

/** One message's statistics: outcome, body size and UTC times (undefined when unknown). */
export interface MessageStats {
  message: unknown;
  type: string;
  outcome: Outcome;
  size: number;
  preparedAt: Date | undefined;
  sentAt: Date | undefined;
  receivedAt: Date;
  handledAt: Date;
  shard: number | undefined;
  sender: string | undefined;
  error: string | undefined;
}

/** Handles one message type; methods may be plain or async. */
export interface Handler<T> {
  messageType: Schema<T>;
  /** Return false to refuse the message: it is acked without handling. */
  beforeHandle?(message: T, context: Context): boolean | Promise<boolean>;
  handle(message: T, context: Context): unknown;
  afterHandle?(message: T, context: Context): unknown;
  /** This handler's retry policy; the receiver's when absent. */
  retry?: RetryPolicy;
}

export interface ReceiverOptions {
  onStats?: (stats: MessageStats) => unknown;
  /**
   * Handler failures (a `HandlerError` each) and errors no message outcome carries (a failing
   * statistics hook or afterHandle). Without it they go to the client's `onError`, else are
   * emitted as process warnings, so that no failure is silent.
   */
  onError?: (error: unknown) => void;
  serializers?: Serializers;
  /** Handlers running at once; 1 by default (one message at a time). */
  concurrency?: number;
  /** Messages per topic delivered ahead of the handlers (the credit window); 4 x concurrency by default. */
  prefetch?: number;
  /** @deprecated the older name of `prefetch`. */
  window?: number;
  /** At most one message per key in flight, across retries and every instance of the service. */
  ordered?: boolean;
  /** The policy of handlers without their own. */
  retry?: RetryPolicy;
  ackTimeoutMs?: number;
  /** The subscription's max attempts when no retry policy sets it; absent = the broker's. */
  maxAttempts?: number;
  start?: "earliest" | "latest";
  storage?: "disk" | "memory";
  /** `false`: never create topics (no `manage` right needed). True by default: create missing
   * topics when the user may. */
  createTopics?: boolean;
  /** How long `stop()` waits for handlers in flight; 30 000 ms by default. */
  drainTimeoutMs?: number;
}

function fieldDate(text: string | undefined): Date | undefined {
  return text !== undefined && /^\d+$/.test(text) ? new Date(Number(text)) : undefined;
}

function truncate(text: string, maxBytes = 1024): string {
  const bytes = new TextEncoder().encode(text);
  if (bytes.length <= maxBytes) return text;
  return new TextDecoder().decode(bytes.subarray(0, maxBytes - 3)).replace(/\uFFFD$/, "");
}

/** Receives the message types of its handlers from the listened services and shards. */
export class Receiver {
  readonly client: Client;
  readonly settings: Settings;
  readonly counts: Record<Outcome, number> = { handled: 0, refused: 0, failed: 0, dead_lettered: 0, skipped: 0 };
  private readonly handlers = new Map<string, Handler<unknown>>();
  private readonly options: ReceiverOptions;
  private serializers: Serializers | null;
  private subscriptions: Subscription[] = [];
  private loops: Promise<void>[] = [];
  /** Messages whose processing waits for a promise (a handler's, a hook's, a nack's). */
  private inflightCount = 0;
  private readonly idleWaiters: (() => void)[] = [];
  private readonly slotWaiters: (() => void)[] = [];
  private running = 0;
  private stopped = false;
  readonly concurrency: number;
  readonly prefetch: number;
  private readonly retry: RetryPolicy;

  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- each handler has its own message type
  constructor(client: Client, settings: Settings, handlers: Handler<any>[], options: ReceiverOptions = {}) {
    this.client = client;
    this.settings = settings;
    this.options = options;
    this.serializers = options.serializers ?? null;
    for (const h of handlers as unknown as Handler<unknown>[]) {
      const name = h.messageType.name;
      if (this.handlers.has(name)) throw new BusError(`two handlers for ${name}`);
      if (h.retry !== undefined) checkPolicy(h.retry);
      this.handlers.set(name, h);
    }
    if (this.handlers.size === 0) throw new BusError("a receiver needs at least one handler");
    this.concurrency = options.concurrency ?? 1;
    if (!Number.isInteger(this.concurrency) || this.concurrency < 1) throw new BusError(`concurrency is at least 1, got ${this.concurrency}`);
    this.prefetch = options.prefetch ?? options.window ?? 4 * this.concurrency;
    if (!Number.isInteger(this.prefetch) || this.prefetch < 1 || this.prefetch > 1_000_000) {
      throw new BusError(`prefetch is 1..=1000000, got ${this.prefetch}`);
    }
    this.retry = options.retry ?? (options.maxAttempts ? { maxAttempts: options.maxAttempts } : {});
    checkPolicy(this.retry);
  }

  private policy(handler: Handler<unknown>): RetryPolicy {
    return handler.retry ?? this.retry;
  }

  private topics(): [string, Handler<unknown>][] {
    const perSender = this.settings.topicTemplate.includes("{sender}");
    const out: [string, Handler<unknown>][] = [];
    for (const h of this.handlers.values()) {
      const schema = h.messageType as Schema<unknown>;
      if (perSender && schema.topic === undefined) {
        if (this.settings.listenServices.length === 0) throw new BusError("with a {sender} topic template, listenServices must name the senders");
        for (const s of this.settings.listenServices) out.push([topicOf(this.settings, schema, s), h]);
      } else {
        out.push([topicOf(this.settings, schema, ""), h]);
      }
    }
    return out;
  }

  /** Subscribes to every topic; messages are handled from then on until `stop`. */
  async start(): Promise<void> {
    if (this.subscriptions.length > 0) throw new BusError("this receiver is already started");
    this.serializers ??= await Serializers.load();
    for (const [name, why] of this.serializers.unavailable()) {
      this.report(new BusError(`receiver ${JSON.stringify(this.settings.identity)} cannot read ${name} messages (${why}): they are given back, not handled`));
    }
    this.stopped = false;
    this.running = 0;
    this.slotWaiters.length = 0;
    try {
      await this.subscribeAll();
    } catch (e) {
      await this.drain(0); // what was attached already is given back, unstarted
      throw e;
    }
  }

  private async subscribeAll(): Promise<void> {
    const n = this.settings.shardCount;
    for (const [topic, handler] of this.topics()) {
      // The partition count comes with SUBSCRIBED: no inspect right needed.
      if (this.options.createTopics ?? true) await ensureTopic(this.client, topic, n, this.options.storage ?? "disk", true, false);
      const sub = await this.client.subscribe(topic, {
        subscription: this.settings.identity,
        start: this.options.start ?? "earliest",
        window: this.prefetch,
        ackTimeoutMs: this.options.ackTimeoutMs ?? 0,
        maxAttempts: this.policy(handler).maxAttempts ?? 0,
        ordered: this.options.ordered ?? false,
        ...(this.settings.listenShards !== undefined ? { partitions: this.settings.listenShards } : {}),
      });
      if (sub.partitions !== n) {
        await sub.close();
        throw new BusError(`topic ${JSON.stringify(topic)} has ${sub.partitions} partitions but the bus has ${n} shards`);
      }
      this.subscriptions.push(sub);
      this.loops.push(this.consume(sub));
    }
  }

  /** Resolves when every subscription has ended (after `stop`). */
  async run(): Promise<void> {
    if (this.subscriptions.length === 0) await this.start();
    await Promise.all(this.loops);
    await this.idle();
  }

  /**
   * Stops taking messages, waits up to `timeoutMs` (by default `drainTimeoutMs`) for the
   * handlers in flight, gives back the messages no handler started (NACK `release`: no attempt
   * counted) and unsubscribes. A handler still running at the timeout is left to finish, but its
   * message goes back to the broker counted as an attempt and its settlement is dropped. Resolves
   * to how many messages were given back unstarted.
   */
  async drain(timeoutMs?: number): Promise<number> {
    if (this.stopped || this.subscriptions.length === 0) return 0;
    this.stopped = true;
    // Every consumer loop wakes up, sees `stopped` and ends without taking a message.
    for (const sub of this.subscriptions) sub.wake();
    for (const w of this.slotWaiters.splice(0)) w();
    await Promise.all(this.loops);
    const limit = timeoutMs ?? this.options.drainTimeoutMs ?? 30_000;
    if (this.inflightCount > 0) {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const late = await Promise.race([
        this.idle().then(() => false),
        new Promise<boolean>((r) => (timer = setTimeout(() => r(true), limit))),
      ]);
      clearTimeout(timer);
      if (late) this.report(new BusError(`${this.inflightCount} handler(s) still ran after ${limit} ms; their messages will be delivered again`));
    }
    let released = 0;
    for (const sub of this.subscriptions) {
      try {
        released += await sub.closeReleasing([], { delayMs: RELEASE_DELAY_MS });
      } catch (e) {
        this.report(e);
      }
    }
    this.subscriptions = [];
    this.loops = [];
    return released;
  }

  /** `drain()` with the receiver's `drainTimeoutMs`. */
  async stop(): Promise<void> {
    await this.drain();
  }

  /** Wakes a consumer loop waiting for a handler slot. */
  private releaseSlot(): void {
    this.running--;
    const next = this.slotWaiters.shift();
    if (next !== undefined) next();
  }

  /** A message whose processing waited for a promise is done (made once: no closure a message). */
  private readonly onSettled = (): void => {
    this.releaseSlot();
    this.inflightDone();
  };

  private readonly onFailed = (e: unknown): void => {
    this.releaseSlot();
    this.inflightDone();
    this.report(e); // one message's failure (a lost connection while settling it) must not stop the rest
  };

  private inflightDone(): void {
    if (--this.inflightCount === 0) for (const w of this.idleWaiters.splice(0)) w();
  }

  /** Resolves once no message's processing is waiting for a promise. */
  private idle(): Promise<void> {
    if (this.inflightCount === 0) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  private async consume(sub: Subscription): Promise<void> {
    // A message is taken only once a handler slot is free: what is not taken stays in the
    // subscription's buffer, and `drain` gives it back unstarted. `drain` wakes both waits.
    //
    // Messages are processed in a run while slots are free and messages buffered: a message
    // whose handler returns no promise is handled and settled without one; one whose handler
    // returns a promise holds its slot until that settles.
    try {
      for (;;) {
        if (this.stopped) return;
        if (sub.buffered === 0) {
          if (!(await sub.waitBuffered())) return;
          continue;
        }
        if (this.running >= this.concurrency) {
          await new Promise<void>((resolve) => this.slotWaiters.push(resolve));
          continue;
        }
        while (this.running < this.concurrency && !this.stopped) {
          const m = sub.takeNowait();
          if (m === null) break;
          this.running++;
          let pending: Promise<unknown> | undefined;
          try {
            pending = this.processNow(m);
          } catch (e) {
            this.report(e); // one message's failure (a lost connection while settling it) must not stop the rest
          }
          if (pending === undefined) {
            this.running--;
            continue;
          }
          this.inflightCount++;
          pending.then(this.onSettled, this.onFailed);
        }
      }
    } catch (e) {
      this.report(e);
    }
  }

  private report(e: unknown): void {
    const hook = this.options.onError;
    if (hook === undefined) {
      this.client.reportError(e);
      return;
    }
    try {
      hook(e);
    } catch {
      // A failing error handler must not stop the receiver.
    }
  }

  /** Handles one delivery and settles it; returns its outcome. */
  async process(d: Message): Promise<Outcome> {
    const outcome: Outcome | Promise<Outcome> = this.processNow(d) ?? (this.lastOutcome as Outcome);
    return outcome;
  }

  /** What the bus reads from a message's headers, the first value of each (see `meta`). */
  private metaOf: [string, string][] | null = null;
  private metaValue: HeaderMeta | null = null;
  private lastOutcome: Outcome | undefined;

  /**
   * The bus's headers of a message, read by one scan; the messages of a sender's batch share
   * their decoded headers, so the scan is done once for all of them.
   */
  private meta(headers: [string, string][]): HeaderMeta {
    if (headers === this.metaOf && this.metaValue !== null) return this.metaValue;
    let type: string | undefined;
    let sender: string | undefined;
    let shardText: string | undefined;
    let serializer: string | undefined;
    let prepared: string | undefined;
    let sent: string | undefined;
    for (const [name, value] of headers) {
      if (name === HEADER_TYPE) type ??= value;
      else if (name === HEADER_SENDER) sender ??= value;
      else if (name === HEADER_SHARD) shardText ??= value;
      else if (name === HEADER_SERIALIZER) serializer ??= value;
      else if (name === HEADER_PREPARED) prepared ??= value;
      else if (name === HEADER_SENT) sent ??= value;
    }
    const listen = this.settings.listenServices;
    const meta: HeaderMeta = {
      type: type ?? "",
      sender,
      shard: shardText !== undefined && /^\d+$/.test(shardText) ? Number(shardText) : undefined,
      serializer: serializer ?? "",
      handler: this.handlers.get(type ?? ""),
      skip: listen.length > 0 && (sender === undefined || !listen.includes(sender)),
      prepared,
      sent,
    };
    this.metaOf = headers;
    this.metaValue = meta;
    return meta;
  }

  /**
   * Handles one delivery and settles it. Returns undefined when that is done (the outcome is
   * then in `lastOutcome`), else a promise of the outcome: a handler, hook or nack that returned
   * a promise is waited for; everything else runs without one.
   */
  private processNow(d: Message): Promise<Outcome> | undefined {
    const onStats = this.options.onStats;
    const receivedAt = onStats !== undefined ? new Date() : undefined;
    const meta = this.meta(d.headers);
    const handler = meta.handler;
    if (meta.skip) {
      d.ack();
      return this.finish(d, meta, "skipped", undefined, undefined, receivedAt);
    }
    if (handler === undefined) {
      const error = `no handler for message type ${JSON.stringify(meta.type)} in receiver ${JSON.stringify(this.settings.identity)}`;
      return d.nack({ deadLetter: true, reason: truncate(error) }).then(() => this.finishAsync(d, meta, "dead_lettered", undefined, error, receivedAt));
    }
    const schema = handler.messageType as Schema<unknown>;
    let obj: unknown;
    try {
      obj = schema.build(this.serializers!.get(meta.serializer).loads(schema, d.body));
    } catch (e) {
      if (e instanceof SerializerUnavailable) {
        // A valid message this installation cannot read: not the message's fault, so it
        // goes back for an instance that can read it.
        const error = truncate(`receiver ${JSON.stringify(this.settings.identity)} cannot read ${meta.serializer}: ${e.message}`);
        return d.nack({ delayMs: retryDelayMs(this.policy(handler), d.attempt), reason: error }).then(() => {
          this.report(new SerializerUnavailable(error));
          return this.finishAsync(d, meta, "failed", undefined, error, receivedAt);
        });
      }
      const error =
        e instanceof UnknownSerializer || e instanceof UnreadableBody
          ? `${e.name}: ${e.message}`
          : `${schema.name} could not be built: ${e instanceof Error ? `${e.name}: ${e.message}` : String(e)}`;
      return d.nack({ deadLetter: true, reason: truncate(error) }).then(() => this.finishAsync(d, meta, "dead_lettered", undefined, error, receivedAt));
    }
    const ctx: Context = { delivery: d, type: meta.type, sender: meta.sender ?? "", shard: meta.shard ?? -1, serializer: meta.serializer, attempt: d.attempt };
    if (handler.beforeHandle !== undefined) {
      // The general path: a refusal check first, every step awaited.
      return this.handle(handler, obj, ctx).then(([outcome, error]) => this.finishAsync(d, meta, outcome, obj, error, receivedAt));
    }
    let result: unknown;
    try {
      result = handler.handle(obj, ctx);
    } catch (e) {
      return this.failed(handler, ctx, e).then(([outcome, error]) => this.finishAsync(d, meta, outcome, obj, error, receivedAt));
    }
    if (isPromiseLike(result)) {
      return Promise.resolve(result).then(
        () => {
          if (handler.afterHandle !== undefined) {
            return this.handled(handler, obj, ctx).then(([outcome, error]) => this.finishAsync(d, meta, outcome, obj, error, receivedAt));
          }
          d.ack();
          return this.finishAsync(d, meta, "handled", obj, undefined, receivedAt);
        },
        (e) => this.failed(handler, ctx, e).then(([outcome, error]) => this.finishAsync(d, meta, outcome, obj, error, receivedAt)),
      );
    }
    if (handler.afterHandle !== undefined) {
      return this.handled(handler, obj, ctx).then(([outcome, error]) => this.finishAsync(d, meta, outcome, obj, error, receivedAt));
    }
    d.ack();
    return this.finish(d, meta, "handled", obj, undefined, receivedAt);
  }

  /** Counts the outcome and calls the statistics hook: undefined when nothing is left to wait for. */
  private finish(d: Message, meta: HeaderMeta, outcome: Outcome, obj: unknown, error: string | undefined, receivedAt: Date | undefined): Promise<Outcome> | undefined {
    this.counts[outcome]++;
    this.lastOutcome = outcome;
    const onStats = this.options.onStats;
    if (onStats === undefined) return undefined;
    const stats: MessageStats = {
      message: obj,
      type: meta.type,
      outcome,
      size: d.body.length,
      preparedAt: fieldDate(meta.prepared),
      sentAt: fieldDate(meta.sent),
      receivedAt: receivedAt ?? new Date(),
      handledAt: new Date(),
      shard: meta.shard,
      sender: meta.sender,
      error,
    };
    let result: unknown;
    try {
      result = onStats(stats);
    } catch (e) {
      this.report(e);
      return undefined;
    }
    if (!isPromiseLike(result)) return undefined;
    return Promise.resolve(result).then(
      () => outcome,
      (e) => {
        this.report(e);
        return outcome;
      },
    );
  }

  private finishAsync(d: Message, meta: HeaderMeta, outcome: Outcome, obj: unknown, error: string | undefined, receivedAt: Date | undefined): Outcome | Promise<Outcome> {
    return this.finish(d, meta, outcome, obj, error, receivedAt) ?? outcome;
  }

  private async handle(handler: Handler<unknown>, obj: unknown, ctx: Context): Promise<[Outcome, string | undefined]> {
    const d = ctx.delivery;
    try {
      if (handler.beforeHandle && !(await handler.beforeHandle(obj, ctx))) {
        d.ack();
        return ["refused", undefined];
      }
      await handler.handle(obj, ctx);
    } catch (e) {
      return this.failed(handler, ctx, e);
    }
    return this.handled(handler, obj, ctx);
  }

  /** After a handler succeeded: afterHandle (its failure is reported, not retried), then the ack. */
  private async handled(handler: Handler<unknown>, obj: unknown, ctx: Context): Promise<[Outcome, string | undefined]> {
    try {
      await handler.afterHandle?.(obj, ctx);
    } catch (e) {
      this.report(e);
    }
    ctx.delivery.ack();
    return ["handled", undefined];
  }

  /** After a handler failed: the nack with its reason and the policy's delay, or the dead letter. */
  private async failed(handler: Handler<unknown>, ctx: Context, e: unknown): Promise<[Outcome, string | undefined]> {
    const d = ctx.delivery;
    const who = handler.constructor !== Object && handler.constructor?.name ? handler.constructor.name : `${ctx.type} handler`;
    const reason = truncate(`${who} raised ${e instanceof Error ? `${e.name}: ${e.message}` : String(e)}`);
    const policy = this.policy(handler);
    const final = policy.maxAttempts !== undefined && d.attempt >= policy.maxAttempts;
    const delayMs = final ? 0 : retryDelayMs(policy, d.attempt);
    if (final) await d.nack({ deadLetter: true, reason }).catch((err) => this.report(err));
    else await d.nack({ delayMs, reason }).catch((err) => this.report(err));
    this.report(new HandlerError(reason, { messageId: d.id, type: ctx.type, attempt: d.attempt, final, delayMs, cause: e }));
    return ["failed", reason];
  }
}

interface HeaderMeta {
  type: string;
  sender: string | undefined;
  shard: number | undefined;
  serializer: string;
  handler: Handler<unknown> | undefined;
  /** From a sender service the receiver does not listen to. */
  skip: boolean;
  prepared: string | undefined;
  sent: string | undefined;
}

function isPromiseLike(v: unknown): v is PromiseLike<unknown> {
  return v !== null && (typeof v === "object" || typeof v === "function") && typeof (v as { then?: unknown }).then === "function";
}
