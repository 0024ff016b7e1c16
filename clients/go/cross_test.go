package ferrymq

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// pythonPeer runs testdata/bus_peer.py with the Python client of this repository; it skips the
// test when no Python 3.10+ is there.
func pythonPeer(t *testing.T, role, addr string, count, shards int) (serializers []string, peers []map[string]any) {
	t.Helper()
	python := filepath.Join("..", "python", ".venv", "bin", "python")
	if _, err := os.Stat(python); err != nil {
		if python, err = exec.LookPath("python3"); err != nil {
			t.Skip("no Python for the Python side of the bus")
		}
	}
	if err := exec.Command(python, "-c", "import sys; assert sys.version_info >= (3, 10)").Run(); err != nil {
		t.Skip("the Python bus needs Python 3.10+")
	}
	src, _ := filepath.Abs(filepath.Join("..", "python", "src"))
	return runPeer(t, "Python", []string{"PYTHONPATH=" + src}, python, filepath.Join("testdata", "bus_peer.py"), role, addr, fmt.Sprint(count), fmt.Sprint(shards))
}

// typescriptPeer runs testdata/bus_peer.mjs with the built TypeScript client of this repository
// (clients/typescript/dist); it skips the test when node or the build is missing.
func typescriptPeer(t *testing.T, role, addr string, count, shards int) (serializers []string, peers []map[string]any) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("no node for the TypeScript side of the bus")
	}
	dist := filepath.Join("..", "typescript", "dist")
	if _, err := os.Stat(filepath.Join(dist, "bus", "index.js")); err != nil {
		t.Skip("the TypeScript client is not built: run npm ci && npm run build in clients/typescript")
	}
	return runPeer(t, "TypeScript", nil, node, filepath.Join("testdata", "bus_peer.mjs"), dist, role, addr, fmt.Sprint(count), fmt.Sprint(shards))
}

// rustPeer runs the Rust bus peer, the example crates/ferrymq-client/examples/bus_peer.rs:
// $FERRYMQ_RUST_BUS_PEER, else the one cargo built (under $CARGO_TARGET_DIR, else the
// repository's target/; run-tests.sh builds it when cargo is there); it skips the test when
// there is none.
func rustPeer(t *testing.T, role, addr string, count, shards int) (serializers []string, peers []map[string]any) {
	t.Helper()
	bin := os.Getenv("FERRYMQ_RUST_BUS_PEER")
	if bin == "" {
		target := os.Getenv("CARGO_TARGET_DIR")
		if target == "" {
			target = filepath.Join("..", "..", "target")
		}
		for _, profile := range []string{"debug", "release"} {
			p := filepath.Join(target, profile, "examples", "bus_peer")
			if st, err := os.Stat(p); err == nil && !st.IsDir() {
				bin = p
				break
			}
		}
	}
	if bin == "" {
		t.Skip("the Rust bus peer is not built: cargo build -p ferrymq-client --example bus_peer")
	}
	return runPeer(t, "Rust", nil, bin, role, addr, fmt.Sprint(count), fmt.Sprint(shards))
}

// runPeer runs a peer of another language and reads its SERIALIZERS and PEER lines.
func runPeer(t *testing.T, lang string, env []string, prog string, args ...string) (serializers []string, peers []map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("the %s peer failed: %v\n%s\n%s", lang, err, out, stderr)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if s, ok := strings.CutPrefix(line, "SERIALIZERS "); ok {
			serializers = strings.Split(s, ",")
		}
		if s, ok := strings.CutPrefix(line, "PEER "); ok {
			var m map[string]any
			if err := json.Unmarshal([]byte(s), &m); err != nil {
				t.Fatal(err)
			}
			peers = append(peers, m)
		}
	}
	return serializers, peers
}

func crossLanguage(t *testing.T, lang, prefix string, peer func(t *testing.T, role, addr string, count, shards int) ([]string, []map[string]any)) {
	noLeaks(t)
	b := newBroker(t, nil)
	ctx := testCtx(t)
	c := connect(t, b.Addr)
	const count, shards = 12, 4

	// Go sends, the peer handles.
	var sent []OrderPlaced
	sers, _ := peer(t, "probe", b.Addr, 0, shards) // the serializers the peer can read
	for i := 0; i < count; i++ {
		ser := sers[i%len(sers)]
		bus, err := NewBus(c, BusSettings{Identity: "go-checkout", Shards: shards, Serializer: ser})
		if err != nil {
			t.Fatal(err)
		}
		o := OrderPlaced{OrderID: int64(i*7919 - 40), Customer: fmt.Sprintf("go ✓ \"%d\"\n", i), Total: float64(i) / 4, Express: i%2 == 0}
		if _, err := Send(ctx, bus, o); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, o)
	}
	peerSers, got := peer(t, "receive", b.Addr, count, shards)
	if len(got) != count {
		t.Fatalf(lang+" handled %d of %d", len(got), count)
	}
	byID := map[int64]map[string]any{}
	for _, g := range got {
		byID[int64(g["order_id"].(float64))] = g
	}
	for i, o := range sent {
		g := byID[o.OrderID]
		shard, _ := ShardForKey(o.OrderID, shards)
		if g == nil || g["customer"] != o.Customer || g["total"] != o.Total || g["express"] != o.Express || g["sender"] != "go-checkout" ||
			int(g["shard"].(float64)) != shard || int(g["partition"].(float64)) != shard || g["serializer"] != sers[i%len(sers)] {
			t.Fatalf(lang+" got %v for %+v", g, o)
		}
	}

	// The peer sends with every serializer it has, Go handles.
	var mu sync.Mutex
	seen := map[int64]*MessageContext{}
	vals := map[int64]OrderPlaced{}
	bus, err := NewBus(c, BusSettings{Identity: "go-billing", Shards: shards, Serializer: "json"})
	if err != nil {
		t.Fatal(err)
	}
	r := NewReceiver(bus, ReceiverOptions{Logf: quietLogf})
	Handle(r, Handler[OrderPlaced]{Handle: func(ctx context.Context, m OrderPlaced, mc *MessageContext) error {
		mu.Lock()
		seen[m.OrderID], vals[m.OrderID] = mc, m
		mu.Unlock()
		return nil
	}})
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.Stop(ctx)
	_, peerSent := peer(t, "send", b.Addr, count, shards)
	if len(peerSent) != count {
		t.Fatalf(lang+" sent %d", len(peerSent))
	}
	// Go's own messages are handled too (the same topic): wait for the peer's.
	eventually(t, lang+"'s messages handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range peerSent {
			if seen[int64(p["order_id"].(float64))] == nil {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	used := map[string]bool{}
	for _, p := range peerSent {
		id := int64(p["order_id"].(float64))
		mc, v := seen[id], vals[id]
		shard, _ := ShardForKey(id, shards)
		if v.Customer != p["customer"] || v.Total != p["total"] || v.Express != p["express"] || mc.Sender != prefix+"-checkout" ||
			mc.Shard != shard || int(mc.Delivery.Partition) != shard || mc.Serializer != p["serializer"] {
			t.Fatalf("Go got %+v %+v for %v", v, mc, p)
		}
		used[mc.Serializer] = true
	}
	if len(used) != len(peerSers) {
		t.Fatalf("serializers %v, "+lang+" has %v", used, peerSers)
	}
	t.Logf("%s serializers: %v", lang, peerSers)
}

func TestBusCrossLanguagePython(t *testing.T) { crossLanguage(t, "Python", "py", pythonPeer) }

func TestBusCrossLanguageTypeScript(t *testing.T) {
	crossLanguage(t, "TypeScript", "ts", typescriptPeer)
}

func TestBusCrossLanguageRust(t *testing.T) { crossLanguage(t, "Rust", "rs", rustPeer) }
