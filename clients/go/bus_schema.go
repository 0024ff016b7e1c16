package ferrymq

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"sync"
)

// BusError is a bus misconfiguration or a value the bus cannot carry.
type BusError struct{ Msg string }

func (e *BusError) Error() string { return "ferrymq bus: " + e.Msg }

func busErr(format string, args ...any) error { return &BusError{Msg: fmt.Sprintf(format, args...)} }

// UUID is a bus field of type uuid; it travels as its lowercase 36-character form.
type UUID [16]byte

// String is the lowercase hyphenated form.
func (u UUID) String() string {
	h := hex.EncodeToString(u[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// ParseUUID reads the hyphenated 36-character form (any case).
func ParseUUID(s string) (UUID, error) {
	var u UUID
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return u, fmt.Errorf("%q is not a UUID", s)
	}
	h := s[0:8] + s[9:13] + s[14:18] + s[19:23] + s[24:36]
	if _, err := hex.Decode(u[:], []byte(h)); err != nil {
		return u, fmt.Errorf("%q is not a UUID", s)
	}
	return u, nil
}

// FieldType is the type of a bus field.
type FieldType int

// Bus field types.
const (
	FieldInt FieldType = iota
	FieldFloat
	FieldString
	FieldBool
	FieldUUID
)

var fieldTypeNames = []string{"int", "float", "string", "bool", "uuid"}

func (t FieldType) String() string { return fieldTypeNames[t] }

// SchemaField is one field of a bus message type.
type SchemaField struct {
	Name   string
	Type   FieldType
	Number int
	index  int
}

// Schema describes a bus message type: a Go struct whose exported fields carry a `bus` tag,
// `bus:"order_id,key"` for the key field. Field types: signed integers (int), float64 (float),
// string, bool, UUID (uuid). Fields are numbered 1, 2, ... in declaration order for Protobuf
// unless the tag says `number=N`. The type's name is the struct's name, or what a BusType()
// string method returns; its topic is the name, or what a BusTopic() string method returns.
type Schema struct {
	Name   string
	Topic  string
	Fields []SchemaField
	Key    int
	typ    reflect.Type
}

var schemaCache sync.Map

// SchemaOf returns the schema of a struct type.
func SchemaOf(t reflect.Type) (*Schema, error) {
	if s, ok := schemaCache.Load(t); ok {
		return s.(*Schema), nil
	}
	if t.Kind() != reflect.Struct {
		return nil, busErr("a bus message type is a struct, got %v", t)
	}
	s := &Schema{Name: t.Name(), Key: -1, typ: t}
	zero := reflect.New(t).Elem().Interface()
	if n, ok := zero.(interface{ BusType() string }); ok {
		s.Name = n.BusType()
	}
	if n, ok := zero.(interface{ BusTopic() string }); ok {
		s.Topic = n.BusTopic()
	}
	if s.Name == "" {
		return nil, busErr("%v has no name", t)
	}
	numbers := map[int]bool{}
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		tag, ok := sf.Tag.Lookup("bus")
		if !ok || tag == "-" || !sf.IsExported() {
			continue
		}
		parts := strings.Split(tag, ",")
		f := SchemaField{Name: parts[0], Number: len(s.Fields) + 1, index: i}
		if f.Name == "" {
			f.Name = sf.Name
		}
		isKey := false
		for _, p := range parts[1:] {
			switch {
			case p == "key":
				isKey = true
			case strings.HasPrefix(p, "number="):
				n, err := strconv.Atoi(strings.TrimPrefix(p, "number="))
				if err != nil || n < 1 || n > 536870911 {
					return nil, busErr("%v.%s: bad field number %q", t, sf.Name, p)
				}
				f.Number = n
			default:
				return nil, busErr("%v.%s: unknown tag option %q", t, sf.Name, p)
			}
		}
		switch {
		case sf.Type == reflect.TypeOf(UUID{}):
			f.Type = FieldUUID
		case sf.Type.Kind() >= reflect.Int && sf.Type.Kind() <= reflect.Int64:
			f.Type = FieldInt
		case sf.Type.Kind() == reflect.Float64:
			f.Type = FieldFloat
		case sf.Type.Kind() == reflect.String:
			f.Type = FieldString
		case sf.Type.Kind() == reflect.Bool:
			f.Type = FieldBool
		default:
			return nil, busErr("%v.%s: type %v is not a bus field type (signed int, float64, string, bool, UUID)", t, sf.Name, sf.Type)
		}
		if numbers[f.Number] {
			return nil, busErr("%v: field number %d twice", t, f.Number)
		}
		numbers[f.Number] = true
		if isKey {
			if s.Key >= 0 {
				return nil, busErr("%v: two key fields", t)
			}
			if f.Type == FieldFloat || f.Type == FieldBool {
				return nil, busErr("%v.%s: a key is an int, a string or a UUID", t, sf.Name)
			}
			s.Key = len(s.Fields)
		}
		s.Fields = append(s.Fields, f)
	}
	if len(s.Fields) == 0 {
		return nil, busErr("%v has no `bus` fields", t)
	}
	if s.Key < 0 {
		return nil, busErr("%v has no key field (tag `bus:\"name,key\"`)", t)
	}
	schemaCache.Store(t, s)
	return s, nil
}

// values reads a struct's field values: int64, float64, string, bool or UUID.
func (s *Schema) values(v reflect.Value) ([]any, error) {
	out := make([]any, len(s.Fields))
	for i, f := range s.Fields {
		fv := v.Field(f.index)
		switch f.Type {
		case FieldInt:
			out[i] = fv.Int()
		case FieldFloat:
			x := fv.Float()
			if math.IsNaN(x) || math.IsInf(x, 0) {
				return nil, busErr("%s.%s = %v: NaN and infinities cannot be sent", s.Name, f.Name, x)
			}
			out[i] = x
		case FieldString:
			out[i] = fv.String()
		case FieldBool:
			out[i] = fv.Bool()
		case FieldUUID:
			out[i] = fv.Interface().(UUID)
		}
	}
	return out, nil
}

// build makes a struct value from field values.
func (s *Schema) build(vals []any) (reflect.Value, error) {
	v := reflect.New(s.typ).Elem()
	for i, f := range s.Fields {
		fv := v.Field(f.index)
		switch f.Type {
		case FieldInt:
			n := vals[i].(int64)
			if fv.OverflowInt(n) {
				return v, busErr("%s.%s = %d does not fit %v", s.Name, f.Name, n, fv.Type())
			}
			fv.SetInt(n)
		case FieldFloat:
			fv.SetFloat(vals[i].(float64))
		case FieldString:
			fv.SetString(vals[i].(string))
		case FieldBool:
			fv.SetBool(vals[i].(bool))
		case FieldUUID:
			fv.Set(reflect.ValueOf(vals[i].(UUID)))
		}
	}
	return v, nil
}

// KeyBytes is the bytes a key travels as: decimal ASCII for an int, UTF-8 for a string, the
// 36-character form for a UUID.
func KeyBytes(key any) ([]byte, error) {
	switch k := key.(type) {
	case int64:
		return []byte(strconv.FormatInt(k, 10)), nil
	case int:
		return []byte(strconv.Itoa(k)), nil
	case string:
		return []byte(k), nil
	case UUID:
		return []byte(k.String()), nil
	}
	return nil, busErr("a key is an int, a string or a UUID, got %T", key)
}

// PartitionForKey is the broker's partition rule: 1..=20 ASCII digits that fit a u64 give
// that number mod n; any other key gives FNV-1a-64 of its bytes mod n.
func PartitionForKey(key []byte, n uint64) uint64 {
	if len(key) >= 1 && len(key) <= 20 {
		digits := true
		for _, b := range key {
			digits = digits && b >= '0' && b <= '9'
		}
		if digits {
			if v, err := strconv.ParseUint(string(key), 10, 64); err == nil {
				return v % n
			}
		}
	}
	h := uint64(0xcbf29ce484222325)
	for _, b := range key {
		h ^= uint64(b)
		h *= 0x100000001b3
	}
	return h % n
}

// ShardForKey is the default shard of a key: the sum of a UUID's 16 bytes mod n, the broker's
// partition rule for ints and strings.
func ShardForKey(key any, n int) (int, error) {
	if n < 1 {
		return 0, busErr("the shard count must be at least 1, got %d", n)
	}
	if u, ok := key.(UUID); ok {
		sum := 0
		for _, b := range u {
			sum += int(b)
		}
		return sum % n, nil
	}
	b, err := KeyBytes(key)
	if err != nil {
		return 0, err
	}
	return int(PartitionForKey(b, uint64(n))), nil
}

var errUnreadable = errors.New("unreadable body")

// UnreadableBodyError is a body its serializer cannot read as the type its headers name.
type UnreadableBodyError struct{ Msg string }

func (e *UnreadableBodyError) Error() string { return "ferrymq bus: unreadable body: " + e.Msg }

// Is matches errUnreadable.
func (e *UnreadableBodyError) Is(t error) bool { return t == errUnreadable }

func unreadable(format string, args ...any) error {
	return &UnreadableBodyError{Msg: fmt.Sprintf(format, args...)}
}
