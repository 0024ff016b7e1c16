import type { DeliveryRecord, MessageInput, MessageRecord } from "./codec.js";
import { FerryMQError } from "./errors.js";

const textEncoder = new TextEncoder();
const textDecoder = new TextDecoder();

/** A body or key as callers give it: bytes, or a string sent as UTF-8. */
export type BytesLike = Uint8Array | string;

/** One message to publish. */
export interface OutgoingMessage {
  body: BytesLike;
  /** Picks the partition when the broker chooses (see the protocol's publishing rules). */
  key?: BytesLike | null;
  /** Header pairs in order (names may repeat), or an object. */
  headers?: [string, string][] | Record<string, string>;
  /** 0..=9, higher delivered first; 0 by default. */
  priority?: number;
  /** Not delivered before this many milliseconds (at most 30 days). */
  deliverAfterMs?: number | null;
  /**
   * A deduplication id (1 to 256 bytes): within the topic's window a retry with the same id is
   * not stored again, and its receipt carries the first message's id. Sent as the reserved
   * header `x-ferrymq-dedup-id`.
   */
  dedupId?: string;
}

/** The record header of a message's deduplication id (the broker's reserved name). */
export const DEDUP_ID_HEADER = "x-ferrymq-dedup-id";

export function toBytes(value: BytesLike): Uint8Array {
  return typeof value === "string" ? textEncoder.encode(value) : value;
}

/** The record form of anything `publish` accepts. */
export function toMessageInput(m: OutgoingMessage | BytesLike): MessageInput {
  if (m instanceof Uint8Array) return { body: m };
  if (typeof m === "string") return { body: textEncoder.encode(m) };
  if (m === null || typeof m !== "object" || m.body === undefined) {
    throw new FerryMQError("invalid_argument", "a message is a Uint8Array, a string, or an object with a body");
  }
  let headers = m.headers === undefined ? [] : Array.isArray(m.headers) ? m.headers : Object.entries(m.headers);
  if (m.dedupId !== undefined) headers = [...headers, [DEDUP_ID_HEADER, m.dedupId]];
  return {
    body: toBytes(m.body),
    key: m.key == null ? null : toBytes(m.key),
    headers,
    priority: m.priority ?? 0,
    deliverAfterMs: m.deliverAfterMs ?? null,
  };
}

/** What a consumer does with a message: implemented by the subscription that received it. */
export interface Settler {
  ack(message: Message): void;
  ackConfirmed(message: Message): Promise<void>;
  ackWithResult(message: Message, result: Uint8Array): Promise<void>;
  nack(message: Message, options: NackOptions): Promise<void>;
}

export interface NackOptions {
  /** Ready again after this delay; 0 (the default) is at once. */
  delayMs?: number;
  /** Move it to the dead-letter topic now instead of delivering it again. */
  deadLetter?: boolean;
  /** Give it back unprocessed (a consumer that stops early): ready again, not counted as an attempt. */
  release?: boolean;
  /** Why; carried in the dead letter's `x-ferrymq-dead-reason` header (at most 1024 bytes). */
  reason?: string;
}

const EMPTY = new Uint8Array(0);
const NO_HEADERS: [string, string][] = Object.freeze([]) as unknown as [string, string][];

/** A delivered message. Settle it once with `ack`, `ackWithResult` or `nack`. */
export class Message implements MessageRecord, DeliveryRecord {
  readonly partition: number;
  /** 1 for the first delivery, +1 for each redelivery. */
  readonly attempt: number;
  /**
   * @internal the offset as a number when below 2^53 (every offset in practice), else NaN.
   * 64-bit values stay numbers until asked for as bigints: two bigints per message were a
   * measurable share of a consumer's allocations.
   */
  readonly offsetNumber: number;
  private offsetBig: bigint | undefined;
  private readonly timestampLow: number;
  private readonly timestampHigh: number;
  // Filled in by the codec as it reads the record (readRecordInto).
  key: Uint8Array | null = null;
  headers: [string, string][] = NO_HEADERS;
  priority = 0;
  deliverAfterMs: number | null = null;
  body: Uint8Array = EMPTY;
  /** @internal the connection generation it came on; acks of older ones are moot. */
  readonly generation: number;
  private readonly settler: Settler;
  private settled = false;

  /** @internal built by the subscription from the delivery prefix at `at` of `view`. */
  constructor(view: DataView, at: number, settler: Settler, generation: number) {
    this.partition = view.getUint32(at, true);
    const low = view.getUint32(at + 4, true);
    const high = view.getUint32(at + 8, true);
    if (high < 0x200000) {
      this.offsetNumber = high * 0x100000000 + low;
      this.offsetBig = undefined;
    } else {
      this.offsetNumber = NaN;
      this.offsetBig = (BigInt(high) << 32n) | BigInt(low);
    }
    this.timestampLow = view.getUint32(at + 12, true);
    this.timestampHigh = view.getUint32(at + 16, true);
    this.attempt = view.getUint16(at + 20, true);
    this.settler = settler;
    this.generation = generation;
  }

  get offset(): bigint {
    if (this.offsetBig === undefined) this.offsetBig = BigInt(this.offsetNumber);
    return this.offsetBig;
  }

  /** Publish time assigned by the broker, ms since the Unix epoch. */
  get timestampMs(): bigint {
    return (BigInt(this.timestampHigh) << 32n) | BigInt(this.timestampLow);
  }

  /** The record the codec fills in: the message itself. */
  get message(): MessageRecord {
    return this;
  }

  /** `<partition>-<offset>`, the id a publish receipt gave. */
  get id(): string {
    return `${this.partition}-${Number.isNaN(this.offsetNumber) ? this.offset : this.offsetNumber}`;
  }

  get publishedAt(): Date {
    return new Date(this.timestampHigh * 0x100000000 + this.timestampLow);
  }

  get isSettled(): boolean {
    return this.settled;
  }

  /** The first header of that name, or undefined. */
  header(name: string): string | undefined {
    for (const [n, v] of this.headers) if (n === name) return v;
    return undefined;
  }

  /** The body as UTF-8 text. */
  text(): string {
    return textDecoder.decode(this.body);
  }

  /** The body parsed as JSON. */
  json<T = unknown>(): T {
    return JSON.parse(this.text()) as T;
  }

  /** The key as UTF-8 text, or null. */
  keyText(): string | null {
    return this.key === null ? null : textDecoder.decode(this.key);
  }

  /** @internal settled by the subscription itself (released as it closes). */
  markSettled(): void {
    this.settled = true;
  }

  private settle(): void {
    if (this.settled) throw new FerryMQError("already_settled", `message ${this.id} was already acked or nacked`);
    this.settled = true;
  }

  /** Acks it. Acks are sent in ranges, batched, without waiting for a confirmation. */
  ack(): void {
    this.settle();
    this.settler.ack(this);
  }

  /**
   * Acks it and waits for the broker's confirmation. In a cluster the ack is confirmed once
   * the partition's group committed it: after a failover the next leader does not deliver the
   * message again. Rejects with a ConnectionError when the connection that delivered it is gone
   * (the broker gives the message back), or with `not_leader` when its node stopped serving
   * the partition before the ack was committed (its outcome is unknown).
   */
  ackConfirmed(): Promise<void> {
    this.settle();
    return this.settler.ackConfirmed(this);
  }

  /** Acks it with a result (at most 4096 bytes) kept by the broker for status queries; confirmed. */
  ackWithResult(result: BytesLike | object): Promise<void> {
    this.settle();
    const bytes =
      result instanceof Uint8Array || typeof result === "string" ? toBytes(result) : textEncoder.encode(JSON.stringify(result));
    return this.settler.ackWithResult(this, bytes);
  }

  /** Gives it back: now, after `delayMs`, or to the dead-letter topic; confirmed. */
  nack(options: NackOptions = {}): Promise<void> {
    this.settle();
    return this.settler.nack(this, options);
  }
}
