// A consumer: SUBSCRIBE with a credit window, deliveries buffered up to that window (the broker
// never sends more than the credit), CREDIT returned as messages are settled, acks coalesced
// into ranges and sent once per tick.
//
// Invariants: `queue.length + unsettled <= window` for the current generation (the broker sends
// at most the credit; credit comes back only for settled messages); credit returns at most once
// per delivery; a message from an older connection generation is never acked on the new one.

import type { DeliveryRecord, RangeInput, StartInput, SubscribeRequest } from "./codec.js";
import type { Client } from "./client.js";
import { ConnectionError, FerryMQError } from "./errors.js";
import { Message, type NackOptions, type Settler } from "./message.js";

export interface SubscribeOptions {
  /** Named (shared) subscription; empty or absent makes an ephemeral one. */
  subscription?: string;
  /** Where a new subscription starts: "latest" (default), "earliest", or an offset/time. */
  start?: "latest" | "earliest" | StartInput;
  /** Messages delivered and not yet settled at most (the credit window); 1000 by default. */
  window?: number;
  ackTimeoutMs?: number;
  maxAttempts?: number;
  /** At-most-once: a message counts as acked when sent. */
  autoAck?: boolean;
  /** At most one message per key in flight (needs acks). */
  ordered?: boolean;
  /** Partitions this consumer takes: `"1,2,4-7"` or ranges; all when absent. */
  partitions?: string | { first: number; last: number }[];
  deadLetterTopic?: string;
  /**
   * Callback form: called for each message in order, one at a time. A handler that returns
   * without settling acks the message; one that throws nacks it with the error as the reason.
   */
  handler?: (message: Message) => unknown;
}

/** Parses `"1,2,4-7"` into inclusive partition ranges. */
export function parsePartitionList(text: string): { first: number; last: number }[] {
  const out: { first: number; last: number }[] = [];
  for (const raw of text.split(",")) {
    const part = raw.trim();
    if (part === "") continue;
    const m = /^(\d+)\s*(?:-\s*(\d+))?$/.exec(part);
    const first = m ? Number(m[1]) : NaN;
    const last = m ? Number(m[2] ?? m[1]) : NaN;
    if (!m || !(first <= last) || last > 0xffffffff) {
      throw new FerryMQError("invalid_argument", `partition list "${text}": "${part}" is not N or N-M with N <= M`);
    }
    out.push({ first, last });
  }
  return out;
}

const DEFAULT_WINDOW = 1000;
/** How long acks and credit below a quarter window gather before they are sent. */
const ACK_FLUSH_DELAY_MS = 2;

interface Waiter {
  resolve: (m: IteratorResult<Message>) => void;
  reject: (e: unknown) => void;
}

export class Subscription implements AsyncIterable<Message>, Settler {
  readonly topic: string;
  /** The subscription joined (the server's name for an ephemeral one). */
  name = "";
  /** The topic's partition count. */
  partitions = 0;
  /** @internal */
  consumerId = 0;
  /** @internal */
  generation = 0;
  readonly window: number;
  private readonly client: Client;
  private readonly request: SubscribeRequest;
  private readonly handler: ((m: Message) => unknown) | undefined;
  private queue: Message[] = [];
  private head = 0;
  private waiters: Waiter[] = [];
  private closed = false;
  private closeError: unknown = null;
  private creditOwed = 0;
  /** Ranges to ack; `next` is the offset that extends a range, as a number (NaN past 2^53). */
  private acks: { partition: number; offset: bigint; count: number; next: number }[] = [];
  private flushScheduled = false;
  private handling: Promise<void> | null = null;
  private readonly creditBatch: number;
  /** Resolved when a message is queued or the subscription ends (see `waitBuffered`). */
  private bufferWaiters: (() => void)[] = [];
  /** Set by `closeReleasing`: no credit is granted any more. */
  private draining = false;

  /** @internal use `client.subscribe`. */
  constructor(client: Client, topic: string, options: SubscribeOptions) {
    this.client = client;
    this.topic = topic;
    this.window = options.window ?? DEFAULT_WINDOW;
    this.creditBatch = Math.max(1, Math.floor(this.window / 4));
    if (!Number.isInteger(this.window) || this.window < 1 || this.window > 1_000_000) {
      throw new FerryMQError("invalid_argument", `window ${this.window} is not within 1..=1000000`);
    }
    const start: StartInput =
      options.start === undefined
        ? { kind: "latest" }
        : typeof options.start === "string"
          ? ({ kind: options.start } as StartInput)
          : options.start;
    const partitions =
      options.partitions === undefined
        ? []
        : typeof options.partitions === "string"
          ? parsePartitionList(options.partitions)
          : options.partitions;
    this.request = {
      topic,
      subscription: options.subscription ?? "",
      start: start as SubscribeRequest["start"],
      ackTimeoutMs: options.ackTimeoutMs ?? 0,
      maxAttempts: options.maxAttempts ?? 0,
      credit: this.window,
      autoAck: options.autoAck ?? false,
      ordered: options.ordered ?? false,
      partitions,
      deadLetterTopic: options.deadLetterTopic ?? "",
    };
    this.handler = options.handler;
  }

  /** @internal the SUBSCRIBE frame, sent again with the full window after a reconnect. */
  subscribeFrame(): { type: "SUBSCRIBE" } & SubscribeRequest {
    return { type: "SUBSCRIBE", ...this.request, credit: this.window };
  }

  /** @internal the broker answered SUBSCRIBED on connection `generation`. */
  attached(consumerId: number, name: string, partitions: number, generation: number): void {
    this.consumerId = consumerId;
    this.name = name;
    this.partitions = partitions;
    // Messages of the lost connection were given back by the broker and come again; holding
    // them would hand out duplicates whose acks could not reach the broker anyway.
    if (generation !== this.generation) {
      this.queue = [];
      this.head = 0;
      this.acks = [];
      this.creditOwed = 0;
    }
    this.generation = generation;
    if (this.handler && this.handling === null) this.handling = this.runHandler();
  }

  /** @internal makes the Message a delivery is decoded into. */
  readonly makeMessage = (view: DataView, at: number): Message => new Message(view, at, this, this.generation);

  /** @internal deliveries pushed by the broker, decoded into Messages by `makeMessage`. */
  deliver(records: DeliveryRecord[]): void {
    if (this.closed) return;
    const autoAck = this.request.autoAck;
    for (const d of records) {
      const m = d as Message;
      if (this.waiters.length > 0) {
        if (autoAck) this.markTaken(m);
        this.waiters.shift()!.resolve({ value: m, done: false });
      } else {
        this.queue.push(m);
      }
    }
    if (this.bufferWaiters.length > 0 && this.head < this.queue.length) {
      for (const w of this.bufferWaiters.splice(0)) w();
    }
  }

  /**
   * Waits, without taking anything, until a message is buffered or `wake` is called: resolves
   * false once the subscription has ended with nothing left (rejects with its error if it ended
   * with one), else true (check `buffered`: a wake may come with none).
   */
  async waitBuffered(): Promise<boolean> {
    if (this.head >= this.queue.length && !this.closed) {
      await new Promise<void>((resolve) => this.bufferWaiters.push(resolve));
    }
    if (this.head < this.queue.length) return true;
    if (this.closed) {
      if (this.closeError !== null) throw this.closeError;
      return false;
    }
    return true;
  }

  /** Ends every `waitBuffered` in progress (a consumer that stops). */
  wake(): void {
    for (const w of this.bufferWaiters.splice(0)) w();
  }

  /** The next buffered message, or null when none is buffered. */
  takeNowait(): Message | null {
    if (this.head >= this.queue.length) return null;
    const m = this.queue[this.head++]!;
    if (this.request.autoAck) this.markTaken(m);
    return m;
  }

  /** The next message, waiting for one; `null` once the subscription is closed. */
  async next(): Promise<Message | null> {
    const r = await this.nextResult();
    return r.done ? null : r.value;
  }

  private nextResult(): Promise<IteratorResult<Message>> {
    if (this.head < this.queue.length) {
      const m = this.queue[this.head++]!;
      if (this.head > 1024 && this.head * 2 > this.queue.length) {
        this.queue = this.queue.slice(this.head);
        this.head = 0;
      }
      if (this.request.autoAck) this.markTaken(m);
      return Promise.resolve({ value: m, done: false });
    }
    if (this.closed) {
      if (this.closeError !== null) return Promise.reject(this.closeError);
      return Promise.resolve({ value: undefined, done: true });
    }
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  /** Messages buffered here, delivered and not yet taken. */
  get buffered(): number {
    return this.queue.length - this.head;
  }

  [Symbol.asyncIterator](): AsyncIterator<Message> {
    return {
      next: () => this.nextResult(),
      return: async () => {
        await this.close();
        return { value: undefined, done: true };
      },
    };
  }

  private async runHandler(): Promise<void> {
    const handler = this.handler!;
    for (;;) {
      let m: Message | null;
      try {
        m = await this.next();
      } catch {
        return;
      }
      if (m === null) return;
      try {
        await handler(m);
        if (!m.isSettled && !this.request.autoAck) m.ack();
      } catch (e) {
        if (!m.isSettled && !this.request.autoAck) {
          const reason = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
          await m.nack({ reason: truncateUtf8(reason, 1024) }).catch((err) => this.client.reportError(err));
        }
        this.client.reportError(e);
      }
    }
  }

  // --- settling -------------------------------------------------------------------------

  private markTaken(m: Message): void {
    // An auto-ack subscription's credit comes back once the application has the message.
    if (m.generation === this.generation) this.returnCredit(1);
  }

  private returnCredit(n: number): void {
    this.creditOwed += n;
    // A consumer working through a full buffer never yields to the event loop, so a flush left
    // for the next tick would wait until the buffer is empty and the broker has stopped
    // sending: a quarter of the window goes back at once instead.
    if (this.creditOwed >= this.creditBatch) this.flush(true);
    else this.scheduleFlush();
  }

  ack(m: Message): void {
    if (this.request.autoAck) throw new FerryMQError("invalid_argument", "an auto-ack subscription's messages are acked when sent");
    // A message settled after its subscription closed went back to the broker with it.
    if (m.generation !== this.generation || this.closed) return;
    const last = this.acks.length > 0 ? this.acks[this.acks.length - 1]! : null;
    const offset = m.offsetNumber;
    if (last !== null && last.partition === m.partition && last.next === offset && last.count < 0xffffffff) {
      last.count++;
      last.next = offset + 1;
    } else if (last !== null && Number.isNaN(offset) && last.partition === m.partition && last.offset + BigInt(last.count) === m.offset && last.count < 0xffffffff) {
      last.count++;
    } else {
      this.acks.push({ partition: m.partition, offset: m.offset, count: 1, next: offset + 1 });
    }
    this.returnCredit(1);
  }

  async ackWithResult(m: Message, result: Uint8Array): Promise<void> {
    if (this.request.autoAck) throw new FerryMQError("invalid_argument", "an auto-ack subscription's messages are acked when sent");
    if (m.generation !== this.generation || this.closed) return;
    const ranges: RangeInput[] = [{ partition: m.partition, offset: m.offset, count: 1 }];
    try {
      await this.client.request({ type: "ACK_RESULT", consumerId: this.consumerId, result, ranges }, "OK");
    } finally {
      this.returnCredit(1);
    }
  }

  async nack(m: Message, options: NackOptions): Promise<void> {
    if (this.request.autoAck) throw new FerryMQError("invalid_argument", "an auto-ack subscription's messages are acked when sent");
    if (m.generation !== this.generation || this.closed) return;
    try {
      await this.client.request(
        {
          type: "NACK",
          consumerId: this.consumerId,
          delayMs: options.delayMs ?? 0,
          deadLetter: options.deadLetter ?? false,
          release: options.release ?? false,
          reason: options.reason ?? "",
          ranges: [{ partition: m.partition, offset: m.offset, count: 1 }],
        },
        "OK",
      );
    } finally {
      this.returnCredit(1);
    }
  }

  private scheduleFlush(): void {
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    // Each write of acks and credit costs a system call that also runs the loopback's receive
    // path; gathering them for a couple of milliseconds makes one write of many. Credit that
    // matters for throughput (a quarter window) does not wait: see returnCredit.
    setTimeout(() => this.flush(), ACK_FLUSH_DELAY_MS);
  }

  /** Sends the acks and credit gathered (request id 0: no confirmation); `now` skips the tick's batching. */
  flush(now = false): void {
    if (!now) this.flushScheduled = false;
    if (!this.client.isConnected() || this.consumerId === 0) return;
    const ranges = this.acks;
    this.acks = [];
    for (let i = 0; i < ranges.length; i += 65_536) {
      const chunk = ranges.slice(i, i + 65_536).map(({ partition, offset, count }) => ({ partition, offset, count }));
      this.client.send({ type: "ACK", consumerId: this.consumerId, ranges: chunk });
    }
    if (this.creditOwed > 0 && !this.closed && !this.draining) {
      this.client.send({ type: "CREDIT", consumerId: this.consumerId, credit: this.creditOwed });
      this.creditOwed = 0;
    }
    if (now) this.client.flushWrites();
  }

  // --- closing --------------------------------------------------------------------------

  /**
   * Leaves the subscription: acks gathered so far are sent, unsettled messages go back (the
   * broker counts their delivery as an attempt). Buffered messages are dropped here: nothing
   * handles them after `close`.
   */
  async close(): Promise<void> {
    if (this.closed) return;
    this.flush();
    this.queue = [];
    this.head = 0;
    this.finish(null);
    this.client.forget(this);
    if (this.client.isConnected()) {
      await this.client.request({ type: "UNSUBSCRIBE", consumerId: this.consumerId }, "OK").catch((e) => {
        if (!(e instanceof ConnectionError)) throw e;
      });
    }
  }

  /**
   * Leaves the subscription like `close`, first giving back `unprocessed` and every buffered
   * message not yet taken with NACK's `release` flag: their delivery is not counted as an
   * attempt, so stopping costs them nothing. No credit is granted once this is called.
   * `delayMs` keeps them from being ready again before the unsubscribe is through (else the
   * broker may deliver them again to this consumer, and the unsubscribe would give them back
   * counted). Resolves to how many were released. (A delivery still on its way when the
   * broker unsubscribes goes back counted, as after any unsubscribe.)
   */
  async closeReleasing(unprocessed: readonly Message[] = [], options: { delayMs?: number } = {}): Promise<number> {
    if (this.closed) return 0;
    this.draining = true;
    const messages: Message[] = [];
    for (const m of unprocessed) {
      if (!m.isSettled) {
        m.markSettled();
        messages.push(m);
      }
    }
    for (let i = this.head; i < this.queue.length; i++) messages.push(this.queue[i]!);
    this.queue = [];
    this.head = 0;
    const live = this.request.autoAck ? [] : messages.filter((m) => m.generation === this.generation);
    this.flush();
    let released = 0;
    if (live.length > 0 && this.client.isConnected()) {
      live.sort((a, b) => a.partition - b.partition || (a.offset < b.offset ? -1 : a.offset > b.offset ? 1 : 0));
      const ranges: RangeInput[] = [];
      let last: { partition: number; offset: bigint; count: number } | null = null;
      for (const m of live) {
        if (last !== null && last.partition === m.partition && last.offset + BigInt(last.count) === m.offset && last.count < 0xffffffff) {
          last.count++;
        } else {
          last = { partition: m.partition, offset: m.offset, count: 1 };
          ranges.push(last);
        }
      }
      try {
        for (let i = 0; i < ranges.length; i += 65_536) {
          await this.client.request(
            {
              type: "NACK",
              consumerId: this.consumerId,
              delayMs: options.delayMs ?? 0,
              deadLetter: false,
              release: true,
              reason: "",
              ranges: ranges.slice(i, i + 65_536),
            },
            "OK",
          );
        }
        released = live.length;
      } catch (e) {
        // A lost connection gave them back already.
        if (!(e instanceof ConnectionError)) throw e;
      }
    }
    await this.close();
    return released;
  }

  /** @internal ends iteration: cleanly (`error` null) or with the error. */
  finish(error: unknown): void {
    if (this.closed) return;
    this.closed = true;
    this.closeError = error;
    for (const w of this.bufferWaiters.splice(0)) w();
    for (const w of this.waiters.splice(0)) {
      if (error === null) w.resolve({ value: undefined, done: true });
      else w.reject(error);
    }
  }

  /** Resolves when the callback form's handler has stopped (after `close`). */
  async done(): Promise<void> {
    await this.handling;
  }
}

function truncateUtf8(text: string, maxBytes: number): string {
  const bytes = new TextEncoder().encode(text);
  if (bytes.length <= maxBytes) return text;
  return new TextDecoder().decode(bytes.subarray(0, maxBytes)).replace(/\uFFFD$/, "");
}
