package ferrymq

import (
	"bytes"
	"compress/flate"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strconv"
	"testing"
)

type OrderPlaced struct {
	OrderID  int64   `bus:"order_id,key"`
	Customer string  `bus:"customer"`
	Total    float64 `bus:"total"`
	Express  bool    `bus:"express"`
}

type UserRenamed struct {
	UserID  UUID   `bus:"user_id,key"`
	Name    string `bus:"name"`
	Version int64  `bus:"version"`
}

type InvoiceIssued struct {
	Invoice     string  `bus:"invoice,key"`
	AmountCents int64   `bus:"amount_cents"`
	Paid        bool    `bus:"paid"`
	Note        string  `bus:"note"`
	Rate        float64 `bus:"rate"`
}

var busTypes = map[string]reflect.Type{
	"OrderPlaced":   reflect.TypeOf(OrderPlaced{}),
	"UserRenamed":   reflect.TypeOf(UserRenamed{}),
	"InvoiceIssued": reflect.TypeOf(InvoiceIssued{}),
}

type busVectorFile struct {
	Headers     map[string]string `json:"headers"`
	Serializers []string          `json:"serializers"`
	Schemas     []struct {
		Name   string `json:"name"`
		Key    string `json:"key"`
		Fields []struct {
			Name   string `json:"name"`
			Type   string `json:"type"`
			Number int    `json:"number"`
		} `json:"fields"`
	} `json:"schemas"`
	Messages []struct {
		Name       string         `json:"name"`
		Type       string         `json:"type"`
		Sender     string         `json:"sender"`
		ShardCount int            `json:"shard_count"`
		Values     map[string]any `json:"values"`
		JSONUTF8   string         `json:"json_utf8"`
		KeyHex     string         `json:"key_hex"`
		Shard      int            `json:"shard"`
		Serialized map[string]struct {
			Hex     string      `json:"hex"`
			Headers [][2]string `json:"headers"`
		} `json:"serialized"`
	} `json:"messages"`
	Shards []struct {
		Kind   string         `json:"kind"`
		Key    any            `json:"key"`
		KeyHex string         `json:"key_hex"`
		Shards map[string]int `json:"shards"`
	} `json:"shards"`
}

// vectorValues reads a vector's values (ints may be decimal strings) as the schema's types.
func vectorValues(t *testing.T, s *Schema, values map[string]any) []any {
	t.Helper()
	out, err := fromMapping(s, func(name string) (any, bool) {
		v, ok := values[name]
		if str, isStr := v.(string); isStr && s.Fields[indexOf(s, name)].Type == FieldInt {
			v = json.Number(str)
		}
		return v, ok
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func indexOf(s *Schema, name string) int {
	for i, f := range s.Fields {
		if f.Name == name {
			return i
		}
	}
	return -1
}

func TestBusVectors(t *testing.T) {
	var f busVectorFile
	loadJSON(t, "bus-vectors.json", &f)
	want := map[string]string{"type": HeaderBusType, "serializer": HeaderBusSerializer, "sender": HeaderBusSender, "shard": HeaderBusShard, "prepared_ms": HeaderBusPrepared, "sent_ms": HeaderBusSent}
	if !reflect.DeepEqual(f.Headers, want) {
		t.Fatalf("headers %v", f.Headers)
	}
	sers := DefaultSerializers()
	if !reflect.DeepEqual(sers.Names(), []string{"deflate-json", "json", "msgpack", "protobuf"}) || len(f.Serializers) != 4 {
		t.Fatalf("serializers %v / %v", sers.Names(), f.Serializers)
	}
	for _, sc := range f.Schemas {
		s, err := SchemaOf(busTypes[sc.Name])
		if err != nil {
			t.Fatal(err)
		}
		if s.Name != sc.Name || s.Fields[s.Key].Name != sc.Key || len(s.Fields) != len(sc.Fields) {
			t.Fatalf("schema %s: %+v", sc.Name, s)
		}
		for i, vf := range sc.Fields {
			if s.Fields[i].Name != vf.Name || s.Fields[i].Type.String() != vf.Type || s.Fields[i].Number != vf.Number {
				t.Fatalf("schema %s field %d: %+v, want %+v", sc.Name, i, s.Fields[i], vf)
			}
		}
	}
	if len(f.Messages) == 0 {
		t.Fatal("no messages")
	}
	for _, m := range f.Messages {
		t.Run(m.Name, func(t *testing.T) {
			s, err := SchemaOf(busTypes[m.Type])
			if err != nil {
				t.Fatal(err)
			}
			vals := vectorValues(t, s, m.Values)
			obj, err := s.build(vals)
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range f.Serializers {
				ser, err := sers.Get(name)
				if err != nil {
					t.Fatal(err)
				}
				b, err := NewBus(nil, BusSettings{Identity: m.Sender, Shards: m.ShardCount, Serializer: name})
				if err != nil {
					t.Fatal(err)
				}
				p, err := Prepare(b, obj.Interface())
				if err != nil {
					t.Fatal(err)
				}
				vec := m.Serialized[name]
				if p.Topic != m.Type || p.Shard != m.Shard || hex.EncodeToString(p.Message.Key) != m.KeyHex {
					t.Fatalf("%s: topic %s shard %d key %x", name, p.Topic, p.Shard, p.Message.Key)
				}
				hs := p.Message.Headers
				if len(hs) != 5 || hs[4].Name != HeaderBusPrepared {
					t.Fatalf("%s: headers %v", name, hs)
				}
				for i, h := range vec.Headers {
					if hs[i].Name != h[0] || hs[i].Value != h[1] {
						t.Fatalf("%s: header %d is %v, want %v", name, i, hs[i], h)
					}
				}
				body := p.Message.Body
				if name == "deflate-json" {
					inflated, err := io.ReadAll(flate.NewReader(bytes.NewReader(body)))
					if err != nil || string(inflated) != m.JSONUTF8 {
						t.Fatalf("deflate-json inflates to %q (%v)", inflated, err)
					}
				} else if hex.EncodeToString(body) != vec.Hex {
					t.Fatalf("%s:\n got %x\nwant %s", name, body, vec.Hex)
				}
				if name == "json" && string(body) != m.JSONUTF8 {
					t.Fatalf("json %s", body)
				}
				// Read the vector's bytes back.
				raw, _ := hex.DecodeString(vec.Hex)
				got, err := ser.Unmarshal(s, raw)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if !reflect.DeepEqual(got, vals) {
					t.Fatalf("%s: read %v, want %v", name, got, vals)
				}
			}
		})
	}
	for _, sv := range f.Shards {
		var key any
		switch sv.Kind {
		case "int":
			var text string
			switch k := sv.Key.(type) {
			case json.Number:
				text = k.String()
			case string:
				text = k
			}
			n, err := strconv.ParseInt(text, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			key = n
		case "string":
			key = sv.Key.(string)
		case "uuid":
			u, err := ParseUUID(sv.Key.(string))
			if err != nil {
				t.Fatal(err)
			}
			key = u
		}
		kb, _ := KeyBytes(key)
		if hex.EncodeToString(kb) != sv.KeyHex {
			t.Errorf("%v: key bytes %x, want %s", sv.Key, kb, sv.KeyHex)
		}
		for count, want := range sv.Shards {
			n, _ := strconv.Atoi(count)
			if got, _ := ShardForKey(key, n); got != want {
				t.Errorf("%s %v with %d shards: %d, want %d", sv.Kind, sv.Key, n, got, want)
			}
		}
	}
}

func TestBusUnreadableBodies(t *testing.T) {
	s, err := SchemaOf(reflect.TypeOf(OrderPlaced{}))
	if err != nil {
		t.Fatal(err)
	}
	sers := DefaultSerializers()
	bad := map[string][][]byte{
		"json":         {[]byte("not json"), []byte(`{"order_id":1}`), []byte(`{"order_id":"x","customer":"","total":1,"express":true}`), []byte(`{"order_id":1.5,"customer":"","total":1,"express":true}`), []byte(`[]`), {0xff}},
		"deflate-json": {[]byte("not deflate"), {}},
		"msgpack":      {{0xc1}, {0x81, 0xa1, 'x'}, {0x90}, []byte("\x84")},
		"protobuf":     {{0xff, 0xff, 0xff}, {0x0a}, {0x08}, {0x12, 0x05, 'a'}},
	}
	for name, bodies := range bad {
		ser, _ := sers.Get(name)
		for _, b := range bodies {
			_, err := ser.Unmarshal(s, b)
			var ue *UnreadableBodyError
			if !errors.As(err, &ue) {
				t.Errorf("%s read %x: %v", name, b, err)
			}
		}
	}
	if _, err := sers.Get("xml"); !errors.Is(err, ErrUnknownSerializer) {
		t.Fatalf("unknown serializer: %v", err)
	}
	if _, err := NewBus(nil, BusSettings{Identity: "x", Shards: 1, Serializer: "xml"}); !errors.Is(err, ErrUnknownSerializer) {
		t.Fatalf("bus with an unknown serializer: %v", err)
	}
}

func TestBusSettings(t *testing.T) {
	env := map[string]string{"FERRYMQ_ADDR": "127.0.0.1:9", "FERRYMQ_BUS_IDENTITY": "billing", "FERRYMQ_BUS_SHARDS": "8",
		"FERRYMQ_BUS_LISTEN_SERVICES": "checkout, accounts", "FERRYMQ_BUS_LISTEN_SHARDS": "1,2,4-7", "FERRYMQ_BUS_SERIALIZER": "msgpack"}
	s, err := LoadBusSettings(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	want := BusSettings{Addr: "127.0.0.1:9", Identity: "billing", Shards: 8, ListenServices: []string{"checkout", "accounts"}, ListenShards: "1,2,4-7", Serializer: "msgpack", TopicTemplate: "{type}"}
	if !reflect.DeepEqual(s, want) {
		t.Fatalf("%+v", s)
	}
	s, err = LoadBusSettings(func(string) (string, bool) { return "", false }, func(s *BusSettings) { s.Shards = 4 })
	if err != nil || s.Shards != 4 || s.Identity != "NoIdentification" || s.Serializer != "json" {
		t.Fatalf("%+v %v", s, err)
	}
	env["FERRYMQ_BUS_LISTEN_SHARDS"] = "8"
	var be *BusError
	if _, err := LoadBusSettings(func(k string) (string, bool) { v, ok := env[k]; return v, ok }); !errors.As(err, &be) {
		t.Fatalf("shard 8 of 8: %v", err)
	}
	env["FERRYMQ_BUS_SHARDS"] = "many"
	if _, err := LoadBusSettings(func(k string) (string, bool) { v, ok := env[k]; return v, ok }); !errors.As(err, &be) {
		t.Fatalf("shards not a number: %v", err)
	}
}

func reflectTypeOfOrderPlaced() reflect.Type { return reflect.TypeOf(OrderPlaced{}) }
