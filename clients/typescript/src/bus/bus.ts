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
// - `handle` throws: nacked with the error as reason (`failed`); the broker delivers it again
//   until the subscription's max_attempts, then moves it to the dead-letter topic;
// - otherwise `afterHandle` runs and the message is acked (`handled`); an error in `afterHandle`
//   goes to onError, since the message was handled.

import type { Client } from "../client.js";
import { FerryMQError } from "../errors.js";
import type { Message } from "../message.js";
import { parsePartitionList, type Subscription } from "../subscription.js";
import { checkValues, type Schema, type Values } from "./schema.js";
import { Serializers, UnknownSerializer, UnreadableBody } from "./serializers.js";
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

async function ensureTopic(client: Client, topic: string, shardCount: number, storage: "disk" | "memory"): Promise<void> {
  await client.createTopic(topic, { partitions: shardCount, storage }, { ifNotExists: true });
  const info = await client.describeTopic(topic);
  if (info.config.partitions !== shardCount) {
    throw new BusError(
      `topic ${JSON.stringify(topic)} has ${info.config.partitions} partitions but the bus has ${shardCount} shards: ` +
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
  private readonly topicsReady = new Map<string, Promise<void>>();

  private constructor(client: Client, settings: Settings, serializers: Serializers, storage: "disk" | "memory") {
    this.client = client;
    this.settings = settings;
    this.serializers = serializers;
    this.storage = storage;
  }

  static async create(
    client: Client,
    settings: Settings,
    options: { serializers?: Serializers; storage?: "disk" | "memory" } = {},
  ): Promise<Sender> {
    const serializers = options.serializers ?? (await Serializers.load());
    serializers.get(settings.serializer); // an unknown serializer fails here, not on the first send
    return new Sender(client, settings, serializers, options.storage ?? "disk");
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
      p = ensureTopic(this.client, topic, this.settings.shardCount, this.storage);
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
}

export interface ReceiverOptions {
  onStats?: (stats: MessageStats) => unknown;
  /** Errors no message outcome carries: a failing statistics hook or afterHandle. */
  onError?: (error: unknown) => void;
  serializers?: Serializers;
  /** Messages in flight per topic (the credit window); 1024 by default. */
  window?: number;
  ackTimeoutMs?: number;
  maxAttempts?: number;
  start?: "earliest" | "latest";
  storage?: "disk" | "memory";
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

  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- each handler has its own message type
  constructor(client: Client, settings: Settings, handlers: Handler<any>[], options: ReceiverOptions = {}) {
    this.client = client;
    this.settings = settings;
    this.options = options;
    this.serializers = options.serializers ?? null;
    for (const h of handlers as unknown as Handler<unknown>[]) {
      const name = h.messageType.name;
      if (this.handlers.has(name)) throw new BusError(`two handlers for ${name}`);
      this.handlers.set(name, h);
    }
    if (this.handlers.size === 0) throw new BusError("a receiver needs at least one handler");
  }

  private topics(): string[] {
    const perSender = this.settings.topicTemplate.includes("{sender}");
    const out: string[] = [];
    for (const h of this.handlers.values()) {
      const schema = h.messageType as Schema<unknown>;
      if (perSender && schema.topic === undefined) {
        if (this.settings.listenServices.length === 0) throw new BusError("with a {sender} topic template, listenServices must name the senders");
        for (const s of this.settings.listenServices) out.push(topicOf(this.settings, schema, s));
      } else {
        out.push(topicOf(this.settings, schema, ""));
      }
    }
    return out;
  }

  /** Subscribes to every topic; messages are handled from then on until `stop`. */
  async start(): Promise<void> {
    if (this.subscriptions.length > 0) throw new BusError("this receiver is already started");
    this.serializers ??= await Serializers.load();
    for (const topic of this.topics()) {
      await ensureTopic(this.client, topic, this.settings.shardCount, this.options.storage ?? "disk");
      const sub = await this.client.subscribe(topic, {
        subscription: this.settings.identity,
        start: this.options.start ?? "earliest",
        window: this.options.window ?? 1024,
        ackTimeoutMs: this.options.ackTimeoutMs ?? 0,
        maxAttempts: this.options.maxAttempts ?? 0,
        ...(this.settings.listenShards !== undefined ? { partitions: this.settings.listenShards } : {}),
      });
      this.subscriptions.push(sub);
      this.loops.push(this.consume(sub));
    }
  }

  /** Resolves when every subscription has ended (after `stop`). */
  async run(): Promise<void> {
    if (this.subscriptions.length === 0) await this.start();
    await Promise.all(this.loops);
  }

  async stop(): Promise<void> {
    await Promise.all(this.subscriptions.map((s) => s.close()));
    await Promise.all(this.loops);
  }

  private async consume(sub: Subscription): Promise<void> {
    try {
      for await (const m of sub) {
        // One message's failure (a lost connection while settling it) must not stop the rest.
        await this.process(m).catch((e) => this.report(e));
      }
    } catch (e) {
      this.report(e);
    }
  }

  private report(e: unknown): void {
    if (this.options.onError) {
      try {
        this.options.onError(e);
      } catch {
        // A failing error handler must not stop the receiver.
      }
    }
  }

  /** Handles one delivery and settles it; returns its outcome. */
  async process(d: Message): Promise<Outcome> {
    const receivedAt = new Date();
    const h = new Map<string, string>();
    for (const [name, value] of d.headers) if (!h.has(name)) h.set(name, value);
    const type = h.get(HEADER_TYPE) ?? "";
    const sender = h.get(HEADER_SENDER);
    const shardText = h.get(HEADER_SHARD);
    const shard = shardText !== undefined && /^\d+$/.test(shardText) ? Number(shardText) : undefined;
    const serializerName = h.get(HEADER_SERIALIZER) ?? "";
    let obj: unknown = undefined;
    let error: string | undefined;
    let outcome: Outcome;
    const listen = this.settings.listenServices;
    if (listen.length > 0 && (sender === undefined || !listen.includes(sender))) {
      d.ack();
      outcome = "skipped";
    } else {
      const handler = this.handlers.get(type);
      if (handler === undefined) {
        error = `no handler for message type ${JSON.stringify(type)} in receiver ${JSON.stringify(this.settings.identity)}`;
        await d.nack({ deadLetter: true, reason: truncate(error) });
        outcome = "dead_lettered";
      } else {
        const schema = handler.messageType as Schema<unknown>;
        try {
          const values = this.serializers!.get(serializerName).loads(schema, d.body);
          obj = schema.build(values);
        } catch (e) {
          error =
            e instanceof UnknownSerializer || e instanceof UnreadableBody
              ? `${e.name}: ${e.message}`
              : `${schema.name} could not be built: ${e instanceof Error ? `${e.name}: ${e.message}` : String(e)}`;
          await d.nack({ deadLetter: true, reason: truncate(error) });
          outcome = "dead_lettered";
        }
        if (error === undefined) {
          const ctx: Context = { delivery: d, type, sender: sender ?? "", shard: shard ?? -1, serializer: serializerName, attempt: d.attempt };
          [outcome, error] = await this.handle(handler, obj, ctx);
        } else {
          outcome = "dead_lettered";
        }
      }
    }
    this.counts[outcome]++;
    if (this.options.onStats) {
      const stats: MessageStats = {
        message: obj,
        type,
        outcome,
        size: d.body.length,
        preparedAt: fieldDate(h.get(HEADER_PREPARED)),
        sentAt: fieldDate(h.get(HEADER_SENT)),
        receivedAt,
        handledAt: new Date(),
        shard,
        sender,
        error,
      };
      try {
        await this.options.onStats(stats);
      } catch (e) {
        this.report(e);
      }
    }
    return outcome;
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
      const reason = `${handler.constructor?.name ?? "handler"} raised ${e instanceof Error ? `${e.name}: ${e.message}` : String(e)}`;
      await d.nack({ reason: truncate(reason) }).catch((err) => this.report(err));
      return ["failed", reason];
    }
    try {
      await handler.afterHandle?.(obj, ctx);
    } catch (e) {
      this.report(e);
    }
    d.ack();
    return ["handled", undefined];
  }
}
