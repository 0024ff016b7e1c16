// Little-endian primitives shared by every frame: a bounds-checked reader that hands out
// zero-copy views, and a growable writer. Every read checks bounds first, so short or hostile
// input raises a ProtocolError naming the field, never a RangeError from a DataView.

import { FerryMQError } from "./base-error.js";

/** The kinds of failure of the codec, named as the Rust codec's `ProtocolError` variants. */
export type ProtocolErrorKind =
  | "Truncated"
  | "FrameTooLarge"
  | "UnknownOpcode"
  | "InvalidFlags"
  | "InvalidUtf8"
  | "InvalidValue"
  | "TrailingBytes";

/** Bytes that are not a valid frame, or a value that cannot be encoded into one. */
export class ProtocolError extends FerryMQError {
  readonly kind: ProtocolErrorKind;
  /** The field at fault, as the protocol document names it (`record.priority`), when known. */
  readonly field: string | undefined;

  constructor(kind: ProtocolErrorKind, field: string | undefined, message: string) {
    super("protocol_error", message);
    this.name = "ProtocolError";
    this.kind = kind;
    this.field = field;
  }

  static truncated(field: string): ProtocolError {
    return new ProtocolError("Truncated", field, `frame truncated while reading ${field}`);
  }

  static invalid(field: string, reason: string): ProtocolError {
    return new ProtocolError("InvalidValue", field, `invalid ${field}: ${reason}`);
  }
}

const U64_MAX = (1n << 64n) - 1n;
const TWO_32 = 2 ** 32;

const utf8Decoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
const utf8Encoder = new TextEncoder();

/** Decodes UTF-8, refusing invalid sequences as the protocol requires. */
export function decodeUtf8(bytes: Uint8Array, field: string): string {
  if (bytes.length === 0) return "";
  try {
    return utf8Decoder.decode(bytes);
  } catch {
    throw new ProtocolError("InvalidUtf8", field, `field ${field} is not valid UTF-8`);
  }
}

export function encodeUtf8(text: string): Uint8Array {
  return utf8Encoder.encode(text);
}

/** A cursor over one frame's payload. */
export class Reader {
  readonly buf: Uint8Array;
  readonly view: DataView;
  pos: number;
  readonly end: number;

  constructor(buf: Uint8Array, start = 0, end = buf.length) {
    this.buf = buf;
    this.view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
    this.pos = start;
    this.end = end;
  }

  remaining(): number {
    return this.end - this.pos;
  }

  need(n: number, field: string): number {
    if (this.end - this.pos < n) throw ProtocolError.truncated(field);
    const at = this.pos;
    this.pos += n;
    return at;
  }

  u8(field: string): number {
    return this.buf[this.need(1, field)]!;
  }

  u16(field: string): number {
    return this.view.getUint16(this.need(2, field), true);
  }

  u32(field: string): number {
    return this.view.getUint32(this.need(4, field), true);
  }

  u64(field: string): bigint {
    return this.view.getBigUint64(this.need(8, field), true);
  }

  /** A view of the next `n` bytes; no copy, so it lives as long as the frame's buffer. */
  bytes(n: number, field: string): Uint8Array {
    const at = this.need(n, field);
    return this.buf.subarray(at, at + n);
  }

  bytes16(field: string): Uint8Array {
    return this.bytes(this.u16(field), field);
  }

  str16(field: string): string {
    return decodeUtf8(this.bytes16(field), field);
  }

  finish(opcodeName: string): void {
    const extra = this.end - this.pos;
    if (extra !== 0) {
      throw new ProtocolError(
        "TrailingBytes",
        undefined,
        `${extra} unexpected bytes after the end of a ${opcodeName} frame`,
      );
    }
  }
}

/** A growable output buffer. The bytes it hands out by `finish` are never written again. */
export class Writer {
  buf: Uint8Array;
  view: DataView;
  pos = 0;

  constructor(capacity = 256) {
    this.buf = new Uint8Array(capacity);
    this.view = new DataView(this.buf.buffer);
  }

  ensure(n: number): void {
    if (this.pos + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.pos + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.pos));
    this.buf = next;
    this.view = new DataView(next.buffer);
  }

  u8(v: number): void {
    this.ensure(1);
    this.buf[this.pos++] = v;
  }

  u16(v: number): void {
    this.ensure(2);
    this.view.setUint16(this.pos, v, true);
    this.pos += 2;
  }

  u32(v: number): void {
    this.ensure(4);
    this.view.setUint32(this.pos, v, true);
    this.pos += 4;
  }

  /** Writes a u64 already checked by `toU64`. */
  u64(v: bigint | number): void {
    this.ensure(8);
    if (typeof v === "number") {
      this.view.setUint32(this.pos, v % TWO_32, true);
      this.view.setUint32(this.pos + 4, Math.floor(v / TWO_32), true);
    } else {
      this.view.setBigUint64(this.pos, v, true);
    }
    this.pos += 8;
  }

  bytes(b: Uint8Array): void {
    this.ensure(b.length);
    this.buf.set(b, this.pos);
    this.pos += b.length;
  }

  /** bytes16: the caller has bounded the length. */
  bytes16(b: Uint8Array, field: string): void {
    if (b.length > 0xffff) throw ProtocolError.invalid(field, `${b.length} bytes do not fit a u16 length`);
    this.u16(b.length);
    this.bytes(b);
  }

  /** str16 with a byte limit; returns the encoded length. */
  str16(s: string, field: string, max = 0xffff, min = 0): number {
    // A UTF-16 unit becomes at most 3 UTF-8 bytes.
    this.ensure(2 + s.length * 3);
    const { written } = utf8Encoder.encodeInto(s, this.buf.subarray(this.pos + 2));
    if (written < min || written > max) {
      throw ProtocolError.invalid(field, `${written} bytes: must be ${min}..=${max} bytes`);
    }
    this.view.setUint16(this.pos, written, true);
    this.pos += 2 + written;
    return written;
  }

  /** The written bytes; the writer must not be used afterwards. */
  finish(): Uint8Array {
    return this.buf.subarray(0, this.pos);
  }
}

/** Accepts a u64 as a bigint, a safe integer or a decimal string. */
export function toU64(v: bigint | number | string, field: string): bigint | number {
  if (typeof v === "number") {
    if (Number.isSafeInteger(v) && v >= 0) return v;
    throw ProtocolError.invalid(field, `${v} is not a u64 (use a bigint above 2^53)`);
  }
  let b: bigint;
  if (typeof v === "string") {
    if (!/^[0-9]{1,20}$/.test(v)) throw ProtocolError.invalid(field, `"${v}" is not a decimal u64`);
    b = BigInt(v);
  } else if (typeof v === "bigint") {
    b = v;
  } else {
    throw ProtocolError.invalid(field, `${String(v)} is not a u64`);
  }
  if (b < 0n || b > U64_MAX) throw ProtocolError.invalid(field, `${b} is outside 0..=2^64-1`);
  return b;
}

/** Checks a u32 field (a JS number) before writing it. */
export function checkU32(v: number, field: string, min = 0, max = 0xffffffff): number {
  if (!Number.isInteger(v) || v < min || v > max) {
    throw ProtocolError.invalid(field, `${v} is not within ${min}..=${max}`);
  }
  return v;
}
