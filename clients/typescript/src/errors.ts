import { CLOSING_ERROR_CODES, ErrorCode, errorCodeName, type ErrorCodeName } from "./codec.js";
import { FerryMQError } from "./base-error.js";

export { FerryMQError };

/** The broker refused a request: `code` is the protocol's error name (`unknown_topic`...). */
export class ServerError extends FerryMQError {
  /** The numeric code of the ERROR frame; unknown codes keep their number, named `unknown`. */
  readonly codeNumber: number;
  /** Whether the broker closes the connection after this error. */
  readonly closesConnection: boolean;

  constructor(codeNumber: number, message: string) {
    const name: ErrorCodeName | "unknown" = errorCodeName(codeNumber);
    super(name, `${name} (${codeNumber}): ${message}`);
    this.name = "ServerError";
    this.codeNumber = codeNumber;
    this.closesConnection = CLOSING_ERROR_CODES.has(codeNumber);
  }
}

/**
 * The broker refused a request the user is not allowed (`forbidden`): the user sees the topic
 * but lacks the action on it, or the request needs a role (admin, monitor) it lacks.
 */
export class ForbiddenError extends ServerError {
  constructor(message: string) {
    super(ErrorCode.forbidden, message);
    this.name = "ForbiddenError";
  }
}

// The broker's not_leader messages: "node 1 does not lead partition 0 of 'orders': node 2 at
// 10.0.0.2:7070 does", "...: node 2 does" (address unknown), and "partition 0 of 'orders' has no
// leader at the moment (an election is under way); retry".
const NOT_LEADER_NAMED = /^node (\d+) does not lead (.*): node (\d+)(?: at (\S+))? does$/;
const NOT_LEADER_NONE = /^(.*) has no leader at the moment/;
const NOT_LEADER_PART_OF = /^partition (\d+) of '(.*)'$/;

/**
 * The broker's `not_leader`: the node that answered does not lead what the request needs (a
 * partition, or the cluster metadata); nothing was done. The client follows leaders by itself
 * (see `leaderTimeoutMs`); this error reaches the caller when following is off or timed out.
 * Fields the message does not name are 0n, "" or -1.
 */
export class NotLeaderError extends ServerError {
  /** The node that answered. */
  readonly node: bigint;
  /** The leader, 0n when unknown (an election under way). */
  readonly leader: bigint;
  /** The leader's client address, "" when unknown. */
  readonly leaderAddr: string;
  /** The partition's topic; "" for the cluster metadata. */
  readonly topic: string;
  /** The partition; -1 for the cluster metadata or when not named. */
  readonly partition: number;

  constructor(message: string) {
    super(ErrorCode.not_leader, message);
    this.name = "NotLeaderError";
    let node = 0n;
    let leader = 0n;
    let leaderAddr = "";
    let what = "";
    const named = NOT_LEADER_NAMED.exec(message);
    if (named) {
      node = BigInt(named[1]!);
      leader = BigInt(named[3]!);
      leaderAddr = named[4] ?? "";
      what = named[2]!;
    } else {
      what = NOT_LEADER_NONE.exec(message)?.[1] ?? "";
    }
    const part = NOT_LEADER_PART_OF.exec(what);
    this.node = node;
    this.leader = leader;
    this.leaderAddr = leaderAddr;
    this.topic = part ? part[2]! : "";
    this.partition = part ? Number(part[1]) : -1;
  }
}

/** The ServerError of an ERROR frame: a ForbiddenError for `forbidden`, a NotLeaderError for `not_leader`. */
export function serverError(code: number, message: string): ServerError {
  if (code === ErrorCode.forbidden) return new ForbiddenError(message);
  if (code === ErrorCode.not_leader) return new NotLeaderError(message);
  return new ServerError(code, message);
}

/**
 * The connection is gone or could not be made. A request that was sent before the loss has an
 * unknown outcome (`outcomeUnknown`): a publish may or may not have been stored.
 */
export class ConnectionError extends FerryMQError {
  readonly outcomeUnknown: boolean;

  constructor(code: "connect_failed" | "connection_lost" | "closed", message: string, options?: { cause?: unknown; outcomeUnknown?: boolean }) {
    super(code, message, options);
    this.name = "ConnectionError";
    this.outcomeUnknown = options?.outcomeUnknown ?? false;
  }
}

/** A request got no answer in time; its outcome is unknown. */
export class TimeoutError extends FerryMQError {
  constructor(message: string) {
    super("timeout", message);
    this.name = "TimeoutError";
  }
}

/** `createTopic(..., { ifNotExists: true })` found the topic with another configuration. */
export class TopicConfigMismatch extends FerryMQError {
  readonly topic: string;
  /** The existing topic's configuration. */
  readonly existing: import("./codec.js").TopicConfig;
  /** Each field that differs: `<field> <existing> (asked <value>)`. */
  readonly differences: string[];

  constructor(topic: string, existing: import("./codec.js").TopicConfig, differences: string[]) {
    super("conflict", `topic ${JSON.stringify(topic)} exists with another configuration: ${differences.join(", ")}`);
    this.name = "TopicConfigMismatch";
    this.topic = topic;
    this.existing = existing;
    this.differences = differences;
  }
}
