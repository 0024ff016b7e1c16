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

/** The ServerError of an ERROR frame: a ForbiddenError for `forbidden`. */
export function serverError(code: number, message: string): ServerError {
  return code === ErrorCode.forbidden ? new ForbiddenError(message) : new ServerError(code, message);
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
