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
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, filepath.Join("testdata", "bus_peer.py"), role, addr, fmt.Sprint(count), fmt.Sprint(shards))
	cmd.Env = append(os.Environ(), "PYTHONPATH="+src)
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("the Python peer failed: %v\n%s\n%s", err, out, stderr)
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

func TestBusCrossLanguagePython(t *testing.T) {
	noLeaks(t)
	b := newBroker(t, nil)
	ctx := testCtx(t)
	c := connect(t, b.Addr)
	const count, shards = 12, 4

	// Go sends, Python handles.
	var sent []OrderPlaced
	sers, _ := pythonPeer(t, "probe", b.Addr, 0, shards) // the serializers Python can read
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
	pySers, got := pythonPeer(t, "receive", b.Addr, count, shards)
	if len(got) != count {
		t.Fatalf("Python handled %d of %d", len(got), count)
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
			t.Fatalf("Python got %v for %+v", g, o)
		}
	}

	// Python sends with every serializer it has, Go handles.
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
	_, pySent := pythonPeer(t, "send", b.Addr, count, shards)
	if len(pySent) != count {
		t.Fatalf("Python sent %d", len(pySent))
	}
	// Go's own messages are handled too (the same topic): wait for Python's.
	eventually(t, "Python's messages handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range pySent {
			if seen[int64(p["order_id"].(float64))] == nil {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	used := map[string]bool{}
	for _, p := range pySent {
		id := int64(p["order_id"].(float64))
		mc, v := seen[id], vals[id]
		shard, _ := ShardForKey(id, shards)
		if v.Customer != p["customer"] || v.Total != p["total"] || v.Express != p["express"] || mc.Sender != "py-checkout" ||
			mc.Shard != shard || int(mc.Delivery.Partition) != shard || mc.Serializer != p["serializer"] {
			t.Fatalf("Go got %+v %+v for %v", v, mc, p)
		}
		used[mc.Serializer] = true
	}
	if len(used) != len(pySers) {
		t.Fatalf("serializers %v, Python has %v", used, pySers)
	}
	t.Logf("Python serializers: %v", pySers)
}
