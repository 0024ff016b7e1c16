package ferrymq

import (
	"context"
	"errors"
	"net"
	"strings"
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
