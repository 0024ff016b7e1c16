// A consumer: SUBSCRIBE with a credit window, deliveries buffered up to that window (the broker
// never sends more than the credit), CREDIT returned as messages are settled, acks coalesced
// into ranges and sent once per tick.
//
// A subscription is attached on one connection, or in a cluster on every node (each node's
// consumer is an Attachment): only a partition's leader delivers its messages and takes their
// acks, so each message is settled through the attachment that delivered it.
//
// Invariants: `queued + unsettled <= window` for each attachment (the broker sends at most the
// credit; credit comes back only for settled messages); credit returns at most once per
// delivery; a message of an attachment that is gone (a lost connection) is never acked on
// another: its acks are moot, the broker gives it back.

import type { DeliveryRecord, RangeInput, StartInput, SubscribeRequest } from "./codec.js";
import type { Client } from "./client.js";
import { ConnectionError, FerryMQError, ServerError } from "./errors.js";
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

/** Generations of attachments, unique in the process: a message names the one it came on. */
let attachments = 0;

interface AckRun {
  partition: number;
  offset: bigint;
  count: number;
  /** The offset that extends the run, as a number (NaN past 2^53). */
  next: number;
}

/** @internal one connection's consumer of a subscription. */
export class Attachment {
  readonly generation = ++attachments;
  acks: AckRun[] = [];
  creditOwed = 0;

  constructor(
    readonly sub: Subscription,
    readonly client: Client,
    readonly slot: number,
    readonly consumerId: number,
  ) {}

  /** Makes the Message a delivery is decoded into. */
  readonly makeMessage = (view: DataView, at: number): Message => new Message(view, at, this.sub, this.generation);
}

/** Backoff between attempts to attach to a cluster node again, doubling from first to last. */
const REATTACH_FIRST_MS = 50;
const REATTACH_MAX_MS = 1000;

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
  readonly window: number;
  private readonly client: Client;
  private readonly request: SubscribeRequest;
  private readonly handler: ((m: Message) => unknown) | undefined;
  private queue: Message[] = [];
  private head = 0;
  private waiters: Waiter[] = [];
  private closed = false;
  private closeError: unknown = null;
  /** The attachment of each slot (one per cluster node; one alone otherwise), null while none. */
  private slots: (Attachment | null)[] = [null];
  /** Live attachments by generation. */
  private live = new Map<number, Attachment>();
  /** The connections of a cluster subscription's nodes, its own. */
  private nodeClients = new Set<Client>();
  private flushScheduled = false;
  private handling: Promise<void> | null = null;
  private readonly creditBatch: number;
  /** Resolved when a message is queued or the subscription ends (see `waitBuffered`). */
  private bufferWaiters: (() => void)[] = [];
  /** Set by `closeReleasing`: no credit is granted any more. */
  private draining = false;
  /** @internal attached on every node of a cluster, each through a connection of its own. */
  clustered = false;
  /** Ends the waits between attempts to attach again, once the subscription closes. */
  private sleepers = new Set<() => void>();

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

  /** @internal the consumer id of the first attachment (0 while none). */
  get consumerId(): number {
    return this.slots[0]?.consumerId ?? 0;
  }

  /** @internal the broker answered SUBSCRIBED on the subscription's connection. */
  attached(consumerId: number, name: string, partitions: number): Attachment {
    return this.attachedOn(0, this.client, consumerId, name, partitions);
  }

  /** @internal the broker answered SUBSCRIBED on `client`, the connection of `slot`. */
  attachedOn(slot: number, client: Client, consumerId: number, name: string, partitions: number): Attachment {
    const old = this.slots[slot];
    if (old) this.retire(old);
    const a = new Attachment(this, client, slot, consumerId);
    this.slots[slot] = a;
    this.live.set(a.generation, a);
    this.name = name;
    this.partitions = partitions;
    if (this.handler && this.handling === null) this.handling = this.runHandler();
    return a;
  }

  /**
   * @internal the connection of `a` is gone: the broker gave back what it delivered, and
   * delivers it again; holding it would hand out duplicates whose acks could not reach it.
   */
  retire(a: Attachment): void {
    if (this.slots[a.slot] === a) this.slots[a.slot] = null;
    if (!this.live.delete(a.generation)) return;
    const rest = this.queue.slice(this.head).filter((m) => m.generation !== a.generation);
    this.queue = rest;
    this.head = 0;
  }

  /**
   * @internal attaches on every node of a cluster, through a connection of its own to each
   * (`connectNode`): each node delivers the partitions it leads. Resolves once every node that
   * could be reached took the subscription; a node that could not, or whose connection breaks
   * later, is attached again with backoff (50 ms doubling to 1 s) until the subscription
   * closes. A refusal (an unknown topic, a missing grant) rejects, as does no node at all.
   */
  async attachNodes(addrs: string[], connectNode: (addr: string) => Promise<Client>): Promise<void> {
    this.clustered = true;
    this.slots = addrs.map(() => null);
    const firsts = await Promise.allSettled(addrs.map((addr, slot) => this.attachNode(slot, addr, connectNode)));
    let refusal: unknown = null;
    const failures: string[] = [];
    firsts.forEach((r, i) => {
      if (r.status === "fulfilled") return;
      if (!(r.reason instanceof ConnectionError)) refusal ??= r.reason;
      failures.push(`${addrs[i]}: ${r.reason instanceof Error ? r.reason.message : String(r.reason)}`);
    });
    if (refusal !== null || failures.length === addrs.length) {
      await this.close();
      throw refusal ?? new ConnectionError("connect_failed", `no node of the cluster took the subscription (${failures.join("; ")})`);
    }
    firsts.forEach((r, slot) => {
      void this.keepAttached(slot, addrs[slot]!, connectNode, r.status === "fulfilled" ? r.value : null);
    });
  }

  /** Connects to the node at `addr` and attaches there as `slot`. */
  private async attachNode(slot: number, addr: string, connectNode: (addr: string) => Promise<Client>): Promise<Client> {
    const client = await connectNode(addr);
    if (this.closed) {
      await client.close();
      throw new ConnectionError("closed", "the subscription was closed");
    }
    this.nodeClients.add(client);
    try {
      await client.attachOn(this, slot);
    } catch (e) {
      this.nodeClients.delete(client);
      await client.close();
      throw e;
    }
    return client;
  }

  /** Attaches `slot` again whenever its connection ends, until the subscription closes. */
  private async keepAttached(slot: number, addr: string, connectNode: (addr: string) => Promise<Client>, client: Client | null): Promise<void> {
    let delay = REATTACH_FIRST_MS;
    for (;;) {
      if (client !== null) {
        await client.ended;
        this.nodeClients.delete(client);
        client = null;
        delay = REATTACH_FIRST_MS;
      } else {
        await this.sleep(delay * (0.5 + Math.random() / 2));
        delay = Math.min(REATTACH_MAX_MS, delay * 2);
      }
      if (this.closed) return;
      try {
        client = await this.attachNode(slot, addr, connectNode);
      } catch (e) {
        if (this.closed) return;
        // A refusal (the topic deleted, a grant revoked) is heard; a node down is waited for.
        if (!(e instanceof ConnectionError)) this.client.reportError(e);
      }
    }
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const wake = () => {
        clearTimeout(timer);
        this.sleepers.delete(wake);
        resolve();
      };
      const timer = setTimeout(wake, ms);
      this.sleepers.add(wake);
    });
  }

  /** @internal the client closed: the subscription ends, and its nodes' connections close. */
  async abandon(error: unknown): Promise<void> {
    this.finish(error);
    const clients = [...this.nodeClients];
    this.nodeClients.clear();
    await Promise.all(clients.map((c) => c.close()));
  }

  /** @internal makes the Message a delivery of the first attachment is decoded into. */
  get makeMessage(): (view: DataView, at: number) => Message {
    const a = this.slots[0];
    if (!a) throw new FerryMQError("internal", "the subscription is not attached");
    return a.makeMessage;
  }

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
    const a = this.live.get(m.generation);
    if (a !== undefined) this.returnCredit(a, 1);
  }

  private returnCredit(a: Attachment, n: number): void {
    a.creditOwed += n;
    // A consumer working through a full buffer never yields to the event loop, so a flush left
    // for the next tick would wait until the buffer is empty and the broker has stopped
    // sending: a quarter of the window goes back at once instead.
    if (a.creditOwed >= this.creditBatch) this.flush(true);
    else this.scheduleFlush();
  }

  /** The live attachment that delivered `m`, or null when its acks are moot. */
  private owner(m: Message): Attachment | null {
    if (this.request.autoAck) throw new FerryMQError("invalid_argument", "an auto-ack subscription's messages are acked when sent");
    // A message settled after its subscription closed, or after its connection was lost, went
    // back to the broker with it.
    if (this.closed) return null;
    return this.live.get(m.generation) ?? null;
  }

  ack(m: Message): void {
    const a = this.owner(m);
    if (a === null) return;
    const acks = a.acks;
    const last = acks.length > 0 ? acks[acks.length - 1]! : null;
    const offset = m.offsetNumber;
    if (last !== null && last.partition === m.partition && last.next === offset && last.count < 0xffffffff) {
      last.count++;
      last.next = offset + 1;
    } else if (last !== null && Number.isNaN(offset) && last.partition === m.partition && last.offset + BigInt(last.count) === m.offset && last.count < 0xffffffff) {
      last.count++;
    } else {
      acks.push({ partition: m.partition, offset: m.offset, count: 1, next: offset + 1 });
    }
    this.returnCredit(a, 1);
  }

  async ackConfirmed(m: Message): Promise<void> {
    const a = this.owner(m);
    if (a === null) throw this.moot(m);
    const ranges: RangeInput[] = [{ partition: m.partition, offset: m.offset, count: 1 }];
    try {
      await a.client.request({ type: "ACK", consumerId: a.consumerId, ranges }, "OK");
    } finally {
      this.returnCredit(a, 1);
    }
  }

  /** Why a confirmed settlement cannot be made: the message went back to the broker. */
  private moot(m: Message): FerryMQError {
    return this.closed
      ? new ConnectionError("closed", `message ${m.id} went back to the broker when its subscription closed`)
      : new ConnectionError("connection_lost", `message ${m.id} went back to the broker when the connection that delivered it was lost`);
  }

  async ackWithResult(m: Message, result: Uint8Array): Promise<void> {
    const a = this.owner(m);
    if (a === null) return;
    const ranges: RangeInput[] = [{ partition: m.partition, offset: m.offset, count: 1 }];
    try {
      await a.client.request({ type: "ACK_RESULT", consumerId: a.consumerId, result, ranges }, "OK");
    } finally {
      this.returnCredit(a, 1);
    }
  }

  async nack(m: Message, options: NackOptions): Promise<void> {
    const a = this.owner(m);
    if (a === null) return;
    try {
      await a.client.request(
        {
          type: "NACK",
          consumerId: a.consumerId,
          delayMs: options.delayMs ?? 0,
          deadLetter: options.deadLetter ?? false,
          release: options.release ?? false,
          reason: options.reason ?? "",
          ranges: [{ partition: m.partition, offset: m.offset, count: 1 }],
        },
        "OK",
      );
    } finally {
      this.returnCredit(a, 1);
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
    for (const a of this.live.values()) {
      const client = a.client;
      if (!client.isConnected()) continue;
      const ranges = a.acks;
      a.acks = [];
      for (let i = 0; i < ranges.length; i += 65_536) {
        const chunk = ranges.slice(i, i + 65_536).map(({ partition, offset, count }) => ({ partition, offset, count }));
        client.send({ type: "ACK", consumerId: a.consumerId, ranges: chunk });
      }
      if (a.creditOwed > 0 && !this.closed && !this.draining) {
        client.send({ type: "CREDIT", consumerId: a.consumerId, credit: a.creditOwed });
        a.creditOwed = 0;
      }
      if (now) client.flushWrites();
    }
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
    const attached = [...this.live.values()];
    this.finish(null);
    this.client.forget(this);
    const unsubscribes = attached.map(async (a) => {
      a.client.forget(this, a);
      if (a.client.isConnected()) {
        await a.client.request({ type: "UNSUBSCRIBE", consumerId: a.consumerId }, "OK").catch((e) => {
          if (!(e instanceof ConnectionError)) throw e;
        });
      }
    });
    try {
      await Promise.all(unsubscribes);
    } finally {
      await Promise.all([...this.nodeClients].map((c) => c.close()));
      this.nodeClients.clear();
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
    // Each attachment gives back what it delivered.
    const byAttachment = new Map<Attachment, Message[]>();
    if (!this.request.autoAck) {
      for (const m of messages) {
        const a = this.live.get(m.generation);
        if (a === undefined) continue;
        const list = byAttachment.get(a);
        if (list) list.push(m);
        else byAttachment.set(a, [m]);
      }
    }
    this.flush();
    let released = 0;
    const releases = [...byAttachment].map(async ([a, live]) => {
      if (!a.client.isConnected()) return;
      live.sort((x, y) => x.partition - y.partition || (x.offset < y.offset ? -1 : x.offset > y.offset ? 1 : 0));
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
          await a.client.request(
            {
              type: "NACK",
              consumerId: a.consumerId,
              delayMs: options.delayMs ?? 0,
              deadLetter: false,
              release: true,
              reason: "",
              ranges: ranges.slice(i, i + 65_536),
            },
            "OK",
          );
        }
        released += live.length;
      } catch (e) {
        // A lost connection gave them back already; a node that no longer leads the partition
        // gives them back as it stops serving it.
        if (!(e instanceof ConnectionError) && !(e instanceof ServerError && e.code === "not_leader")) throw e;
      }
    });
    try {
      await Promise.all(releases);
    } finally {
      await this.close();
    }
    return released;
  }

  /** @internal ends iteration: cleanly (`error` null) or with the error. */
  finish(error: unknown): void {
    if (this.closed) return;
    this.closed = true;
    this.closeError = error;
    for (const wake of [...this.sleepers]) wake();
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
