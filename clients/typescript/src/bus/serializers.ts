// The bus's serializers, named in each message's `x-bus-serializer` header. JSON and deflate
// JSON use node built-ins only; MessagePack and Protobuf load their optional peer dependency
// (@msgpack/msgpack, @bufbuild/protobuf) on first use, so a bus without them still speaks JSON.
//
// Writers produce the exact bytes of protocol/bus-vectors.json (fields in declaration order,
// ints in their smallest MessagePack form, floats always as float64, proto3 defaults omitted);
// readers accept any valid encoding of the same values.

import { deflateRawSync, inflateRawSync } from "node:zlib";

import { FerryMQError } from "../errors.js";
import { checkValue, SchemaError, type Field, type FieldValue, type Schema, type Values } from "./schema.js";

/** A body its serializer cannot read; the receiver dead-letters it with this reason. */
export class UnreadableBody extends FerryMQError {
  constructor(message: string) {
    super("unreadable_body", message);
    this.name = "UnreadableBody";
  }
}

/** A serializer name no serializer answers to, or one whose package is not installed. */
export class UnknownSerializer extends FerryMQError {
  constructor(message: string) {
    super("unknown_serializer", message);
    this.name = "UnknownSerializer";
  }
}

/**
 * A serializer this bus knows whose optional package is not installed here. A message in it is
 * valid: a receiver gives it back for an instance that can read it instead of dead-lettering it.
 */
export class SerializerUnavailable extends UnknownSerializer {
  constructor(message: string) {
    super(message);
    this.name = "SerializerUnavailable";
  }
}

export interface Serializer {
  readonly name: string;
  /** Set when its optional package is missing: what to install. */
  readonly unavailable?: string;
  dumps(schema: Schema<unknown>, values: Values): Uint8Array;
  loads(schema: Schema<unknown>, body: Uint8Array): Values;
}

const textEncoder = new TextEncoder();
const textDecoder = new TextDecoder("utf-8", { fatal: true });

// --- JSON ------------------------------------------------------------------------------------

/** Marks an integer literal too long for a double, so the JSON reader keeps its digits. */
const BIG_LITERAL = "\u0000int:";

const SIXTEEN_DIGITS = /[0-9]{16}/;

/** JSON.parse that keeps integer literals of 16 digits or more exact (as marked strings). */
export function parseJsonLossless(text: string): unknown {
  // Without a run of 16 digits anywhere there is no literal to keep: JSON.parse as it is.
  if (!SIXTEEN_DIGITS.test(text)) return JSON.parse(text);
  let out = "";
  let i = 0;
  let last = 0;
  while (i < text.length) {
    const c = text.charCodeAt(i);
    if (c === 0x22) {
      i++;
      while (i < text.length && text.charCodeAt(i) !== 0x22) i += text.charCodeAt(i) === 0x5c ? 2 : 1;
      i++;
    } else if (c === 0x2d || (c >= 0x30 && c <= 0x39)) {
      let j = i;
      while (j < text.length && /[-+0-9.eE]/.test(text[j]!)) j++;
      const literal = text.slice(i, j);
      if (/^-?[0-9]{16,}$/.test(literal)) {
        out += text.slice(last, i) + JSON.stringify(BIG_LITERAL + literal);
        last = j;
      }
      i = j;
    } else {
      i++;
    }
  }
  return JSON.parse(out + text.slice(last));
}

function jsonValue(f: Field, v: FieldValue): string {
  switch (f.type) {
    case "int":
      return BigInt(v as number | bigint).toString();
    case "float":
      return JSON.stringify(v);
    case "bool":
      return v ? "true" : "false";
    default:
      return JSON.stringify(v);
  }
}

function fromMapping(schema: Schema<unknown>, obj: unknown, bigLiterals: boolean): Values {
  if (obj === null || typeof obj !== "object" || Array.isArray(obj) || obj instanceof Map) {
    throw new UnreadableBody(`a ${schema.name} is an object/map, got ${obj === null ? "null" : Array.isArray(obj) ? "an array" : typeof obj}`);
  }
  const record = obj as Record<string, unknown>;
  const values: Values = {};
  // The common case without a check call per field: a string for a string field, a safe
  // integer for an int field, a boolean for a bool field, each an own property.
  let plain = true;
  for (const f of schema.fields) {
    const v = record[f.name];
    const t = typeof v;
    if (
      !((t === "string" && f.type === "string") || (t === "number" && f.type === "int" && Number.isSafeInteger(v) && v !== 0) || (t === "boolean" && f.type === "bool")) ||
      !Object.prototype.hasOwnProperty.call(record, f.name) ||
      (bigLiterals && t === "string" && (v as string).startsWith(BIG_LITERAL))
    ) {
      plain = false;
      break;
    }
    values[f.name] = v as FieldValue;
  }
  if (plain) return values;
  for (const f of schema.fields) {
    if (!Object.prototype.hasOwnProperty.call(record, f.name)) throw new UnreadableBody(`${schema.name}.${f.name} is missing`);
    let v = record[f.name];
    if (bigLiterals && typeof v === "string" && v.startsWith(BIG_LITERAL)) {
      const digits = v.slice(BIG_LITERAL.length);
      if (f.type === "int") v = BigInt(digits);
      else if (f.type === "float") v = Number(digits);
      else throw new UnreadableBody(`${schema.name}.${f.name} is a ${f.type}, got the number ${digits}`);
    }
    try {
      values[f.name] = checkValue(`${schema.name}.${f.name}`, f.type, v);
    } catch (e) {
      if (e instanceof SchemaError) throw new UnreadableBody(e.message);
      throw e;
    }
  }
  return values;
}

export const json: Serializer = {
  name: "json",
  dumps(schema, values) {
    const parts: string[] = [];
    for (const f of schema.fields) parts.push(`${JSON.stringify(f.name)}:${jsonValue(f, values[f.name]!)}`);
    return textEncoder.encode(`{${parts.join(",")}}`);
  },
  loads(schema, body) {
    let obj: unknown;
    try {
      obj = parseJsonLossless(textDecoder.decode(body));
    } catch (e) {
      throw new UnreadableBody(`not JSON: ${e instanceof Error ? e.message : String(e)}`);
    }
    return fromMapping(schema, obj, true);
  },
};

/** Bodies above this once inflated are refused: a small body must not make a receiver allocate without bound. */
export const INFLATED_BYTES_MAX = 64 * 1024 * 1024;

export const deflateJson: Serializer = {
  name: "deflate-json",
  dumps(schema, values) {
    const raw = deflateRawSync(json.dumps(schema, values), { level: 9 });
    return new Uint8Array(raw.buffer, raw.byteOffset, raw.byteLength);
  },
  loads(schema, body) {
    let inflated: Uint8Array;
    try {
      inflated = inflateRawSync(body, { maxOutputLength: INFLATED_BYTES_MAX });
    } catch (e) {
      throw new UnreadableBody(`not raw DEFLATE of at most ${INFLATED_BYTES_MAX} bytes: ${e instanceof Error ? e.message : String(e)}`);
    }
    return json.loads(schema, inflated);
  },
};

// --- MessagePack -----------------------------------------------------------------------------

class PackWriter {
  private parts: number[] = [];
  private chunks: Uint8Array[] = [];
  private flushParts(): void {
    if (this.parts.length > 0) {
      this.chunks.push(Uint8Array.from(this.parts));
      this.parts = [];
    }
  }
  bytes(b: Uint8Array): void {
    this.flushParts();
    this.chunks.push(b);
  }
  u8(...b: number[]): void {
    this.parts.push(...b);
  }
  be(value: bigint, size: number): void {
    for (let i = size - 1; i >= 0; i--) this.parts.push(Number((value >> BigInt(8 * i)) & 0xffn));
  }
  str(s: string): void {
    const b = textEncoder.encode(s);
    if (b.length < 32) this.u8(0xa0 | b.length);
    else if (b.length < 0x100) this.u8(0xd9, b.length);
    else if (b.length < 0x10000) {
      this.u8(0xda);
      this.be(BigInt(b.length), 2);
    } else {
      this.u8(0xdb);
      this.be(BigInt(b.length), 4);
    }
    this.bytes(b);
  }
  int(v: bigint): void {
    if (v >= 0n) {
      if (v < 128n) this.u8(Number(v));
      else if (v < 0x100n) this.u8(0xcc, Number(v));
      else if (v < 0x10000n) (this.u8(0xcd), this.be(v, 2));
      else if (v < 0x100000000n) (this.u8(0xce), this.be(v, 4));
      else (this.u8(0xcf), this.be(v, 8));
    } else {
      const u = (bits: number) => v & ((1n << BigInt(bits)) - 1n);
      if (v >= -32n) this.u8(Number(u(8)));
      else if (v >= -128n) this.u8(0xd0, Number(u(8)));
      else if (v >= -32768n) (this.u8(0xd1), this.be(u(16), 2));
      else if (v >= -2147483648n) (this.u8(0xd2), this.be(u(32), 4));
      else (this.u8(0xd3), this.be(u(64), 8));
    }
  }
  float64(v: number): void {
    const b = new Uint8Array(8);
    new DataView(b.buffer).setFloat64(0, v, false);
    this.u8(0xcb, ...b);
  }
  finish(): Uint8Array {
    this.flushParts();
    const size = this.chunks.reduce((n, c) => n + c.length, 0);
    const out = new Uint8Array(size);
    let at = 0;
    for (const c of this.chunks) {
      out.set(c, at);
      at += c.length;
    }
    return out;
  }
}

type MsgpackModule = { decode: (b: Uint8Array, options?: { useBigInt64?: boolean }) => unknown };

const MSGPACK_MISSING = "the msgpack serializer needs the package @msgpack/msgpack: npm install @msgpack/msgpack";

function msgpack(mod: MsgpackModule | null): Serializer {
  return {
    name: "msgpack",
    ...(mod === null ? { unavailable: MSGPACK_MISSING } : {}),
    dumps(schema, values) {
      if (schema.fields.length > 0xffff) throw new SchemaError(`${schema.name} has too many fields`);
      const w = new PackWriter();
      if (schema.fields.length < 16) w.u8(0x80 | schema.fields.length);
      else (w.u8(0xde), w.be(BigInt(schema.fields.length), 2));
      for (const f of schema.fields) {
        w.str(f.name);
        const v = values[f.name]!;
        if (f.type === "int") w.int(BigInt(v as number | bigint));
        else if (f.type === "float") w.float64(v as number);
        else if (f.type === "bool") w.u8(v ? 0xc3 : 0xc2);
        else w.str(v as string);
      }
      return w.finish();
    },
    loads(schema, body) {
      if (mod === null) throw new SerializerUnavailable(MSGPACK_MISSING);
      let obj: unknown;
      try {
        obj = mod.decode(body, { useBigInt64: true });
      } catch (e) {
        throw new UnreadableBody(`not MessagePack: ${e instanceof Error ? e.message : String(e)}`);
      }
      return fromMapping(schema, obj, false);
    },
  };
}

// --- Protobuf --------------------------------------------------------------------------------

type WireModule = typeof import("@bufbuild/protobuf/wire");
const PROTOBUF_MISSING = "the protobuf serializer needs the package @bufbuild/protobuf: npm install @bufbuild/protobuf";

function protobuf(mod: WireModule | null): Serializer {
  const need = (): WireModule => {
    if (mod === null) throw new SerializerUnavailable(PROTOBUF_MISSING);
    return mod;
  };
  return {
    name: "protobuf",
    ...(mod === null ? { unavailable: PROTOBUF_MISSING } : {}),
    dumps(schema, values) {
      const { BinaryWriter, WireType } = need();
      const w = new BinaryWriter();
      // proto3 with implicit presence: fields in number order, default values left out.
      for (const f of [...schema.fields].sort((a, b) => a.number - b.number)) {
        const v = values[f.name]!;
        if (f.type === "int") {
          if (BigInt(v as number | bigint) !== 0n) w.tag(f.number, WireType.Varint).int64(v as number | bigint);
        } else if (f.type === "float") {
          if (v !== 0) w.tag(f.number, WireType.Bit64).double(v as number);
        } else if (f.type === "bool") {
          if (v) w.tag(f.number, WireType.Varint).bool(true);
        } else if (v !== "") {
          w.tag(f.number, WireType.LengthDelimited).string(v as string);
        }
      }
      return w.finish();
    },
    loads(schema, body) {
      const { BinaryReader, WireType } = need();
      const byNumber = new Map(schema.fields.map((f) => [f.number, f]));
      const raw: Record<string, unknown> = {};
      for (const f of schema.fields) raw[f.name] = f.type === "int" ? 0 : f.type === "float" ? 0 : f.type === "bool" ? false : "";
      try {
        const r = new BinaryReader(body);
        while (r.pos < r.len) {
          const [no, wt] = r.tag();
          const f = byNumber.get(no);
          if (f === undefined) {
            r.skip(wt, no);
            continue;
          }
          const expected = f.type === "float" ? WireType.Bit64 : f.type === "int" || f.type === "bool" ? WireType.Varint : WireType.LengthDelimited;
          if (wt !== expected) throw new UnreadableBody(`${schema.name}.${f.name} (field ${no}) has wire type ${wt}, expected ${expected}`);
          raw[f.name] = f.type === "int" ? BigInt(r.int64()) : f.type === "float" ? r.double() : f.type === "bool" ? r.bool() : r.string();
        }
      } catch (e) {
        if (e instanceof UnreadableBody) throw e;
        throw new UnreadableBody(`not a ${schema.name} in Protobuf: ${e instanceof Error ? e.message : String(e)}`);
      }
      return fromMapping(schema, raw, false);
    },
  };
}

/** The serializers a bus knows, by name. */
export class Serializers {
  private readonly byName = new Map<string, Serializer>();

  private constructor(list: Serializer[]) {
    for (const s of list) this.byName.set(s.name, s);
  }

  /** Loads the optional packages that are installed; the others fail on use with what to install. */
  static async load(extra: Serializer[] = []): Promise<Serializers> {
    const pack = (await import("@msgpack/msgpack").catch(() => null)) as MsgpackModule | null;
    const wire = (await import("@bufbuild/protobuf/wire").catch(() => null)) as WireModule | null;
    return new Serializers([json, deflateJson, msgpack(pack), protobuf(wire), ...extra]);
  }

  get(name: string): Serializer {
    const s = this.byName.get(name);
    if (s === undefined) throw new UnknownSerializer(`no serializer named ${JSON.stringify(name)}; known: ${[...this.byName.keys()].join(", ")}`);
    return s;
  }

  names(): string[] {
    return [...this.byName.keys()];
  }

  /** The serializers whose optional package is missing, with what to install. */
  unavailable(): Map<string, string> {
    const out = new Map<string, string>();
    for (const [name, s] of this.byName) if (s.unavailable !== undefined) out.set(name, s.unavailable);
    return out;
  }
}
