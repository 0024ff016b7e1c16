// The bus against protocol/bus-vectors.json, shared with the Python and Rust bus: the same
// key bytes, shard, headers and body bytes for every sample message and serializer, and the
// same shard for every sample key.
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { inflateRawSync } from "node:zlib";

import { defineMessage, keyBytes, loadSettings, Sender, Serializers, shardForKey } from "../dist/bus/index.js";
import { bytesToHex, hexToBytes, readJson, repoRoot } from "./support.mjs";

const path = join(repoRoot, "protocol", "bus-vectors.json");
const present = existsSync(path);
const skip = present ? false : `${path} is absent (it comes with the Python SDK); the bus vectors are not checked`;
const vectors = present ? readJson(path) : { schemas: [], messages: [], shards: [], headers: {}, serializers: [] };

const schemas = new Map(
  vectors.schemas.map((s) => [s.name, defineMessage({ name: s.name, key: s.key, fields: s.fields })]),
);

/** The vector's values as the bus reads them: ints as numbers when safe, bigints otherwise. */
function values(schema, raw) {
  const out = {};
  for (const f of schema.fields) {
    let v = raw[f.name];
    if (f.type === "int") {
      const b = BigInt(v);
      v = b >= -9007199254740991n && b <= 9007199254740991n ? Number(b) : b;
    }
    out[f.name] = v;
  }
  return out;
}

test("the bus headers are the ones the vectors name", { skip }, () => {
  assert.deepEqual(vectors.headers, {
    type: "x-bus-type",
    serializer: "x-bus-serializer",
    sender: "x-bus-sender",
    shard: "x-bus-shard",
    prepared_ms: "x-bus-prepared-ms",
    sent_ms: "x-bus-sent-ms",
  });
  assert.deepEqual(vectors.serializers, ["json", "deflate-json", "msgpack", "protobuf"]);
});

for (const v of vectors.messages) {
  test(`bus vector ${v.name}: key, shard, headers and bytes under every serializer`, { skip }, async () => {
    const serializers = await Serializers.load();
    const schema = schemas.get(v.type);
    const expected = values(schema, v.values);
    const settings = loadSettings({ identity: v.sender, shardCount: v.shard_count }, [], {});
    const sender = await Sender.create(null, settings, { serializers });
    for (const [name, out] of Object.entries(v.serialized)) {
      const prepared = sender.prepare(schema, expected, { serializer: name });
      assert.equal(prepared.topic, v.type);
      assert.equal(prepared.shard, v.shard);
      assert.equal(bytesToHex(prepared.key), v.key_hex);
      const headers = prepared.headers.filter(([n]) => n !== "x-bus-prepared-ms");
      assert.deepEqual(headers, out.headers);
      assert.ok(/^\d+$/.test(prepared.headers.find(([n]) => n === "x-bus-prepared-ms")[1]));
      if (name === "deflate-json") {
        // Compressors may choose other bytes: both inflate to the JSON.
        assert.equal(Buffer.from(inflateRawSync(prepared.body)).toString("utf8"), v.json_utf8);
        assert.equal(Buffer.from(inflateRawSync(hexToBytes(out.hex))).toString("utf8"), v.json_utf8);
      } else {
        assert.equal(bytesToHex(prepared.body), out.hex, name);
      }
      assert.deepStrictEqual(serializers.get(name).loads(schema, hexToBytes(out.hex)), expected, `${name} reads the vector back`);
    }
    assert.equal(Buffer.from(serializers.get("json").dumps(schema, expected)).toString("utf8"), v.json_utf8);
  });
}

test("every sample key's bytes and shard for every shard count", { skip }, () => {
  for (const s of vectors.shards) {
    const key = s.kind === "int" ? BigInt(s.key) : s.key;
    assert.equal(bytesToHex(keyBytes(s.kind, key)), s.key_hex, `${s.kind} ${s.key}`);
    for (const [n, shard] of Object.entries(s.shards)) {
      assert.equal(shardForKey(s.kind, key, Number(n)), shard, `${s.kind} ${s.key} over ${n} shards`);
    }
  }
});
