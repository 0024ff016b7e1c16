package ferrymq

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// FuzzDecodeFrame: any bytes decode to a frame or a ProtocolError, never a panic; a frame that
// decodes encodes back to the same bytes.
func FuzzDecodeFrame(f *testing.F) {
	b, err := os.ReadFile(filepath.Join("..", "..", "protocol", "vectors.json"))
	if err != nil {
		f.Fatal(err)
	}
	var v struct {
		Vectors []struct{ Hex string } `json:"vectors"`
		Invalid []struct{ Hex string } `json:"invalid"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		f.Fatal(err)
	}
	for _, x := range append(v.Vectors, v.Invalid...) {
		raw, _ := hex.DecodeString(x.Hex)
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		frame, n, err := DecodeFrame(data, 1<<20)
		if err != nil {
			if _, ok := err.(*ProtocolError); !ok {
				t.Fatalf("error %T %v", err, err)
			}
			return
		}
		if n == 0 {
			return
		}
		enc, err := EncodeFrame(nil, frame.RequestID, frame.Payload)
		if err != nil {
			t.Fatalf("decoded %x but cannot encode it: %v", data[:n], err)
		}
		if !bytes.Equal(enc, data[:n]) {
			t.Fatalf("decoded %x, encoded %x", data[:n], enc)
		}
	})
}

// FuzzBusUnmarshal: any body gives field values or an UnreadableBodyError with every
// serializer, never a panic.
func FuzzBusUnmarshal(f *testing.F) {
	s, err := SchemaOf(reflectTypeOfOrderPlaced())
	if err != nil {
		f.Fatal(err)
	}
	sers := DefaultSerializers()
	for _, name := range sers.Names() {
		ser, _ := sers.Get(name)
		body, _ := ser.Marshal(s, []any{int64(42), "c", 1.5, true})
		f.Add(body)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, name := range sers.Names() {
			ser, _ := sers.Get(name)
			vals, err := ser.Unmarshal(s, body)
			if err != nil {
				if _, ok := err.(*UnreadableBodyError); !ok {
					t.Fatalf("%s: error %T %v", name, err, err)
				}
				continue
			}
			if _, err := s.build(vals); err != nil {
				t.Fatalf("%s: values %v do not build: %v", name, vals, err)
			}
		}
	})
}
