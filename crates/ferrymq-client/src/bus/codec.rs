//! The bus serializers over a schema and its field values, byte for byte as
//! `protocol/bus-vectors.json` defines them (see its `notes`):
//!
//! - `json`: an object in declaration order, no whitespace, numbers and strings written as
//!   ECMAScript's `JSON.stringify` writes them;
//! - `deflate-json`: that JSON as raw DEFLATE (RFC 1951);
//! - `msgpack`: a map in declaration order, ints in their smallest form, floats as float64;
//! - `protobuf`: proto3, field numbers from the schema, default values omitted.
//!
//! MessagePack and Protobuf are written here rather than through general libraries: the bus
//! carries five field types, and the exact bytes matter more than generality. Decoders accept
//! every valid encoding of those types (any int width, any field order, unknown Protobuf fields
//! skipped), and refuse anything else with [`BusError::UnreadableBody`].

use std::io::{Read, Write};

use super::{BusError, FieldType, Schema, Serializer, Value};

/// Most bytes a deflate-json body may inflate to: a small compressed body must not make a
/// receiver allocate without bound.
pub const INFLATED_BYTES_MAX: u64 = 64 * 1024 * 1024;

pub fn serialize(
    schema: &Schema,
    values: &[Value],
    serializer: Serializer,
) -> Result<Vec<u8>, BusError> {
    check(schema, values)?;
    Ok(match serializer {
        Serializer::Json => to_json(schema, values),
        Serializer::DeflateJson => {
            let mut encoder =
                flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
            encoder
                .write_all(&to_json(schema, values))
                .and_then(|_| encoder.finish())
                .map_err(|e| BusError::Schema(format!("deflate failed: {e}")))?
        }
        Serializer::MsgPack => to_msgpack(schema, values),
        Serializer::Protobuf => to_protobuf(schema, values),
    })
}

pub fn deserialize(
    schema: &Schema,
    body: &[u8],
    serializer: Serializer,
) -> Result<Vec<Value>, BusError> {
    let values = match serializer {
        Serializer::Json => from_json(schema, body)?,
        Serializer::DeflateJson => {
            let mut out = Vec::new();
            flate2::read::DeflateDecoder::new(body)
                .take(INFLATED_BYTES_MAX + 1)
                .read_to_end(&mut out)
                .map_err(|e| BusError::UnreadableBody(format!("not raw DEFLATE: {e}")))?;
            if out.len() as u64 > INFLATED_BYTES_MAX {
                return Err(BusError::UnreadableBody(format!(
                    "inflates to more than {INFLATED_BYTES_MAX} bytes"
                )));
            }
            from_json(schema, &out)?
        }
        Serializer::MsgPack => from_msgpack(schema, body)?,
        Serializer::Protobuf => from_protobuf(schema, body)?,
    };
    check(schema, &values).map_err(|e| BusError::UnreadableBody(e.to_string()))?;
    Ok(values)
}

fn check(schema: &Schema, values: &[Value]) -> Result<(), BusError> {
    if values.len() != schema.fields.len() {
        return Err(BusError::Schema(format!(
            "{} has {} fields, got {} values",
            schema.name,
            schema.fields.len(),
            values.len()
        )));
    }
    for (field, value) in schema.fields.iter().zip(values) {
        let ok = match (field.ty, value) {
            (FieldType::Int, Value::Int(_))
            | (FieldType::Bool, Value::Bool(_))
            | (FieldType::String, Value::Str(_)) => true,
            (FieldType::Float, Value::Float(f)) => f.is_finite(),
            (FieldType::Uuid, Value::Str(s)) => uuid::Uuid::parse_str(s).is_ok(),
            _ => false,
        };
        if !ok {
            return Err(BusError::Schema(format!(
                "{}.{} is a {:?}, got {value:?}",
                schema.name, field.name, field.ty
            )));
        }
    }
    Ok(())
}

// -- JSON ---------------------------------------------------------------------------------------

/// ECMAScript Number::toString of a finite double.
pub fn js_number(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    let sign = if x < 0.0 { "-" } else { "" };
    // `{:e}` gives the shortest round-trip digits: "1.25e1", "1e-7".
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let k = digits.len() as i32;
    let n = exp.parse::<i32>().expect("a decimal exponent") + 1;
    if k <= n && n <= 21 {
        format!("{sign}{digits}{}", "0".repeat((n - k) as usize))
    } else if 0 < n && n <= 21 {
        format!("{sign}{}.{}", &digits[..n as usize], &digits[n as usize..])
    } else if -6 < n && n <= 0 {
        format!("{sign}0.{}{digits}", "0".repeat((-n) as usize))
    } else {
        let e = n - 1;
        let rest = if k > 1 {
            format!(".{}", &digits[1..])
        } else {
            String::new()
        };
        format!(
            "{sign}{}{rest}e{}{}",
            &digits[..1],
            if e >= 0 { "+" } else { "-" },
            e.abs()
        )
    }
}

fn js_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn to_json(schema: &Schema, values: &[Value]) -> Vec<u8> {
    let mut out = String::from("{");
    for (i, (field, value)) in schema.fields.iter().zip(values).enumerate() {
        if i > 0 {
            out.push(',');
        }
        js_string(&mut out, &field.name);
        out.push(':');
        match value {
            Value::Int(v) => out.push_str(&v.to_string()),
            Value::Float(f) => out.push_str(&js_number(*f)),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Str(s) if field.ty == FieldType::Uuid => js_string(
                &mut out,
                &uuid::Uuid::parse_str(s)
                    .expect("checked")
                    .hyphenated()
                    .to_string(),
            ),
            Value::Str(s) => js_string(&mut out, s),
        }
    }
    out.push('}');
    out.into_bytes()
}

fn from_json(schema: &Schema, body: &[u8]) -> Result<Vec<Value>, BusError> {
    let parsed: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| BusError::UnreadableBody(format!("not JSON: {e}")))?;
    let object = parsed
        .as_object()
        .ok_or_else(|| BusError::UnreadableBody(format!("a {} is a JSON object", schema.name)))?;
    schema
        .fields
        .iter()
        .map(|field| {
            let v = object.get(&field.name).ok_or_else(|| {
                BusError::UnreadableBody(format!("{}.{} is missing", schema.name, field.name))
            })?;
            let wrong = || {
                BusError::UnreadableBody(format!(
                    "{}.{} is not a {:?}: {v}",
                    schema.name, field.name, field.ty
                ))
            };
            Ok(match field.ty {
                FieldType::Int => Value::Int(v.as_i64().ok_or_else(wrong)?),
                FieldType::Float => Value::Float(v.as_f64().ok_or_else(wrong)?),
                FieldType::Bool => Value::Bool(v.as_bool().ok_or_else(wrong)?),
                FieldType::String | FieldType::Uuid => {
                    Value::Str(v.as_str().ok_or_else(wrong)?.to_string())
                }
            })
        })
        .collect()
}

// -- MessagePack --------------------------------------------------------------------------------

fn mp_str(out: &mut Vec<u8>, s: &str) {
    let n = s.len();
    if n < 32 {
        out.push(0xa0 | n as u8);
    } else if n < 256 {
        out.extend_from_slice(&[0xd9, n as u8]);
    } else if n < 65536 {
        out.push(0xda);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
    out.extend_from_slice(s.as_bytes());
}

fn mp_int(out: &mut Vec<u8>, v: i64) {
    if (0..128).contains(&v) {
        out.push(v as u8);
    } else if v >= 0 {
        let u = v as u64;
        if u < 1 << 8 {
            out.extend_from_slice(&[0xcc, u as u8]);
        } else if u < 1 << 16 {
            out.push(0xcd);
            out.extend_from_slice(&(u as u16).to_be_bytes());
        } else if u < 1 << 32 {
            out.push(0xce);
            out.extend_from_slice(&(u as u32).to_be_bytes());
        } else {
            out.push(0xcf);
            out.extend_from_slice(&u.to_be_bytes());
        }
    } else if v >= -32 {
        out.push(v as i8 as u8);
    } else if v >= i8::MIN as i64 {
        out.extend_from_slice(&[0xd0, v as i8 as u8]);
    } else if v >= i16::MIN as i64 {
        out.push(0xd1);
        out.extend_from_slice(&(v as i16).to_be_bytes());
    } else if v >= i32::MIN as i64 {
        out.push(0xd2);
        out.extend_from_slice(&(v as i32).to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

fn to_msgpack(schema: &Schema, values: &[Value]) -> Vec<u8> {
    assert!(
        schema.fields.len() < 16,
        "schemas are checked to fit a fixmap"
    );
    let mut out = vec![0x80 | schema.fields.len() as u8];
    for (field, value) in schema.fields.iter().zip(values) {
        mp_str(&mut out, &field.name);
        match value {
            Value::Int(v) => mp_int(&mut out, *v),
            Value::Float(f) => {
                out.push(0xcb);
                out.extend_from_slice(&f.to_be_bytes());
            }
            Value::Bool(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
            Value::Str(s) if field.ty == FieldType::Uuid => mp_str(
                &mut out,
                &uuid::Uuid::parse_str(s)
                    .expect("checked")
                    .hyphenated()
                    .to_string(),
            ),
            Value::Str(s) => mp_str(&mut out, s),
        }
    }
    out
}

struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], BusError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        let end = end.ok_or_else(|| BusError::UnreadableBody("the body ends early".into()))?;
        let out = &self.data[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn byte(&mut self) -> Result<u8, BusError> {
        Ok(self.take(1)?[0])
    }

    fn be(&mut self, n: usize) -> Result<u64, BusError> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, &b| acc << 8 | b as u64))
    }
}

#[derive(Debug)]
enum Mp {
    Int(i128),
    Float(f64),
    Bool(bool),
    Str(String),
    Other,
}

fn mp_value(c: &mut Cursor) -> Result<Mp, BusError> {
    let tag = c.byte()?;
    Ok(match tag {
        0x00..=0x7f => Mp::Int(tag as i128),
        0xe0..=0xff => Mp::Int(tag as i8 as i128),
        0xcc => Mp::Int(c.be(1)? as i128),
        0xcd => Mp::Int(c.be(2)? as i128),
        0xce => Mp::Int(c.be(4)? as i128),
        0xcf => Mp::Int(c.be(8)? as i128),
        0xd0 => Mp::Int(c.be(1)? as u8 as i8 as i128),
        0xd1 => Mp::Int(c.be(2)? as u16 as i16 as i128),
        0xd2 => Mp::Int(c.be(4)? as u32 as i32 as i128),
        0xd3 => Mp::Int(c.be(8)? as i64 as i128),
        0xca => Mp::Float(f32::from_bits(c.be(4)? as u32) as f64),
        0xcb => Mp::Float(f64::from_bits(c.be(8)?)),
        0xc2 => Mp::Bool(false),
        0xc3 => Mp::Bool(true),
        0xa0..=0xbf | 0xd9 | 0xda | 0xdb => {
            let n = match tag {
                0xd9 => c.be(1)?,
                0xda => c.be(2)?,
                0xdb => c.be(4)?,
                _ => (tag & 0x1f) as u64,
            };
            let raw = c.take(n as usize)?;
            Mp::Str(
                std::str::from_utf8(raw)
                    .map_err(|_| {
                        BusError::UnreadableBody("a MessagePack string is not UTF-8".into())
                    })?
                    .to_string(),
            )
        }
        _ => Mp::Other,
    })
}

fn from_msgpack(schema: &Schema, body: &[u8]) -> Result<Vec<Value>, BusError> {
    let mut c = Cursor { data: body, pos: 0 };
    let tag = c.byte()?;
    let count = match tag {
        0x80..=0x8f => (tag & 0x0f) as u64,
        0xde => c.be(2)?,
        0xdf => c.be(4)?,
        _ => {
            return Err(BusError::UnreadableBody(format!(
                "a {} is a MessagePack map",
                schema.name
            )))
        }
    };
    let mut found: Vec<Option<Value>> = vec![None; schema.fields.len()];
    for _ in 0..count {
        let Mp::Str(name) = mp_value(&mut c)? else {
            return Err(BusError::UnreadableBody(
                "MessagePack map keys are strings here".into(),
            ));
        };
        let value = mp_value(&mut c)?;
        let Some(i) = schema.fields.iter().position(|f| f.name == name) else {
            if matches!(value, Mp::Other) {
                return Err(BusError::UnreadableBody(format!(
                    "field {name:?} has a value this bus does not read"
                )));
            }
            continue;
        };
        let field = &schema.fields[i];
        let wrong = || {
            BusError::UnreadableBody(format!(
                "{}.{} is not a {:?}",
                schema.name, field.name, field.ty
            ))
        };
        found[i] = Some(match (field.ty, value) {
            (FieldType::Int, Mp::Int(v)) => Value::Int(i64::try_from(v).map_err(|_| wrong())?),
            (FieldType::Float, Mp::Float(f)) => Value::Float(f),
            (FieldType::Float, Mp::Int(v)) => Value::Float(v as f64),
            (FieldType::Bool, Mp::Bool(b)) => Value::Bool(b),
            (FieldType::String | FieldType::Uuid, Mp::Str(s)) => Value::Str(s),
            _ => return Err(wrong()),
        });
    }
    if c.pos != body.len() {
        return Err(BusError::UnreadableBody(
            "bytes after the MessagePack map".into(),
        ));
    }
    missing(schema, found)
}

fn missing(schema: &Schema, found: Vec<Option<Value>>) -> Result<Vec<Value>, BusError> {
    found
        .into_iter()
        .zip(&schema.fields)
        .map(|(v, f)| {
            v.ok_or_else(|| {
                BusError::UnreadableBody(format!("{}.{} is missing", schema.name, f.name))
            })
        })
        .collect()
}

// -- Protobuf -----------------------------------------------------------------------------------

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn to_protobuf(schema: &Schema, values: &[Value]) -> Vec<u8> {
    let mut order: Vec<usize> = (0..schema.fields.len()).collect();
    order.sort_by_key(|&i| schema.fields[i].number);
    let mut out = Vec::new();
    for i in order {
        let number = schema.fields[i].number as u64;
        match &values[i] {
            Value::Int(0) | Value::Bool(false) => {}
            Value::Float(f) if *f == 0.0 && f.is_sign_positive() => {}
            Value::Str(s) if s.is_empty() => {}
            Value::Int(v) => {
                varint(&mut out, number << 3);
                varint(&mut out, *v as u64);
            }
            Value::Bool(_) => {
                varint(&mut out, number << 3);
                out.push(1);
            }
            Value::Float(f) => {
                varint(&mut out, number << 3 | 1);
                out.extend_from_slice(&f.to_le_bytes());
            }
            Value::Str(s) => {
                let text = if schema.fields[i].ty == FieldType::Uuid {
                    uuid::Uuid::parse_str(s)
                        .expect("checked")
                        .hyphenated()
                        .to_string()
                } else {
                    s.clone()
                };
                varint(&mut out, number << 3 | 2);
                varint(&mut out, text.len() as u64);
                out.extend_from_slice(text.as_bytes());
            }
        }
    }
    out
}

fn read_varint(c: &mut Cursor) -> Result<u64, BusError> {
    let mut v = 0u64;
    for shift in (0..70).step_by(7) {
        let b = c.byte()?;
        if shift == 63 && b > 1 {
            return Err(BusError::UnreadableBody(
                "a Protobuf varint overflows 64 bits".into(),
            ));
        }
        v |= ((b & 0x7f) as u64) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(BusError::UnreadableBody(
        "a Protobuf varint is longer than 10 bytes".into(),
    ))
}

fn from_protobuf(schema: &Schema, body: &[u8]) -> Result<Vec<Value>, BusError> {
    let mut found = protobuf_defaults(schema);
    let mut c = Cursor { data: body, pos: 0 };
    while c.pos < body.len() {
        let tag = read_varint(&mut c)?;
        let (number, wire) = (tag >> 3, tag & 7);
        match schema.fields.iter().position(|f| f.number as u64 == number) {
            Some(i) => found[i] = Some(read_protobuf_field(&mut c, schema, i, wire)?),
            // Unknown fields are skipped, as Protobuf readers do.
            None => skip_protobuf_field(&mut c, wire)?,
        }
    }
    missing(schema, found)
}

/// Proto3 leaves fields at their default value off the wire: every field starts at it.
fn protobuf_defaults(schema: &Schema) -> Vec<Option<Value>> {
    schema
        .fields
        .iter()
        .map(|f| {
            Some(match f.ty {
                FieldType::Int => Value::Int(0),
                FieldType::Float => Value::Float(0.0),
                FieldType::Bool => Value::Bool(false),
                FieldType::String | FieldType::Uuid => Value::Str(String::new()),
            })
        })
        .collect()
}

/// The value of the schema's field `i`, sent with wire type `wire`, which must suit its type.
fn read_protobuf_field(
    c: &mut Cursor<'_>,
    schema: &Schema,
    i: usize,
    wire: u64,
) -> Result<Value, BusError> {
    let wrong = |name: &str| {
        BusError::UnreadableBody(format!(
            "{}.{name} has the wrong Protobuf wire type {wire}",
            schema.name
        ))
    };
    match wire {
        0 => {
            let v = read_varint(c)?;
            Ok(match schema.fields[i].ty {
                FieldType::Int => Value::Int(v as i64),
                FieldType::Bool => Value::Bool(v != 0),
                _ => return Err(wrong(&schema.fields[i].name)),
            })
        }
        1 => {
            let bits = u64::from_le_bytes(c.take(8)?.try_into().expect("8 bytes"));
            if schema.fields[i].ty != FieldType::Float {
                return Err(wrong(&schema.fields[i].name));
            }
            Ok(Value::Float(f64::from_bits(bits)))
        }
        2 => {
            let n = read_varint(c)?;
            let raw = c.take(usize::try_from(n).map_err(|_| wrong(&schema.fields[i].name))?)?;
            if !matches!(schema.fields[i].ty, FieldType::String | FieldType::Uuid) {
                return Err(wrong(&schema.fields[i].name));
            }
            let s = std::str::from_utf8(raw).map_err(|_| {
                BusError::UnreadableBody(format!(
                    "{}.{} is not UTF-8",
                    schema.name, schema.fields[i].name
                ))
            })?;
            Ok(Value::Str(s.to_string()))
        }
        _ => Err(wrong(&schema.fields[i].name)),
    }
}

/// Steps over a field the schema does not name.
fn skip_protobuf_field(c: &mut Cursor<'_>, wire: u64) -> Result<(), BusError> {
    match wire {
        0 => {
            read_varint(c)?;
        }
        1 => {
            c.take(8)?;
        }
        2 => {
            let n = read_varint(c)?;
            c.take(
                usize::try_from(n)
                    .map_err(|_| BusError::UnreadableBody("a length overflows".into()))?,
            )?;
        }
        5 => {
            c.take(4)?;
        }
        w => {
            return Err(BusError::UnreadableBody(format!(
                "Protobuf wire type {w} is not read here"
            )))
        }
    }
    Ok(())
}
