// Which shard (partition) a key goes to: the broker's own rule for ints and strings, so that a
// bus message lands where a plain keyed publish of the same key would; the byte sum for UUIDs.

import { FerryMQError } from "../errors.js";
import type { FieldType, FieldValue } from "./schema.js";

const FNV_OFFSET = 0xcbf29ce484222325n;
const FNV_PRIME = 0x100000001b3n;
const U64_MASK = (1n << 64n) - 1n;
const U64_MAX = U64_MASK;
const textEncoder = new TextEncoder();

export function fnv1a64(bytes: Uint8Array): bigint {
  let h = FNV_OFFSET;
  for (const b of bytes) h = ((h ^ BigInt(b)) * FNV_PRIME) & U64_MASK;
  return h;
}

/** The broker's partition rule: 1..=20 ASCII digits that fit a u64 take that number mod N; any other key FNV-1a-64 mod N. */
export function partitionForKey(key: Uint8Array, partitions: number): number {
  if (key.length >= 1 && key.length <= 20 && key.every((b) => b >= 0x30 && b <= 0x39)) {
    let v = 0n;
    for (const b of key) v = v * 10n + BigInt(b - 0x30);
    if (v <= U64_MAX) return Number(v % BigInt(partitions));
  }
  return Number(fnv1a64(key) % BigInt(partitions));
}

/** The bytes a key is carried as: decimal ASCII for an int, UTF-8 for a string, the 36-character form of a UUID. */
export function keyBytes(type: FieldType, key: FieldValue): Uint8Array {
  if (type === "int" && (typeof key === "number" || typeof key === "bigint")) return textEncoder.encode(BigInt(key).toString());
  if ((type === "string" || type === "uuid") && typeof key === "string") return textEncoder.encode(key);
  throw new FerryMQError("invalid_argument", `a ${type} key cannot be ${String(key)}`);
}

export function uuidBytes(uuid: string): Uint8Array {
  const hex = uuid.replace(/-/g, "");
  const out = new Uint8Array(16);
  for (let i = 0; i < 16; i++) out[i] = parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  return out;
}

/** The default shard of a key: the byte sum of a UUID mod N, the broker's rule for ints and strings. */
export function shardForKey(type: FieldType, key: FieldValue, shardCount: number): number {
  if (!Number.isInteger(shardCount) || shardCount < 1) {
    throw new FerryMQError("invalid_argument", `the shard count must be at least 1, got ${shardCount}`);
  }
  if (type === "uuid") {
    let sum = 0;
    for (const b of uuidBytes(String(key))) sum += b;
    return sum % shardCount;
  }
  return partitionForKey(keyBytes(type, key), shardCount);
}
