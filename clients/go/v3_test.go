package ferrymq

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestVersion2Broker: HELLO offers versions 2..=3, and a broker that answers 2 is served
// without the version 3 requests, which are never sent.
func TestVersion2Broker(t *testing.T) {
	noLeaks(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	hello := make(chan *Hello, 1)
	opcodes := make(chan []Opcode, 1)
	go func() {
		nc, err := l.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		f, err := readFrame(nc, DefaultFrameBytes)
		if err != nil {
			return
		}
		hello <- f.Payload.(*Hello)
		b, _ := EncodeFrame(nil, 1, &HelloOK{Version: 2, HeartbeatMs: 5000, FrameBytesMax: DefaultFrameBytes, MessageBytesMax: 1 << 18, Server: "ferrymq/0.0.2"})
		nc.Write(b)
		var seen []Opcode
		defer func() { opcodes <- seen }()
		for {
			f, err := readFrame(nc, DefaultFrameBytes)
			if err != nil {
				return
			}
			seen = append(seen, f.Payload.Opcode())
			if _, ok := f.Payload.(*Ping); ok && f.RequestID != 0 {
				b, _ := EncodeFrame(nil, f.RequestID, &Pong{})
				nc.Write(b)
			}
		}
	}()
	ctx := testCtx(t)
	c := connect(t, l.Addr().String())
	h := <-hello
	if h.VersionMin != 2 || h.VersionMax != 3 {
		t.Fatalf("HELLO offers %d..=%d", h.VersionMin, h.VersionMax)
	}
	if c.Server().Version != 2 {
		t.Fatalf("version %d", c.Server().Version)
	}
	info, err := c.ClusterInfo(ctx)
	if err != nil || info.NodeID != 0 || len(info.Nodes) != 0 {
		t.Fatalf("cluster info from a version 2 broker: %+v %v", info, err)
	}
	_, err = c.PurgeTopic(ctx, "orders")
	var ve *VersionError
	if !errors.As(err, &ve) || !errors.Is(err, ErrUnknownOpcode) || ve.Have != 2 || ve.Need != 3 {
		t.Fatalf("purge on version 2: %v", err)
	}
	if _, err := c.ListConnections(ctx, 0, 10); !errors.Is(err, ErrUnknownOpcode) {
		t.Fatalf("list connections on version 2: %v", err)
	}
	if _, err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	c.Close()
	for _, op := range <-opcodes {
		if op != OpPing {
			t.Fatalf("opcode %#x sent to a version 2 broker", uint16(op))
		}
	}
}

// TestVersion3AloneAndOperator: a broker that runs alone speaks version 3, answers CLUSTER_INFO
// with node 0, and serves the operator's requests.
func TestVersion3AloneAndOperator(t *testing.T) {
	noLeaks(t)
	ctx := testCtx(t)
	c := connect(t, shared.Addr, WithClientName("go-operator"))
	if v := c.Server().Version; v != 3 {
		t.Fatalf("version %d", v)
	}
	info, err := c.ClusterInfo(ctx)
	if err != nil || info.NodeID != 0 || info.MetadataLeader != 0 || len(info.Nodes) != 0 || len(info.Partitions) != 0 {
		t.Fatalf("%+v %v", info, err)
	}
	if c.following() {
		t.Fatal("follows leaders with one broker")
	}

	topic := topicName(t)
	if err := c.CreateTopic(ctx, topic, TopicConfig{Storage: StorageMemory}); err != nil {
		t.Fatal(err)
	}
	msgs := make([]Message, 7)
	for i := range msgs {
		msgs[i] = Message{Body: []byte("x")}
	}
	if _, err := c.PublishBatch(ctx, topic, msgs); err != nil {
		t.Fatal(err)
	}
	if n, err := c.PurgeTopic(ctx, topic); err != nil || n != 7 {
		t.Fatalf("purged %d: %v", n, err)
	}

	// Paused: nothing delivered; resumed: delivered.
	sub, err := c.Subscribe(ctx, topic, SubscribeOptions{Subscription: "ops", Start: Start{Kind: StartEarliest}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close(ctx)
	if err := c.PauseSubscription(ctx, topic, "ops"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, topic, Message{Body: []byte("after the purge")}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = sub.Next(wctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a paused subscription delivered: %v", err)
	}
	if err := c.ResumeSubscription(ctx, topic, "ops"); err != nil {
		t.Fatal(err)
	}
	d, err := sub.Next(ctx)
	if err != nil || string(d.Message.Body) != "after the purge" {
		t.Fatalf("%v %v", d, err)
	}
	d.Ack(ctx)
	if err := c.PauseSubscription(ctx, topic, "nobody"); !errors.Is(err, ErrUnknownSubscription) {
		t.Fatalf("pause of an unknown subscription: %v", err)
	}

	// Another client, listed and closed by this one.
	other := connect(t, shared.Addr, WithClientName("go-victim"))
	var victim *Connection
	for after := uint64(0); victim == nil; {
		page, err := c.ListConnections(ctx, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		for i, conn := range page.Connections {
			if conn.ClientName == "go-victim" {
				victim = &page.Connections[i]
			}
		}
		if page.NextAfter == 0 {
			break
		}
		after = page.NextAfter
	}
	if victim == nil || victim.Listener != 0 || victim.TLS || !strings.HasPrefix(victim.Peer, "127.0.0.1:") {
		t.Fatalf("victim %+v", victim)
	}
	if err := c.CloseConnection(ctx, victim.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the closed connection to fail", func() bool {
		_, err := other.Ping(ctx)
		return errors.Is(err, ErrConnectionLost)
	})
	// Once the broker has let it go, its id is unknown.
	eventually(t, "closing it again to be refused", func() bool {
		return errors.Is(c.CloseConnection(ctx, victim.ID), ErrInvalidArgument)
	})
	if _, err := c.ListConnections(ctx, 0, 0); !errors.Is(err, ErrProtocol) {
		t.Fatalf("limit 0: %v", err)
	}
}

// fakeNode is a broker that speaks version 3 and says it is node id of a cluster; each
// connection after HELLO and CLUSTER_INFO is handed to serve with what the client sent.
type fakeNode struct {
	l     net.Listener
	id    uint64
	nodes []ClusterNode
	serve func(conn int, nc net.Conn, f Frame) bool // false closes the connection
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns int
	seen  []Frame // every request besides HELLO and CLUSTER_INFO
}

func newFakeNode(t *testing.T, id uint64) *fakeNode {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &fakeNode{l: l, id: id}
	t.Cleanup(func() { l.Close(); n.wg.Wait() })
	return n
}

func (n *fakeNode) addr() string { return n.l.Addr().String() }

func (n *fakeNode) run() {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		for {
			nc, err := n.l.Accept()
			if err != nil {
				return
			}
			n.mu.Lock()
			n.conns++
			index := n.conns
			n.mu.Unlock()
			n.wg.Add(1)
			go func() {
				defer n.wg.Done()
				defer nc.Close()
				for {
					f, err := readFrame(nc, DefaultFrameBytes)
					if err != nil {
						return
					}
					var answer Payload
					switch f.Payload.(type) {
					case *Hello:
						answer = &HelloOK{Version: 3, HeartbeatMs: 5000, FrameBytesMax: DefaultFrameBytes, MessageBytesMax: 1 << 18, Server: "fake"}
					case *ClusterInfoRequest:
						answer = &ClusterInfoReply{ClusterInfo{NodeID: n.id, MetadataLeader: n.id, Nodes: n.nodes, Partitions: []PartitionLeader{}}}
					case *Ping:
						answer = &Pong{}
					default:
						n.mu.Lock()
						n.seen = append(n.seen, f)
						serve := n.serve
						n.mu.Unlock()
						if !serve(index, nc, f) {
							return
						}
						continue
					}
					b, _ := EncodeFrame(nil, f.RequestID, answer)
					nc.Write(b)
				}
			}()
		}
	}()
}

// setServe changes how requests are answered, and forgets those seen.
func (n *fakeNode) setServe(serve func(conn int, nc net.Conn, f Frame) bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.serve, n.seen = serve, nil
}

func (n *fakeNode) requests() []Frame {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]Frame(nil), n.seen...)
}

func published(nc net.Conn, f Frame, offset uint64) {
	b, _ := EncodeFrame(nil, f.RequestID, &Published{Durability: DurabilitySynced, Ranges: []Range{{Partition: 0, Offset: offset, Count: uint32(len(f.Payload.(*Publish).Messages))}}})
	nc.Write(b)
}

// TestInDoubtPublishSentAgain: the connection is lost after a PUBLISH was sent. A publish whose
// messages carry dedup ids is sent again, the same bytes, on a new connection; one without fails
// as unknown and is not sent again.
func TestInDoubtPublishSentAgain(t *testing.T) {
	noLeaks(t)
	n := newFakeNode(t, 1)
	n.nodes = []ClusterNode{{ID: 1, Addr: n.addr()}}
	n.serve = func(conn int, nc net.Conn, f Frame) bool {
		if conn == 1 {
			return false // the first connection dies with the publish in flight
		}
		published(nc, f, 41)
		return true
	}
	n.run()
	ctx := testCtx(t)
	c := connect(t, n.addr())
	if !c.following() {
		t.Fatal("a node of a cluster, and the client does not follow leaders")
	}
	m := Message{Body: []byte("once")}.WithDedupID("d-1")
	id, err := c.Publish(ctx, "orders", m)
	if err != nil || id != (Position{0, 41}) {
		t.Fatalf("%v %v", id, err)
	}
	reqs := n.requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests", len(reqs))
	}
	for _, r := range reqs {
		p := r.Payload.(*Publish)
		if len(p.Messages) != 1 || string(p.Messages[0].Body) != "once" || p.Messages[0].Headers[0] != (Header{DedupHeader, "d-1"}) {
			t.Fatalf("%+v", p)
		}
	}

	// Without a dedup id: unknown, and sent once.
	n.setServe(func(conn int, nc net.Conn, f Frame) bool { return false })
	_, err = c.Publish(ctx, "orders", Message{Body: []byte("maybe")})
	if !errors.Is(err, ErrOutcomeUnknown) || errors.Is(err, ErrNotLeader) {
		t.Fatalf("%v", err)
	}
	if got := len(n.requests()); got != 1 {
		t.Fatalf("sent %d times", got)
	}
	c.Close()
}

// TestNotLeaderRedirects: a node answers not_leader naming another; the publish goes there,
// and the next one goes there at once. While no node knows a leader, the publish is retried
// until the leader timeout, and the last not_leader returned.
func TestNotLeaderRedirects(t *testing.T) {
	noLeaks(t)
	a, b := newFakeNode(t, 1), newFakeNode(t, 2)
	nodes := []ClusterNode{{ID: 1, Addr: a.addr()}, {ID: 2, Addr: b.addr()}}
	a.nodes, b.nodes = nodes, nodes
	a.serve = func(conn int, nc net.Conn, f Frame) bool {
		e, _ := EncodeFrame(nil, f.RequestID, &ErrorFrame{Code: uint16(CodeNotLeader), Message: "node 1 does not lead partition 0 of 'orders': node 2 at " + b.addr() + " does"})
		nc.Write(e)
		return true
	}
	b.serve = func(conn int, nc net.Conn, f Frame) bool {
		published(nc, f, 7)
		return true
	}
	a.run()
	b.run()
	ctx := testCtx(t)
	c := connect(t, a.addr(), WithLeaderTimeout(300*time.Millisecond))
	for i := 0; i < 3; i++ {
		if id, err := c.Publish(ctx, "orders", Message{Body: []byte("x")}); err != nil || id.Offset != 7 {
			t.Fatalf("%v %v", id, err)
		}
	}
	if got := len(a.requests()); got != 1 {
		t.Fatalf("node 1 got %d publishes, want the first only", got)
	}
	if got := len(b.requests()); got != 3 {
		t.Fatalf("node 2 got %d publishes", got)
	}

	// No leader anywhere: not_leader comes back after the leader timeout.
	b.setServe(func(conn int, nc net.Conn, f Frame) bool {
		e, _ := EncodeFrame(nil, f.RequestID, &ErrorFrame{Code: uint16(CodeNotLeader), Message: "partition 0 of 'orders' has no leader at the moment (an election is under way); retry"})
		nc.Write(e)
		return true
	})
	start := time.Now()
	_, err := c.Publish(ctx, "orders", Message{Body: []byte("x")})
	var nl *NotLeaderError
	if !errors.As(err, &nl) || nl.Topic != "orders" || time.Since(start) < 300*time.Millisecond {
		t.Fatalf("%v after %v", err, time.Since(start))
	}
	c.Close()
}

// TestPublishRetriedWhileReplicated: a leader refuses a publish whose dedup ids are still being
// replicated with storage_unavailable; the client sends it again and gets the first copy's id.
// A publish without dedup ids is not sent again.
func TestPublishRetriedWhileReplicated(t *testing.T) {
	noLeaks(t)
	n := newFakeNode(t, 1)
	n.nodes = []ClusterNode{{ID: 1, Addr: n.addr()}}
	refuse := func(nc net.Conn, f Frame) {
		e, _ := EncodeFrame(nil, f.RequestID, &ErrorFrame{Code: uint16(CodeStorageUnavailable), Message: "a publish with dedup id 'd-1' to 'orders' is still being replicated; retry once it is answered"})
		nc.Write(e)
	}
	var mu sync.Mutex
	calls := 0
	n.serve = func(conn int, nc net.Conn, f Frame) bool {
		mu.Lock()
		calls++
		first := calls == 1
		mu.Unlock()
		if first {
			refuse(nc, f)
		} else {
			published(nc, f, 5)
		}
		return true
	}
	n.run()
	ctx := testCtx(t)
	c := connect(t, n.addr())
	id, err := c.Publish(ctx, "orders", Message{Body: []byte("once")}.WithDedupID("d-1"))
	if err != nil || id != (Position{0, 5}) {
		t.Fatalf("%v %v", id, err)
	}
	if got := len(n.requests()); got != 2 {
		t.Fatalf("sent %d times", got)
	}
	n.setServe(func(conn int, nc net.Conn, f Frame) bool { refuse(nc, f); return true })
	if _, err := c.Publish(ctx, "orders", Message{Body: []byte("plain")}); !errors.Is(err, ErrStorageUnavailable) {
		t.Fatalf("%v", err)
	}
	if got := len(n.requests()); got != 1 {
		t.Fatalf("sent %d times", got)
	}
	c.Close()
}

// subscribeNode answers SUBSCRIBE as consumer cid and delivers records, answers ACK,
// NACK and UNSUBSCRIBE with OK, and closes the connection after an ACK when closeAfterAck.
func subscribeNode(cid uint32, records []DeliveryRecord, closeAfterAck bool) func(conn int, nc net.Conn, f Frame) bool {
	return func(conn int, nc net.Conn, f Frame) bool {
		var out []byte
		switch f.Payload.(type) {
		case *Subscribe:
			out, _ = EncodeFrame(nil, f.RequestID, &Subscribed{ConsumerID: cid + uint32(conn), Subscription: "workers", Partitions: 2})
			d, _ := EncodeFrame(nil, 0, &Deliver{ConsumerID: cid + uint32(conn), Deliveries: records})
			out = append(out, d...)
		case *Ack, *Nack, *Unsubscribe:
			if f.RequestID != 0 {
				out, _ = EncodeFrame(nil, f.RequestID, &OK{})
			}
			if _, ok := f.Payload.(*Ack); ok && closeAfterAck {
				nc.Write(out)
				return false
			}
		case *Credit:
		default:
			out, _ = EncodeFrame(nil, f.RequestID, &ErrorFrame{Code: uint16(CodeInvalidArgument), Message: "unexpected"})
		}
		nc.Write(out)
		return true
	}
}

// TestSubscribeAcrossNodes: against two nodes of a cluster, a subscription is attached on
// both, merges their deliveries, sends each ack to the node that delivered the message, and
// attaches again on a node whose connection broke; a delivery of the broken connection can no
// longer be acked. Close unsubscribes on both.
func TestSubscribeAcrossNodes(t *testing.T) {
	noLeaks(t)
	a, b := newFakeNode(t, 1), newFakeNode(t, 2)
	nodes := []ClusterNode{{ID: 1, Addr: a.addr()}, {ID: 2, Addr: b.addr()}}
	a.nodes, b.nodes = nodes, nodes
	rec := func(p uint32, o uint64) DeliveryRecord {
		return DeliveryRecord{Partition: p, Offset: o, Message: Message{Body: []byte(fmt.Sprintf("%d-%d", p, o))}}
	}
	a.serve = subscribeNode(10, []DeliveryRecord{rec(0, 1)}, false)
	b.serve = subscribeNode(20, []DeliveryRecord{rec(1, 2)}, true)
	a.run()
	b.run()
	ctx := testCtx(t)
	c := connect(t, a.addr())
	sub, err := c.Subscribe(ctx, "orders", SubscribeOptions{Subscription: "workers"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*Delivery{}
	for len(got) < 2 {
		d, err := sub.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got[string(d.Message.Body)] = d
	}
	// One call, one ACK per node; node 2 then closes the connection.
	if err := sub.Ack(ctx, got["0-1"], got["1-2"]); err != nil {
		t.Fatal(err)
	}
	acks := func(n *fakeNode) []Ack {
		var out []Ack
		for _, f := range n.requests() {
			if ack, ok := f.Payload.(*Ack); ok {
				out = append(out, *ack)
			}
		}
		return out
	}
	if ka, kb := acks(a), acks(b); len(ka) != 1 || len(kb) != 1 ||
		ka[0].ConsumerID != 10+2 || ka[0].Ranges[0] != (Range{Partition: 0, Offset: 1, Count: 1}) ||
		kb[0].ConsumerID != 20+1 || kb[0].Ranges[0] != (Range{Partition: 1, Offset: 2, Count: 1}) {
		t.Fatalf("node 1 got %+v, node 2 got %+v", ka, kb)
	}
	// Attached again on node 2 (its second connection), which delivers again.
	d, err := sub.Next(ctx)
	if err != nil || string(d.Message.Body) != "1-2" || d.cid != 20+2 {
		t.Fatalf("%+v %v", d, err)
	}
	if err := sub.Nack(ctx, NackOptions{}, got["1-2"]); !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("nack of a delivery of the broken connection: %v", err)
	}
	b.setServe(subscribeNode(20, nil, false))
	if err := sub.Release(ctx, d); err != nil {
		t.Fatal(err)
	}
	if rs := b.requests(); len(rs) != 1 || rs[0].Payload.(*Nack).ConsumerID != 20+2 || !rs[0].Payload.(*Nack).Release {
		t.Fatalf("%+v", rs)
	}
	if err := sub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	unsubscribed := func(n *fakeNode) bool {
		for _, f := range n.requests() {
			if _, ok := f.Payload.(*Unsubscribe); ok {
				return true
			}
		}
		return false
	}
	if !unsubscribed(a) || !unsubscribed(b) {
		t.Fatal("not unsubscribed on both nodes")
	}
	c.Close()
}
