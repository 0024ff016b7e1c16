export { defineMessage, checkValue, checkValues, SchemaError, type Field, type FieldSpec, type FieldType, type FieldValue, type Schema, type Values } from "./schema.js";
export { deflateJson, json, parseJsonLossless, Serializers, UnknownSerializer, UnreadableBody, type Serializer } from "./serializers.js";
export { fnv1a64, keyBytes, partitionForKey, shardForKey } from "./shard.js";
export {
  BusError,
  HEADER_PREPARED,
  HEADER_SENDER,
  HEADER_SENT,
  HEADER_SERIALIZER,
  HEADER_SHARD,
  HEADER_TYPE,
  loadSettings,
  Receiver,
  Sender,
  type Context,
  type Handler,
  type MessageStats,
  type Outcome,
  type PreparedMessage,
  type ReceiverOptions,
  type SendOptions,
  type Settings,
  type SettingsInput,
  type ShardResolver,
} from "./bus.js";
