package ferrymq

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"testing"
)

type vectorFile struct {
	FrameBytesMax uint32            `json:"frame_bytes_max"`
	Opcodes       map[string]uint16 `json:"opcodes"`
	ErrorCodes    map[string]uint16 `json:"error_codes"`
	OpcodeSince   map[string]uint16 `json:"opcode_since"`
	ErrorSince    map[string]uint16 `json:"error_code_since"`
	Vectors       []struct {
		Name      string          `json:"name"`
		Frame     string          `json:"frame"`
		Opcode    uint16          `json:"opcode"`
		RequestID uint32          `json:"request_id"`
		Fields    json.RawMessage `json:"fields"`
		Hex       string          `json:"hex"`
	} `json:"vectors"`
	Invalid []struct {
		Name  string `json:"name"`
		Error string `json:"error"`
		Field string `json:"field"`
		Hex   string `json:"hex"`
	} `json:"invalid"`
}

func loadJSON(t *testing.T, name string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "protocol", name))
	if err != nil {
		t.Fatal(err)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(v); err != nil {
		t.Fatal(err)
	}
}

var bigDecimal = regexp.MustCompile(`^[0-9]{16,20}$`)

// normalize turns the vectors' byte strings into base64 (Go's JSON form of []byte) and u64
// decimal strings into numbers.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		if len(x) == 1 {
			if s, ok := x["utf8"].(string); ok {
				return base64.StdEncoding.EncodeToString([]byte(s))
			}
			if s, ok := x["hex"].(string); ok {
				b, _ := hex.DecodeString(s)
				return base64.StdEncoding.EncodeToString(b)
			}
		}
		out := map[string]any{}
		for k, e := range x {
			out[k] = normalize(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = normalize(e)
		}
		return out
	case string:
		if bigDecimal.MatchString(x) {
			return json.Number(x)
		}
		return x
	}
	return v
}

func toTree(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var out any
	if err := d.Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// loadVectors reads the vectors of ProtocolVersion: the frozen protocol/vectors-v<N>.json while this
// package speaks an older version than the newest (a later version may lay out a frame
// differently: version 3 extends STATS_REPLY), else protocol/vectors.json, in either case without
// the frames and codes of newer versions: this package never offers those versions, so a server
// never sends them.
func loadVectors(t *testing.T) vectorFile {
	var f vectorFile
	own := fmt.Sprintf("vectors-v%d.json", ProtocolVersion)
	if _, err := os.Stat(filepath.Join("..", "..", "protocol", own)); err == nil {
		loadJSON(t, own, &f)
	} else {
		loadJSON(t, "vectors.json", &f)
	}
	spoken := func(since map[string]uint16, name string) bool {
		v, ok := since[name]
		return !ok || v <= ProtocolVersion
	}
	vectors := f.Vectors[:0]
	for _, v := range f.Vectors {
		if spoken(f.OpcodeSince, v.Frame) {
			vectors = append(vectors, v)
		}
	}
	f.Vectors = vectors
	for name := range f.Opcodes {
		if !spoken(f.OpcodeSince, name) {
			delete(f.Opcodes, name)
		}
	}
	for name := range f.ErrorCodes {
		if !spoken(f.ErrorSince, name) {
			delete(f.ErrorCodes, name)
		}
	}
	return f
}

func TestVectorsValid(t *testing.T) {
	f := loadVectors(t)
	if len(f.Vectors) < 80 {
		t.Fatalf("only %d vectors", len(f.Vectors))
	}
	seen := map[Opcode]bool{}
	for _, v := range f.Vectors {
		t.Run(v.Name, func(t *testing.T) {
			raw, err := hex.DecodeString(v.Hex)
			if err != nil {
				t.Fatal(err)
			}
			frame, n, err := DecodeFrame(raw, f.FrameBytesMax)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if n != len(raw) {
				t.Fatalf("decode used %d of %d bytes", n, len(raw))
			}
			if frame.RequestID != v.RequestID || uint16(frame.Payload.Opcode()) != v.Opcode || f.Opcodes[v.Frame] != v.Opcode {
				t.Fatalf("request id %d opcode %#x", frame.RequestID, frame.Payload.Opcode())
			}
			seen[frame.Payload.Opcode()] = true
			// Build the frame from the fields, encode it, compare the bytes.
			var fields any
			d := json.NewDecoder(bytes.NewReader(v.Fields))
			d.UseNumber()
			if err := d.Decode(&fields); err != nil {
				t.Fatal(err)
			}
			want := normalize(fields)
			wantJSON, _ := json.Marshal(want)
			built := reflect.New(reflect.TypeOf(frame.Payload).Elem()).Interface().(Payload)
			if err := json.Unmarshal(wantJSON, built); err != nil {
				t.Fatalf("fields: %v", err)
			}
			enc, err := EncodeFrame(nil, v.RequestID, built)
			if err != nil {
				t.Fatalf("encode: %v", err)
			}
			if hex.EncodeToString(enc) != v.Hex {
				t.Fatalf("encode:\n got %x\nwant %s", enc, v.Hex)
			}
			// The decoded frame equals the one built from the fields.
			if got := toTree(t, frame.Payload); !reflect.DeepEqual(got, toTree(t, want)) {
				gb, _ := json.Marshal(got)
				t.Fatalf("decoded:\n got %s\nwant %s", gb, wantJSON)
			}
		})
	}
	for name, op := range f.Opcodes {
		if !seen[Opcode(op)] {
			t.Errorf("no vector for %s", name)
		}
	}
}

func TestVectorsInvalid(t *testing.T) {
	f := loadVectors(t)
	for _, v := range f.Invalid {
		t.Run(v.Name, func(t *testing.T) {
			raw, err := hex.DecodeString(v.Hex)
			if err != nil {
				t.Fatal(err)
			}
			_, n, err := DecodeFrame(raw, f.FrameBytesMax)
			if err == nil {
				t.Fatalf("accepted (%d bytes used)", n)
			}
			var pe *ProtocolError
			if !errors.As(err, &pe) || !errors.Is(err, ErrProtocol) {
				t.Fatalf("not a ProtocolError: %v", err)
			}
			if string(pe.Kind) != v.Error {
				t.Fatalf("kind %s, want %s (%v)", pe.Kind, v.Error, err)
			}
			if v.Field != "" && pe.Field != v.Field {
				t.Errorf("field %q, want %q (%v)", pe.Field, v.Field, err)
			}
		})
	}
}

func TestVectorsErrorCodes(t *testing.T) {
	f := loadVectors(t)
	for name, code := range f.ErrorCodes {
		if got := ErrorCode(code).String(); got != name {
			t.Errorf("code %d is %q, want %q", code, got, name)
		}
	}
	if len(f.ErrorCodes) != len(codeNames) {
		t.Errorf("%d codes in the vectors, %d here", len(f.ErrorCodes), len(codeNames))
	}
}

func TestMessageIDs(t *testing.T) {
	for _, ok := range []string{"0-0", "3-1041", "4294967295-18446744073709551615"} {
		p, err := ParseMessageID(ok)
		if err != nil || p.String() != ok {
			t.Errorf("%s: %v %v", ok, p, err)
		}
	}
	for _, bad := range []string{"", "3", "3-", "-1", "a-1", "1-2-3", "4294967296-0", "1-18446744073709551616"} {
		if _, err := ParseMessageID(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestConsumerEndMessages(t *testing.T) {
	for msg, want := range map[string]int64{
		"topic 'orders' was deleted; consumer 7 ends":    7,
		"consumer 12 ends: forbidden: no consume on 'x'": 12,
		"unknown consumer 3":                             -1,
		"":                                               -1,
	} {
		id, ok := consumerOf(msg)
		if (want < 0 && ok) || (want >= 0 && (!ok || int64(id) != want)) {
			t.Errorf("%q: %d %v", msg, id, ok)
		}
	}
}

// TestVectorsVersion3 checks that the version 3 frames and codes (cluster and operator) are
// among the vectors the tests above encode and decode, and that their bytes read as the
// cluster's view a client follows leaders with.
func TestVectorsVersion3(t *testing.T) {
	f := loadVectors(t)
	if ProtocolVersion != 3 {
		t.Fatalf("ProtocolVersion %d", ProtocolVersion)
	}
	frames := map[string]int{}
	for _, v := range f.Vectors {
		frames[v.Frame]++
	}
	for name, since := range f.OpcodeSince {
		if since == 3 && (frames[name] == 0 || f.Opcodes[name] == 0) {
			t.Errorf("no version 3 vector for %s", name)
		}
	}
	for _, name := range []string{"CLUSTER_INFO", "CLUSTER_INFO_REPLY", "PURGE_TOPIC", "PURGED", "PAUSE_SUBSCRIPTION", "LIST_CONNECTIONS", "CONNECTION_LIST", "CLOSE_CONNECTION"} {
		if frames[name] == 0 {
			t.Errorf("%s is not among the vectors tested", name)
		}
	}
	if f.ErrorCodes["not_leader"] != 22 || f.ErrorSince["not_leader"] != 3 || CodeNotLeader.String() != "not_leader" {
		t.Errorf("not_leader: %d since %d", f.ErrorCodes["not_leader"], f.ErrorSince["not_leader"])
	}
	for _, v := range f.Vectors {
		if v.Name != "cluster_info_reply" {
			continue
		}
		raw, _ := hex.DecodeString(v.Hex)
		frame, _, err := DecodeFrame(raw, f.FrameBytesMax)
		if err != nil {
			t.Fatal(err)
		}
		info := frame.Payload.(*ClusterInfoReply).ClusterInfo
		if info.NodeID != 1 || info.MetadataLeader != 2 || info.Addr(2) != "10.0.0.2:7070" || info.Addr(3) != "" ||
			info.Leader("orders", 0) != 2 || info.Leader("orders", 1) != 0 || len(info.Partitions[1].Replicas) != 3 {
			t.Fatalf("%+v", info)
		}
		return
	}
	t.Fatal("no cluster_info_reply vector")
}

func TestNotLeaderMessages(t *testing.T) {
	for msg, want := range map[string]NotLeaderError{
		"node 1 does not lead partition 0 of 'orders': node 2 at 10.0.0.2:7070 does":       {Node: 1, Leader: 2, LeaderAddr: "10.0.0.2:7070", Topic: "orders", Partition: 0},
		"node 3 does not lead partition 17 of 'a: b': node 1 does":                         {Node: 3, Leader: 1, Topic: "a: b", Partition: 17},
		"node 2 does not lead the cluster metadata: node 1 at [::1]:7071 does":             {Node: 2, Leader: 1, LeaderAddr: "[::1]:7071", Partition: -1},
		"partition 4 of 'x' has no leader at the moment (an election is under way); retry": {Topic: "x", Partition: 4},
		"something else": {Partition: -1},
	} {
		err := brokerError(uint16(CodeNotLeader), msg)
		var nl *NotLeaderError
		if !errors.As(err, &nl) || !errors.Is(err, ErrNotLeader) || errors.Is(err, ErrStorageUnavailable) {
			t.Fatalf("%q: %#v", msg, err)
		}
		var be *Error
		if !errors.As(err, &be) || be.Code != CodeNotLeader || be.Message != msg || err.Error() != "ferrymq: not_leader: "+msg {
			t.Fatalf("%q: %#v", msg, err)
		}
		want.Err = nl.Err
		if *nl != want {
			t.Errorf("%q: %+v, want %+v", msg, *nl, want)
		}
	}
	if _, ok := brokerError(uint16(CodeForbidden), "no").(*Error); !ok {
		t.Fatal("forbidden is not a plain *Error")
	}
}
