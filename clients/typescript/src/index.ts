export * from "./codec.js";
export * from "./limits.js";
export { Reader, Writer, toU64 } from "./wire.js";
export { ConnectionError, FerryMQError, ForbiddenError, NotLeaderError, ServerError, TimeoutError, TopicConfigMismatch } from "./errors.js";
export { DEDUP_ID_HEADER, Message, toBytes, type BytesLike, type NackOptions, type OutgoingMessage } from "./message.js";
export { parsePartitionList, Subscription, type SubscribeOptions } from "./subscription.js";
export {
  BatchReceipt,
  Client,
  CreatedToken,
  parseMessageId,
  type ActionsInput,
  type ClientOptions,
  type PublishOptions,
  type PublishReceipt,
  type ReconnectOptions,
  type RequeueSelectionInput,
  type RolesInput,
} from "./client.js";

import { Client, type ClientOptions } from "./client.js";

/**
 * Connects to a broker, `await connect({ url: "127.0.0.1:7070" })`, or to the nodes of a
 * cluster, `await connect({ urls: ["10.0.0.1:7070", "10.0.0.2:7070"] })`.
 */
export function connect(options: ClientOptions = {}): Promise<Client> {
  return Client.connect(options);
}
