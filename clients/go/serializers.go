package ferrymq

import (
	"bytes"
	"compress/flate"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
	"google.golang.org/protobuf/encoding/protowire"
)

// Serializer turns a bus message's field values into a body and back. Values are int64,
// float64, string, bool or UUID, in the schema's field order.
type Serializer interface {
	Name() string
	Marshal(s *Schema, values []any) ([]byte, error)
	Unmarshal(s *Schema, body []byte) ([]any, error)
}

// Serializers holds serializers by the name carried in the x-bus-serializer header.
type Serializers struct{ byName map[string]Serializer }

// DefaultSerializers knows json, deflate-json, msgpack and protobuf.
func DefaultSerializers() *Serializers {
	s := &Serializers{byName: map[string]Serializer{}}
	for _, x := range []Serializer{JSONSerializer{}, DeflateJSONSerializer{}, MsgpackSerializer{}, ProtobufSerializer{}} {
		s.Add(x)
	}
	return s
}

// Add adds or replaces a serializer.
func (s *Serializers) Add(x Serializer) { s.byName[x.Name()] = x }

// Names lists the known names.
func (s *Serializers) Names() []string {
	var out []string
	for n := range s.byName {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Get returns a serializer; an unknown name matches ErrUnknownSerializer.
func (s *Serializers) Get(name string) (Serializer, error) {
	if x, ok := s.byName[name]; ok {
		return x, nil
	}
	return nil, fmt.Errorf("%w %q; known: %s", ErrUnknownSerializer, name, strings.Join(s.Names(), ", "))
}

// ---- json

// JSONSerializer writes canonical JSON: declaration order, no spaces, ECMAScript number and
// string forms.
type JSONSerializer struct{}

// Name is "json".
func (JSONSerializer) Name() string { return "json" }

// jsNumber is ECMAScript Number::toString of a finite double.
func jsNumber(x float64) string {
	if x == 0 {
		return "0"
	}
	sign := ""
	if x < 0 {
		sign, x = "-", -x
	}
	e := strconv.FormatFloat(x, 'e', -1, 64) // d.ddde±XX
	mant, expText, _ := strings.Cut(e, "e")
	digits := strings.TrimRight(strings.Replace(mant, ".", "", 1), "0")
	if digits == "" {
		digits = "0"
	}
	exp, _ := strconv.Atoi(expText)
	n, k := exp+1, len(digits)
	switch {
	case k <= n && n <= 21:
		return sign + digits + strings.Repeat("0", n-k)
	case 0 < n && n <= 21:
		return sign + digits[:n] + "." + digits[n:]
	case -6 < n && n <= 0:
		return sign + "0." + strings.Repeat("0", -n) + digits
	}
	m := digits[:1]
	if k > 1 {
		m += "." + digits[1:]
	}
	if n-1 >= 0 {
		return fmt.Sprintf("%s%se+%d", sign, m, n-1)
	}
	return fmt.Sprintf("%s%se-%d", sign, m, -(n - 1))
}

// jsString is JSON.stringify of a string: only ", \ and control characters are escaped.
func jsString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			if r < 0x20 {
				fmt.Fprintf(b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// Marshal writes the canonical JSON object.
func (JSONSerializer) Marshal(s *Schema, values []any) ([]byte, error) {
	var b strings.Builder
	b.WriteByte('{')
	for i, f := range s.Fields {
		if i > 0 {
			b.WriteByte(',')
		}
		jsString(&b, f.Name)
		b.WriteByte(':')
		switch v := values[i].(type) {
		case int64:
			b.WriteString(strconv.FormatInt(v, 10))
		case float64:
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, busErr("%s.%s: NaN and infinities cannot be sent", s.Name, f.Name)
			}
			b.WriteString(jsNumber(v))
		case bool:
			b.WriteString(strconv.FormatBool(v))
		case UUID:
			b.WriteString(`"` + v.String() + `"`)
		case string:
			if !utf8.ValidString(v) {
				return nil, busErr("%s.%s is not UTF-8", s.Name, f.Name)
			}
			jsString(&b, v)
		}
	}
	b.WriteByte('}')
	return []byte(b.String()), nil
}

// Unmarshal reads a JSON object with every field of the schema.
func (JSONSerializer) Unmarshal(s *Schema, body []byte) ([]any, error) {
	if !utf8.Valid(body) {
		return nil, unreadable("not JSON: not UTF-8")
	}
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	var obj map[string]any
	if err := d.Decode(&obj); err != nil {
		return nil, unreadable("not a JSON object: %v", err)
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, unreadable("not JSON: data after the object")
	}
	return fromMapping(s, func(name string) (any, bool) { v, ok := obj[name]; return v, ok })
}

// checkValue converts a decoded value (json.Number, the msgpack types...) to a field's type.
func checkValue(s *Schema, f SchemaField, v any) (any, error) {
	where := s.Name + "." + f.Name
	switch f.Type {
	case FieldInt:
		switch x := v.(type) {
		case json.Number:
			n, err := strconv.ParseInt(string(x), 10, 64)
			if err != nil {
				return nil, unreadable("%s is an int, got %s", where, x)
			}
			return n, nil
		case int8, int16, int32, int64:
			return toInt64(x), nil
		case uint8, uint16, uint32, uint64:
			u := toUint64(x)
			if u > math.MaxInt64 {
				return nil, unreadable("%s = %d does not fit a signed 64-bit integer", where, u)
			}
			return int64(u), nil
		}
	case FieldFloat:
		switch x := v.(type) {
		case json.Number:
			f, err := strconv.ParseFloat(string(x), 64)
			if err != nil || math.IsInf(f, 0) {
				return nil, unreadable("%s is a float, got %s", where, x)
			}
			return f, nil
		case float64:
			return x, nil
		case float32:
			return float64(x), nil
		case int8, int16, int32, int64:
			return float64(toInt64(x)), nil
		case uint8, uint16, uint32, uint64:
			return float64(toUint64(x)), nil
		}
	case FieldString:
		if x, ok := v.(string); ok {
			return x, nil
		}
	case FieldBool:
		if x, ok := v.(bool); ok {
			return x, nil
		}
	case FieldUUID:
		if x, ok := v.(string); ok {
			u, err := ParseUUID(x)
			if err != nil {
				return nil, unreadable("%s: %v", where, err)
			}
			return u, nil
		}
	}
	return nil, unreadable("%s is a %s, got %T", where, f.Type, v)
}

func toInt64(v any) int64 {
	switch x := v.(type) {
	case int8:
		return int64(x)
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case int64:
		return x
	}
	return 0
}

func toUint64(v any) uint64 {
	switch x := v.(type) {
	case uint8:
		return uint64(x)
	case uint16:
		return uint64(x)
	case uint32:
		return uint64(x)
	case uint64:
		return x
	}
	return 0
}

func fromMapping(s *Schema, get func(string) (any, bool)) ([]any, error) {
	out := make([]any, len(s.Fields))
	for i, f := range s.Fields {
		v, ok := get(f.Name)
		if !ok {
			return nil, unreadable("%s.%s is missing", s.Name, f.Name)
		}
		x, err := checkValue(s, f, v)
		if err != nil {
			return nil, err
		}
		out[i] = x
	}
	return out, nil
}

// ---- deflate-json

// DeflateJSONSerializer is the canonical JSON as raw DEFLATE (RFC 1951).
type DeflateJSONSerializer struct{}

// InflatedBytesMax bounds what a deflate-json body may inflate to.
const InflatedBytesMax = 64 << 20

// Name is "deflate-json".
func (DeflateJSONSerializer) Name() string { return "deflate-json" }

// Marshal compresses the JSON at level 9.
func (DeflateJSONSerializer) Marshal(s *Schema, values []any) ([]byte, error) {
	j, err := JSONSerializer{}.Marshal(s, values)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	w, _ := flate.NewWriter(&b, 9)
	w.Write(j)
	w.Close()
	return b.Bytes(), nil
}

// Unmarshal inflates (at most InflatedBytesMax bytes) and reads the JSON.
func (DeflateJSONSerializer) Unmarshal(s *Schema, body []byte) ([]any, error) {
	r := flate.NewReader(bytes.NewReader(body))
	defer r.Close()
	data, err := io.ReadAll(io.LimitReader(r, InflatedBytesMax+1))
	if err != nil {
		return nil, unreadable("not raw DEFLATE: %v", err)
	}
	if len(data) > InflatedBytesMax {
		return nil, unreadable("inflates to more than %d bytes", InflatedBytesMax)
	}
	return JSONSerializer{}.Unmarshal(s, data)
}

// ---- msgpack

// MsgpackSerializer writes a MessagePack map in declaration order.
type MsgpackSerializer struct{}

// Name is "msgpack".
func (MsgpackSerializer) Name() string { return "msgpack" }

// Marshal writes ints in their smallest form, floats as float64, UUIDs as strings.
func (MsgpackSerializer) Marshal(s *Schema, values []any) ([]byte, error) {
	var b bytes.Buffer
	e := msgpack.NewEncoder(&b)
	if err := e.EncodeMapLen(len(s.Fields)); err != nil {
		return nil, err
	}
	for i, f := range s.Fields {
		e.EncodeString(f.Name)
		var err error
		switch v := values[i].(type) {
		case int64:
			err = e.EncodeInt(v)
		case float64:
			err = e.EncodeFloat64(v)
		case bool:
			err = e.EncodeBool(v)
		case string:
			err = e.EncodeString(v)
		case UUID:
			err = e.EncodeString(v.String())
		}
		if err != nil {
			return nil, err
		}
	}
	return b.Bytes(), nil
}

// Unmarshal reads a map with every field of the schema.
func (MsgpackSerializer) Unmarshal(s *Schema, body []byte) (out []any, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, unreadable("not MessagePack: %v", r)
		}
	}()
	d := msgpack.NewDecoder(bytes.NewReader(body))
	n, err := d.DecodeMapLen()
	if err != nil {
		return nil, unreadable("not a MessagePack map: %v", err)
	}
	if n < 0 || n > len(body) {
		return nil, unreadable("not a MessagePack map")
	}
	m := make(map[string]any, n)
	for i := 0; i < n; i++ {
		// Only strings and scalars are read: the library sets memory aside for the length a
		// container, bin or ext announces before checking the body holds it.
		if c, err := d.PeekCode(); err != nil || !msgpackString(c) {
			return nil, unreadable("MessagePack map key is not a string")
		}
		k, err := d.DecodeString()
		if err != nil {
			return nil, unreadable("MessagePack map key: %v", err)
		}
		if c, err := d.PeekCode(); err != nil || !(msgpackString(c) || msgpackScalar(c)) {
			return nil, unreadable("MessagePack value of %q is not a string, number or bool", k)
		}
		v, err := d.DecodeInterface()
		if err != nil {
			return nil, unreadable("MessagePack value of %q: %v", k, err)
		}
		m[k] = v
	}
	if _, err := d.PeekCode(); err != io.EOF {
		return nil, unreadable("not MessagePack: data after the map")
	}
	return fromMapping(s, func(name string) (any, bool) { v, ok := m[name]; return v, ok })
}

// msgpackString: fixstr, str8, str16, str32.
func msgpackString(c byte) bool { return c >= 0xa0 && c <= 0xbf || c >= 0xd9 && c <= 0xdb }

// msgpackScalar: fixints, nil, bool, float32/64, uint8..64, int8..64.
func msgpackScalar(c byte) bool {
	return c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3 || c >= 0xca && c <= 0xd3
}

// ---- protobuf

// ProtobufSerializer writes proto3 with implicit presence: fields in number order, defaults
// left out.
type ProtobufSerializer struct{}

// Name is "protobuf".
func (ProtobufSerializer) Name() string { return "protobuf" }

func byNumber(s *Schema) []int {
	idx := make([]int, len(s.Fields))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return s.Fields[idx[a]].Number < s.Fields[idx[b]].Number })
	return idx
}

// Marshal writes int64 as varint, float as double, string and UUID as string, bool as varint.
func (ProtobufSerializer) Marshal(s *Schema, values []any) ([]byte, error) {
	var b []byte
	for _, i := range byNumber(s) {
		num := protowire.Number(s.Fields[i].Number)
		switch v := values[i].(type) {
		case int64:
			if v != 0 {
				b = protowire.AppendTag(b, num, protowire.VarintType)
				b = protowire.AppendVarint(b, uint64(v))
			}
		case float64:
			if v != 0 || math.Signbit(v) {
				b = protowire.AppendTag(b, num, protowire.Fixed64Type)
				b = protowire.AppendFixed64(b, math.Float64bits(v))
			}
		case bool:
			if v {
				b = protowire.AppendTag(b, num, protowire.VarintType)
				b = protowire.AppendVarint(b, 1)
			}
		case string:
			if !utf8.ValidString(v) {
				return nil, busErr("%s.%s is not UTF-8", s.Name, s.Fields[i].Name)
			}
			if v != "" {
				b = protowire.AppendTag(b, num, protowire.BytesType)
				b = protowire.AppendString(b, v)
			}
		case UUID:
			b = protowire.AppendTag(b, num, protowire.BytesType)
			b = protowire.AppendString(b, v.String())
		}
	}
	return b, nil
}

// Unmarshal reads the fields, skipping unknown ones; missing fields take their defaults.
func (ProtobufSerializer) Unmarshal(s *Schema, body []byte) ([]any, error) {
	out := make([]any, len(s.Fields))
	for i, f := range s.Fields {
		switch f.Type {
		case FieldInt:
			out[i] = int64(0)
		case FieldFloat:
			out[i] = float64(0)
		case FieldBool:
			out[i] = false
		case FieldString:
			out[i] = ""
		case FieldUUID:
			out[i] = nil
		}
	}
	byNum := map[protowire.Number]int{}
	for i, f := range s.Fields {
		byNum[protowire.Number(f.Number)] = i
	}
	for len(body) > 0 {
		num, typ, n := protowire.ConsumeTag(body)
		if n < 0 {
			return nil, unreadable("not a %s in Protobuf: %v", s.Name, protowire.ParseError(n))
		}
		body = body[n:]
		i, known := byNum[num]
		want := protowire.Type(-1)
		if known {
			switch s.Fields[i].Type {
			case FieldInt, FieldBool:
				want = protowire.VarintType
			case FieldFloat:
				want = protowire.Fixed64Type
			default:
				want = protowire.BytesType
			}
		}
		if !known || typ != want {
			m := protowire.ConsumeFieldValue(num, typ, body)
			if m < 0 {
				return nil, unreadable("not a %s in Protobuf: %v", s.Name, protowire.ParseError(m))
			}
			if known {
				return nil, unreadable("%s.%s has wire type %d", s.Name, s.Fields[i].Name, typ)
			}
			body = body[m:]
			continue
		}
		switch want {
		case protowire.VarintType:
			v, m := protowire.ConsumeVarint(body)
			if m < 0 {
				return nil, unreadable("not a %s in Protobuf: %v", s.Name, protowire.ParseError(m))
			}
			body = body[m:]
			if s.Fields[i].Type == FieldBool {
				out[i] = v != 0
			} else {
				out[i] = int64(v)
			}
		case protowire.Fixed64Type:
			v, m := protowire.ConsumeFixed64(body)
			if m < 0 {
				return nil, unreadable("not a %s in Protobuf: %v", s.Name, protowire.ParseError(m))
			}
			body = body[m:]
			out[i] = math.Float64frombits(v)
		default:
			v, m := protowire.ConsumeString(body)
			if m < 0 {
				return nil, unreadable("not a %s in Protobuf: %v", s.Name, protowire.ParseError(m))
			}
			body = body[m:]
			if !utf8.ValidString(v) {
				return nil, unreadable("%s.%s is not UTF-8", s.Name, s.Fields[i].Name)
			}
			if s.Fields[i].Type == FieldUUID {
				u, err := ParseUUID(v)
				if err != nil {
					return nil, unreadable("%s.%s: %v", s.Name, s.Fields[i].Name, err)
				}
				out[i] = u
			} else {
				out[i] = v
			}
		}
	}
	for i, f := range s.Fields {
		if out[i] == nil {
			return nil, unreadable("%s.%s (a UUID) is missing", s.Name, f.Name)
		}
	}
	return out, nil
}
