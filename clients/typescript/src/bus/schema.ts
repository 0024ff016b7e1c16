// Message schemas of the bus: a type name, fields in declaration order, and the key field.
// Field types are the five the shared bus vectors define, mapped alike by every serializer and
// every language: int (signed 64-bit), float (double), string, bool and uuid.

import { FerryMQError } from "../errors.js";

export type FieldType = "int" | "float" | "string" | "bool" | "uuid";

export interface FieldSpec<N extends string = string> {
  name: N;
  type: FieldType;
  /** Protobuf field number; the 1-based declaration position when absent. */
  number?: number;
}

export interface Field {
  name: string;
  type: FieldType;
  number: number;
}

/** A value of each field type: an int is a number when safe, a bigint otherwise. */
export type FieldValue = number | bigint | string | boolean;
export type Values = Record<string, FieldValue>;

/** A schema, optionally with the class its messages are built as. */
export interface Schema<T = Values> {
  readonly name: string;
  readonly fields: readonly Field[];
  readonly key: string;
  /** The topic; undefined = the bus's topic template (by default the type name). */
  readonly topic: string | undefined;
  /** Makes a message from checked values (a plain object by default). */
  build(values: Values): T;
  /** The field values of a message. */
  values(message: T): Values;
}

/** A message that does not fit its schema, or a schema that cannot be one. */
export class SchemaError extends FerryMQError {
  constructor(message: string) {
    super("schema", message);
    this.name = "SchemaError";
  }
}

const FIELD_TYPES: readonly FieldType[] = ["int", "float", "string", "bool", "uuid"];
export const INT_MIN = -(1n << 63n);
export const INT_MAX = (1n << 63n) - 1n;
const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** The field names of a message type `T`: any string for untyped `Values`. */
export type FieldName<T> = Extract<keyof T, string>;

export interface DefineOptions<T> {
  name: string;
  /** The key field: it picks the shard. */
  key: FieldName<T>;
  /** The fields in declaration order: `[name, type]` or `{ name, type, number }`. */
  fields: (FieldSpec<FieldName<T>> | readonly [FieldName<T>, FieldType])[];
  topic?: string;
  build?: (values: Values) => T;
  values?: (message: T) => Values;
}

/**
 * Defines a message type. The typed form names the message's interface, so that the key, the
 * field names and every message sent are checked at compile time:
 *
 * ```ts
 * interface OrderPlaced { order_id: number; customer: string }
 * const OrderPlaced = defineMessage<OrderPlaced>({
 *   name: "OrderPlaced",
 *   key: "order_id",
 *   fields: [["order_id", "int"], ["customer", "string"]],
 * });
 * await sender.send(OrderPlaced, { order_id: 42, customer: "ada" }); // a misspelled field fails to compile
 * ```
 *
 * Without a type argument the messages are plain `Values`.
 */
export function defineMessage<T = Values>(options: DefineOptions<T>): Schema<T> {
  if (!options.name) throw new SchemaError("a message type needs a name");
  const fields: Field[] = options.fields.map((f, i) => {
    const spec: FieldSpec = isPair(f) ? { name: f[0], type: f[1] } : f;
    if (!FIELD_TYPES.includes(spec.type)) {
      throw new SchemaError(`${options.name}.${spec.name} has type ${String(spec.type)}; one of ${FIELD_TYPES.join(", ")}`);
    }
    const number = spec.number ?? i + 1;
    if (!Number.isInteger(number) || number < 1 || number > 536_870_911) {
      throw new SchemaError(`${options.name}.${spec.name} has Protobuf field number ${number}`);
    }
    return { name: spec.name, type: spec.type, number };
  });
  if (new Set(fields.map((f) => f.name)).size !== fields.length) throw new SchemaError(`${options.name} repeats a field name`);
  if (new Set(fields.map((f) => f.number)).size !== fields.length) throw new SchemaError(`${options.name} repeats a field number`);
  const keyField = fields.find((f) => f.name === options.key);
  if (keyField === undefined) throw new SchemaError(`${options.name} has no field ${options.key} to be its key`);
  if (keyField.type !== "int" && keyField.type !== "string" && keyField.type !== "uuid") {
    throw new SchemaError(`${options.name}.${options.key} is a ${keyField.type}: a key is an int, a string or a uuid`);
  }
  return {
    name: options.name,
    fields,
    key: options.key,
    topic: options.topic,
    build: options.build ?? ((v) => v as unknown as T),
    values: options.values ?? ((m) => m as unknown as Values),
  };
}

function isPair(f: FieldSpec | readonly [string, FieldType]): f is readonly [string, FieldType] {
  return Array.isArray(f);
}

/** Checks a value against its field type; an int comes back as a number when safe. */
export function checkValue(where: string, type: FieldType, v: unknown): FieldValue {
  switch (type) {
    case "int": {
      // A safe integer is within 64 bits and stays a number: no bigint made.
      if (typeof v === "number" && Number.isSafeInteger(v)) return v === 0 ? 0 : v;
      let b: bigint;
      if (typeof v === "bigint") b = v;
      else if (typeof v === "number" && Number.isInteger(v)) b = BigInt(v);
      else if (typeof v === "string" && /^-?[0-9]{1,20}$/.test(v)) b = BigInt(v);
      else throw new SchemaError(`${where} is an int, got ${describe(v)}`);
      if (b < INT_MIN || b > INT_MAX) throw new SchemaError(`${where} = ${b} does not fit a signed 64-bit int`);
      return b >= -9007199254740991n && b <= 9007199254740991n ? Number(b) : b;
    }
    case "float":
      if (typeof v === "number" && Number.isFinite(v)) return v;
      if (typeof v === "bigint") return Number(v);
      throw new SchemaError(`${where} is a finite float, got ${describe(v)}`);
    case "string":
      if (typeof v === "string") return v;
      throw new SchemaError(`${where} is a string, got ${describe(v)}`);
    case "bool":
      if (typeof v === "boolean") return v;
      throw new SchemaError(`${where} is a bool, got ${describe(v)}`);
    case "uuid": {
      const s = typeof v === "string" ? v.toLowerCase() : "";
      if (!UUID_RE.test(s)) throw new SchemaError(`${where} is a UUID (8-4-4-4-12 hex digits), got ${describe(v)}`);
      return s;
    }
  }
}

function describe(v: unknown): string {
  if (typeof v === "string") return JSON.stringify(v.length > 40 ? v.slice(0, 40) + "..." : v);
  if (typeof v === "bigint") return `${v}n`;
  return v === null ? "null" : typeof v === "object" ? "an object" : String(v);
}

/** Every field of `values` checked and in declaration order; a missing field is an error. */
export function checkValues(schema: Schema<unknown>, values: Record<string, unknown>): Values {
  const out: Values = {};
  for (const f of schema.fields) {
    if (!(f.name in values) || values[f.name] === undefined) throw new SchemaError(`${schema.name}.${f.name} is missing`);
    out[f.name] = checkValue(`${schema.name}.${f.name}`, f.type, values[f.name]);
  }
  return out;
}
