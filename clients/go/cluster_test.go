package ferrymq

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// testCluster is three `ferrymq serve` nodes of one cluster on 127.0.0.1, as an operator runs
// them; each node keeps its ports and data directory across restarts.
type testCluster struct {
	nodes []*testBroker
}

var portSeq struct {
	sync.Mutex
	next int
}

// freePort is a loopback port nothing listens on. Nodes must know each other's addresses before
// they start, so ports are chosen up front. They come from below the kernel's ephemeral range
// (32768 and up), where listeners bound to port 0 never land; the process id spreads
// concurrent runs apart, and a collision at start is retried with other ports.
func freePort() (string, error) {
	portSeq.Lock()
	defer portSeq.Unlock()
	base := 20000 + (os.Getpid()*131+7000)%10000
	for i := 0; i < 3000; i++ {
		port := base + portSeq.next%2700
		portSeq.next++
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if l, err := net.Listen("tcp", addr); err == nil {
			l.Close()
			return addr, nil
		}
	}
	return "", errors.New("no free port below the ephemeral range")
}

func mustFreePort(t *testing.T) string {
	t.Helper()
	addr, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// startCluster starts a cluster of size nodes in dir, stopped when the test ends.
func startCluster(t *testing.T, size int) *testCluster {
	t.Helper()
	tc, err := newCluster(t.TempDir(), size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tc.stop)
	return tc
}

// newCluster starts a cluster of size nodes in dir, trying other ports after a failure.
func newCluster(dir string, size int) (*testCluster, error) {
	var last error
	for attempt := 0; attempt < 3; attempt++ {
		tc, err := tryCluster(filepath.Join(dir, fmt.Sprint(attempt)), size)
		if err == nil {
			return tc, nil
		}
		last = err
	}
	return nil, fmt.Errorf("starting a cluster of %d: %w", size, last)
}

func tryCluster(dir string, size int) (*testCluster, error) {
	tcp := make([]string, size)
	peers := make([]string, size)
	for i := range tcp {
		a, err := freePort()
		if err != nil {
			return nil, err
		}
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		tcp[i], peers[i] = a, fmt.Sprintf("%d=%s", i+1, p)
	}
	tc := &testCluster{}
	for i := 0; i < size; i++ {
		nd := filepath.Join(dir, fmt.Sprintf("node%d", i+1))
		if err := os.MkdirAll(nd, 0o755); err != nil {
			return nil, err
		}
		b := &testBroker{dir: nd, data: filepath.Join(nd, "data"), log: filepath.Join(nd, "broker.log"), Addr: tcp[i],
			extra: []string{"--node-id", fmt.Sprint(i + 1), "--cluster-addr", strings.SplitN(peers[i], "=", 2)[1],
				"--peers", strings.Join(peers, ","), "--election-timeout-ms", "300"}}
		if err := b.start(); err != nil {
			tc.stop()
			return nil, err
		}
		tc.nodes = append(tc.nodes, b)
	}
	return tc, nil
}

// exampleCluster is the cluster of Example_cluster, started on first use and stopped by
// TestMain.
var exampleCluster struct {
	sync.Mutex
	tc  *testCluster
	dir string
}

// ExampleClusterSeeds starts (once) a cluster of three nodes for the examples and returns
// its client addresses, comma-separated.
var ExampleClusterSeeds = func() string {
	exampleCluster.Lock()
	defer exampleCluster.Unlock()
	if exampleCluster.tc == nil {
		dir, err := os.MkdirTemp("", "ferrymq-go-cluster-")
		if err != nil {
			panic(err)
		}
		exampleCluster.dir = dir
		if exampleCluster.tc, err = newCluster(dir, 3); err != nil {
			panic(err)
		}
	}
	return strings.Join(exampleCluster.tc.addrs(), ",")
}

func stopExampleCluster() {
	exampleCluster.Lock()
	defer exampleCluster.Unlock()
	if exampleCluster.tc != nil {
		exampleCluster.tc.stop()
		os.RemoveAll(exampleCluster.dir)
	}
}

func (tc *testCluster) stop() {
	for _, b := range tc.nodes {
		b.stop(true)
	}
}

func (tc *testCluster) addrs() []string {
	out := make([]string, len(tc.nodes))
	for i, b := range tc.nodes {
		out[i] = b.Addr
	}
	return out
}

// logs is what the nodes logged, for a failure's message.
func (tc *testCluster) logs() string {
	var sb strings.Builder
	for i, b := range tc.nodes {
		text, _ := os.ReadFile(b.log)
		for _, line := range strings.Split(string(text), "\n") {
			if strings.Contains(line, "WARN") || strings.Contains(line, "ERROR") {
				fmt.Fprintf(&sb, "node %d: %s\n", i+1, line)
			}
		}
	}
	return sb.String()
}

// waitInfo polls ClusterInfo until ok holds (bounded).
func waitInfo(t *testing.T, ctx context.Context, c *Client, what string, ok func(*ClusterInfo) bool) *ClusterInfo {
	t.Helper()
	var info *ClusterInfo
	var err error
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if info, err = c.ClusterInfo(ctx); err == nil && ok(info) {
			return info
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s: %+v %v", what, info, err)
	return nil
}

// TestCluster runs against three real nodes: the cluster's view, not_leader, creating a topic
// through followers, seeds whose first is dead, and kill -9 of a partition's leader while
// publishing, after which every acknowledged publish is read back.
func TestCluster(t *testing.T) {
	noLeaks(t)
	tc := startCluster(t, 3)
	ctx := testCtx(t)
	addrs := tc.addrs()
	index := map[string]int{}
	for i, a := range addrs {
		index[a] = i
	}

	probe := connect(t, addrs[0])
	if v := probe.Server().Version; v != 3 {
		t.Fatalf("version %d", v)
	}
	info := waitInfo(t, ctx, probe, "a metadata leader", func(ci *ClusterInfo) bool { return ci.MetadataLeader != 0 })
	if info.NodeID != 1 || len(info.Nodes) != 3 {
		t.Fatalf("%+v", info)
	}
	for _, n := range info.Nodes {
		if n.Addr != addrs[n.ID-1] {
			t.Fatalf("node %d at %q, started at %s", n.ID, n.Addr, addrs[n.ID-1])
		}
	}
	leader := info.Addr(info.MetadataLeader)
	var followers []string
	for _, a := range addrs {
		if a != leader {
			followers = append(followers, a)
		}
	}

	t.Run("not_leader names the leader", func(t *testing.T) {
		c := connect(t, followers[0], WithLeaderTimeout(-1))
		err := c.CreateTopic(ctx, "never", TopicConfig{})
		var nl *NotLeaderError
		if !errors.Is(err, ErrNotLeader) || !errors.As(err, &nl) {
			t.Fatalf("create on a follower without following: %v", err)
		}
		if nl.Leader != info.MetadataLeader || nl.LeaderAddr != leader || nl.Node != uint64(index[followers[0]]+1) || nl.Topic != "" {
			t.Fatalf("%+v (leader %d at %s)", nl, info.MetadataLeader, leader)
		}
	})

	t.Run("create through followers", func(t *testing.T) {
		c := connect(t, strings.Join(followers, ","))
		// Forget what the connection learnt, so that the request goes to the follower and is
		// answered not_leader.
		c.cluster.mu.Lock()
		c.cluster.routes = map[routeKey]string{}
		c.cluster.mu.Unlock()
		if err := c.CreateTopic(ctx, "orders", TopicConfig{Partitions: 1, Storage: StorageDisk}); err != nil {
			t.Fatal(err)
		}
		if err := c.EnsureTopic(ctx, "orders", TopicConfig{Partitions: 1, Storage: StorageDisk}); err != nil {
			t.Fatal(err)
		}
		if err := c.CreateTopic(ctx, "orders", TopicConfig{Partitions: 1}); !errors.Is(err, ErrTopicExists) {
			t.Fatalf("created twice: %v", err)
		}
		ci := waitInfo(t, ctx, c, "a leader of orders/0", func(ci *ClusterInfo) bool { return ci.Leader("orders", 0) != 0 })
		for _, p := range ci.Partitions {
			if p.Topic == "orders" && len(p.Replicas) != 3 {
				t.Fatalf("%+v", p)
			}
		}
	})

	// A port nothing listens on: the first seed, dead.
	dead := mustFreePort(t)

	t.Run("first seed dead", func(t *testing.T) {
		t.Setenv("FERRYMQ_ADDR", dead+", "+followers[0])
		c, err := Connect(ctx, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for i := 0; i < 20; i++ {
			if _, err := c.Publish(ctx, "orders", Message{Body: []byte(fmt.Sprintf("seed-%d", i))}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := Connect(ctx, Options{Addrs: []string{dead}}); err == nil {
			t.Fatal("connected to nothing")
		}
	})

	t.Run("kill -9 of the partition leader", func(t *testing.T) {
		c := connect(t, "", WithAddrs(append([]string{dead}, addrs...)...))
		var (
			mu      sync.Mutex
			acked   = map[string]bool{}
			unknown int
		)
		// Four publishers, one publish each in flight: at the kill some are in doubt. Those
		// with a dedup id are sent again; the others fail as unknown and count as not
		// acknowledged.
		const publishers = 4
		stop := make(chan struct{})
		done := make(chan error, publishers)
		publish := func(w int) {
			for i := 0; ; i++ {
				select {
				case <-stop:
					done <- nil
					return
				default:
				}
				body := fmt.Sprintf("w%d-m%d", w, i)
				m := Message{Body: []byte(body)}
				if (w+i)%2 == 0 {
					m = m.WithDedupID(NewDedupID())
				}
				_, err := c.Publish(ctx, "orders", m)
				mu.Lock()
				switch {
				case err == nil:
					acked[body] = true
				case (w+i)%2 == 1 && errors.Is(err, ErrOutcomeUnknown):
					unknown++ // no dedup id: not sent again
				default:
					mu.Unlock()
					done <- fmt.Errorf("publish %s: %w", body, err)
					return
				}
				mu.Unlock()
			}
		}
		for w := 0; w < publishers; w++ {
			go publish(w)
		}
		count := func() int {
			mu.Lock()
			defer mu.Unlock()
			return len(acked)
		}
		eventually(t, "100 publishes acknowledged", func() bool { return count() >= 100 })
		ci := waitInfo(t, ctx, c, "a leader of orders/0", func(ci *ClusterInfo) bool { return ci.Leader("orders", 0) != 0 })
		killed := int(ci.Leader("orders", 0)) - 1
		before := count()
		tc.nodes[killed].stop(true)
		start := time.Now()
		deadline := time.Now().Add(45 * time.Second)
		for count() < before+200 {
			select {
			case err := <-done:
				t.Fatalf("%v\n%s", err, tc.logs())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d acknowledged after the kill in 45 s\n%s", count()-before, tc.logs())
			}
			time.Sleep(5 * time.Millisecond)
		}
		close(stop)
		for w := 0; w < publishers; w++ {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		after := waitInfo(t, ctx, c, "a new leader", func(ci *ClusterInfo) bool {
			l := ci.Leader("orders", 0)
			return l != 0 && int(l)-1 != killed
		})
		t.Logf("node %d killed; node %d leads; 200 more acknowledged within %v; %d without dedup id left unknown",
			killed+1, after.Leader("orders", 0), time.Since(start).Round(time.Millisecond), unknown)

		// Every acknowledged publish is delivered by the new leader (only a partition's leader
		// delivers it; it holds what a majority acknowledged).
		for _, a := range []string{addrs[int(after.Leader("orders", 0))-1]} {
			r := connect(t, a)
			sub, err := r.Subscribe(ctx, "orders", SubscribeOptions{Subscription: fmt.Sprintf("check-%d", index[a]+1), Start: Start{Kind: StartEarliest}})
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]int{}
			mu.Lock()
			want := len(acked)
			mu.Unlock()
			missing := func() int {
				n := 0
				for body := range acked {
					if seen[body] == 0 {
						n++
					}
				}
				return n
			}
			for missing() > 0 {
				rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				ds, err := sub.NextBatch(rctx, 1000)
				cancel()
				if err != nil {
					t.Fatalf("node %s: %d of %d acknowledged missing: %v", a, missing(), want, err)
				}
				for _, d := range ds {
					seen[string(d.Message.Body)]++
				}
				sub.AckNoWait(ds...)
			}
			twice := 0
			for _, n := range seen {
				if n > 1 {
					twice++
				}
			}
			t.Logf("node %s holds all %d acknowledged; %d stored twice", a, want, twice)
			sub.Close(ctx)
			r.Close()
		}
	})
}

// TestClusterSubscription: a subscriber acking each message with confirmation reads a
// replicated topic while the leader of its first partition is killed with SIGKILL mid-stream
// and restarted. The subscription is attached on every node, re-attached on the restarted
// one, every published message arrives, and none acked with confirmation comes again.
func TestClusterSubscription(t *testing.T) {
	noLeaks(t)
	tc := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	addrs := tc.addrs()
	seeds := strings.Join(addrs, ",")
	pub := connect(t, seeds)
	waitInfo(t, ctx, pub, "a metadata leader", func(ci *ClusterInfo) bool { return ci.MetadataLeader != 0 })
	const topic = "jobs"
	if err := pub.EnsureTopic(ctx, topic, TopicConfig{Partitions: 2, Storage: StorageDisk, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	waitInfo(t, ctx, pub, "leaders of both partitions", func(ci *ClusterInfo) bool {
		return ci.Leader(topic, 0) != 0 && ci.Leader(topic, 1) != 0
	})

	subc := connect(t, addrs[0])
	sub, err := subc.Subscribe(ctx, topic, SubscribeOptions{Subscription: "workers", Start: Start{Kind: StartEarliest}, Window: 64})
	if err != nil {
		t.Fatal(err)
	}
	// attachedOn is the node ids the subscription is attached on.
	attachedOn := func() map[uint64]bool {
		sub.mu.Lock()
		defer sub.mu.Unlock()
		out := map[uint64]bool{}
		for _, l := range sub.legs {
			if l.conn != nil && !l.conn.isClosed() {
				out[l.node] = true
			}
		}
		return out
	}
	if !sub.cluster || len(attachedOn()) != 3 || sub.Name() != "workers" || sub.Partitions() != 2 {
		t.Fatalf("cluster %v, attached on %v, %q, %d partitions", sub.cluster, attachedOn(), sub.Name(), sub.Partitions())
	}

	var (
		mu          sync.Mutex
		published   = map[string]bool{}
		received    = map[string]int{}
		confirmed   = map[string]bool{}
		again       []string // delivered after an ack confirmed
		ackFailures int
		failure     error
	)
	fail := func(err error) {
		mu.Lock()
		if failure == nil {
			failure = err
		}
		mu.Unlock()
	}
	counts := func() (int, int, error) {
		mu.Lock()
		defer mu.Unlock()
		return len(published), len(received), failure
	}
	// waitFor polls cond (under mu) until it holds, failing after limit or on a recorded
	// failure.
	waitFor := func(what string, limit time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(limit)
		for {
			mu.Lock()
			ok, err := cond(), failure
			mu.Unlock()
			if err != nil {
				t.Fatalf("%s: %v\n%s", what, err, tc.logs())
			}
			if ok {
				return
			}
			if time.Now().After(deadline) {
				p, r, _ := counts()
				t.Fatalf("timed out waiting for %s (%d published, %d received)\n%s", what, p, r, tc.logs())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	stopPub := make(chan struct{})
	stopSub := make(chan struct{})
	var pubOnce, subOnce sync.Once
	endPub := func() { pubOnce.Do(func() { close(stopPub) }) }
	endSub := func() { subOnce.Do(func() { close(stopSub) }) }
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // one publish in flight at a time, each with a dedup id: sent again when in doubt
		defer wg.Done()
		for i := 0; i < 100000; i++ {
			select {
			case <-stopPub:
				return
			default:
			}
			body := fmt.Sprintf("m-%d", i)
			if _, err := pub.Publish(ctx, topic, Message{Key: []byte(body), Body: []byte(body)}.WithDedupID(NewDedupID())); err != nil {
				fail(fmt.Errorf("publish %s: %w", body, err))
				return
			}
			mu.Lock()
			published[body] = true
			mu.Unlock()
		}
	}()
	go func() {
		defer wg.Done()
		for {
			nctx, ncancel := context.WithTimeout(ctx, 200*time.Millisecond)
			d, err := sub.Next(nctx)
			ncancel()
			select {
			case <-stopSub:
				return
			default:
			}
			if errors.Is(err, context.DeadlineExceeded) {
				continue
			}
			if err != nil {
				fail(fmt.Errorf("next: %w", err))
				return
			}
			body := string(d.Message.Body)
			mu.Lock()
			received[body]++
			if confirmed[body] {
				again = append(again, fmt.Sprintf("%s (%v, attempt %d)", body, d.ID(), d.Attempt))
			}
			mu.Unlock()
			actx, acancel := context.WithTimeout(ctx, 10*time.Second)
			err = d.Ack(actx)
			acancel()
			mu.Lock()
			if err == nil {
				confirmed[body] = true
			} else {
				ackFailures++ // not_leader, or the node lost: the message comes again
			}
			mu.Unlock()
		}
	}()
	defer func() {
		endPub()
		endSub()
		wg.Wait()
	}()

	waitFor("100 messages received", 30*time.Second, func() bool { return len(received) >= 100 })
	ci := waitInfo(t, ctx, pub, "a leader of partition 0", func(ci *ClusterInfo) bool { return ci.Leader(topic, 0) != 0 })
	killed := ci.Leader(topic, 0)
	// A client whose only seed is the node about to be killed.
	orphan := connect(t, tc.nodes[killed-1].Addr)
	p0, r0, _ := counts()
	start := time.Now()
	tc.nodes[killed-1].stop(true)
	// Its connection is gone; the nodes the cluster named serve a new subscription.
	probe, err := orphan.Subscribe(ctx, topic, SubscribeOptions{Subscription: "probe"})
	if err != nil {
		t.Fatalf("subscribe with the seed killed: %v", err)
	}
	probe.mu.Lock()
	probeLegs := len(probe.legs)
	probe.mu.Unlock()
	if !probe.cluster || probeLegs != 3 {
		t.Fatalf("subscribed with the seed killed: cluster %v, %d nodes", probe.cluster, probeLegs)
	}
	if err := probe.Close(ctx); err != nil {
		t.Fatal(err)
	}
	orphan.Close()
	waitFor("200 published and 200 received after the kill", 60*time.Second, func() bool {
		return len(published) >= p0+200 && len(received) >= r0+200
	})
	resumed := time.Since(start)
	if attachedOn()[killed] {
		// The connection to a killed process breaks at once on loopback.
		t.Fatalf("still attached on the killed node %d", killed)
	}
	if err := tc.nodes[killed-1].start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !attachedOn()[killed] {
		if time.Now().After(deadline) {
			t.Fatalf("not attached again on the restarted node %d (attached on %v)\n%s", killed, attachedOn(), tc.logs())
		}
		time.Sleep(10 * time.Millisecond)
	}
	p1, _, _ := counts()
	waitFor("100 more published after the restart", 60*time.Second, func() bool { return len(published) >= p1+100 })
	endPub()
	waitFor("every published message received", 60*time.Second, func() bool {
		for body := range published {
			if received[body] == 0 {
				return false
			}
		}
		return true
	})
	endSub()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	if len(again) > 0 {
		t.Fatalf("%d delivered again after a confirmed ack: %v", len(again), again)
	}
	twice := 0
	for _, n := range received {
		if n > 1 {
			twice++
		}
	}
	t.Logf("node %d (leader of partition 0) killed; deliveries resumed: 200 more within %v; %d published, %d received (%d more than once, none after a confirmed ack), %d acks refused",
		killed, resumed.Round(time.Millisecond), len(published), len(received), twice, ackFailures)
	if err := sub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(attachedOn()); n != 0 {
		t.Fatalf("attached on %d nodes after Close", n)
	}
	if _, err := sub.Next(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("next after close: %v", err)
	}
}

// TestBusOverCluster: the bus's receiver, unchanged, reads every shard of a replicated topic
// from the nodes that lead them, and a topic deleted in the cluster ends its subscription.
func TestBusOverCluster(t *testing.T) {
	noLeaks(t)
	tc := startCluster(t, 3)
	ctx := testCtx(t)
	c := connect(t, strings.Join(tc.addrs(), ","))
	waitInfo(t, ctx, c, "a metadata leader", func(ci *ClusterInfo) bool { return ci.MetadataLeader != 0 })
	const topic = "bus-orders"
	b, err := NewBus(c, BusSettings{Identity: "runner", Shards: 3, Serializer: "json", TopicTemplate: topic}, WithBusStorage(StorageDisk))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	handled := map[int64]int{}
	r := NewReceiver(b, ReceiverOptions{Logf: quietLogf})
	Handle(r, Handler[Ping2]{Handle: func(ctx context.Context, m Ping2, mc *MessageContext) error {
		mu.Lock()
		handled[m.ID]++
		mu.Unlock()
		return nil
	}})
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitInfo(t, ctx, c, "leaders of the three shards", func(ci *ClusterInfo) bool {
		return ci.Leader(topic, 0) != 0 && ci.Leader(topic, 1) != 0 && ci.Leader(topic, 2) != 0
	})
	const n = 60
	shards := map[uint32]bool{}
	for i := int64(0); i < n; i++ {
		id, err := Send(ctx, b, Ping2{ID: i, Text: "x"})
		if err != nil {
			t.Fatal(err)
		}
		shards[id.Partition] = true
	}
	eventually(t, "every message handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) == n
	})
	if len(shards) < 2 {
		t.Fatalf("%d messages went to %d shard(s)", n, len(shards))
	}
	if err := c.DeleteTopic(ctx, topic); err != nil {
		t.Fatal(err)
	}
	errCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := r.Run(errCtx); !errors.Is(err, ErrUnknownTopic) {
		t.Fatalf("run after the topic went: %v", err)
	}
}
