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

func TestConnectPingClose(t *testing.T) {
	noLeaks(t)
	c := connect(t, shared.Addr)
	ctx := testCtx(t)
	if _, err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	s := c.Server()
	if s.Version < 1 || s.FrameBytesMax == 0 || s.MessageBytesMax == 0 || !strings.HasPrefix(s.Server, "ferrymq") {
		t.Fatalf("hello ok %+v", s)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Ping(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("ping after close: %v", err)
	}
}

func TestBrokerDownAtStart(t *testing.T) {
	noLeaks(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, err = Connect(testCtx(t), Options{Addr: addr})
	if err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("connect to nothing: %v", err)
	}
}

func TestConnectCancelled(t *testing.T) {
	noLeaks(t)
	// A listener that never answers HELLO.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			defer c.Close()
			buf := make([]byte, 1024)
			for {
				if _, err := c.Read(buf); err != nil {
					return
				}
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = Connect(ctx, Options{Addr: l.Addr().String()})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want a deadline error, got %v", err)
	}
}

func TestTopicAdmin(t *testing.T) {
	noLeaks(t)
	c := connect(t, shared.Addr)
	ctx := testCtx(t)
	name := topicName(t)
	if err := c.CreateTopic(ctx, name, TopicConfig{Partitions: 3, Storage: StorageMemory}); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateTopic(ctx, name, TopicConfig{}); !errors.Is(err, ErrTopicExists) {
		t.Fatalf("second create: %v", err)
	}
	if err := c.EnsureTopic(ctx, name, TopicConfig{}); err != nil {
		t.Fatal(err)
	}
	info, err := c.DescribeTopic(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != name || info.Config.Partitions != 3 || info.Config.Storage != StorageMemory || info.Config.MaxMessages == 0 {
		t.Fatalf("describe: %+v", info)
	}
	// A config left at its zero value leaves every choice to the broker: this one keeps
	// topics on disk, one partition, dropping the oldest when full.
	plain := topicName(t) + "-defaults"
	if err := c.CreateTopic(ctx, plain, TopicConfig{}); err != nil {
		t.Fatal(err)
	}
	defaults, err := c.DescribeTopic(ctx, plain)
	if err != nil {
		t.Fatal(err)
	}
	if defaults.Config.Storage != StorageDisk || defaults.Config.Overflow != OverflowDropOldest || defaults.Config.Partitions != 1 {
		t.Fatalf("a topic created with defaults: %+v", defaults.Config)
	}
	if err := c.DeleteTopic(ctx, plain); err != nil {
		t.Fatal(err)
	}
	list, err := c.ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, ti := range list {
		found = found || ti.Name == name
	}
	if !found {
		t.Fatalf("%s not listed", name)
	}
	if err := c.DeleteTopic(ctx, name); err != nil {
		t.Fatal(err)
	}
	_, err = c.DescribeTopic(ctx, name)
	var fe *Error
	if !errors.Is(err, ErrUnknownTopic) || !errors.As(err, &fe) || fe.Code != CodeUnknownTopic || !strings.Contains(fe.Message, name) {
		t.Fatalf("describe deleted: %v", err)
	}
	if err := c.CreateTopic(ctx, "bad name!", TopicConfig{}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad name: %v", err)
	}
	// A name the codec refuses never leaves the client.
	if err := c.CreateTopic(ctx, strings.Repeat("x", 256), TopicConfig{}); !errors.Is(err, ErrProtocol) {
		t.Fatalf("long name: %v", err)
	}
	if _, err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

func mustTopic(t *testing.T, c *Client, cfg TopicConfig) string {
	t.Helper()
	name := topicName(t)
	if err := c.CreateTopic(testCtx(t), name, cfg); err != nil {
		t.Fatal(err)
	}
	return name
}

func TestPublishSubscribeAck(t *testing.T) {
	noLeaks(t)
	c := connect(t, shared.Addr)
	ctx := testCtx(t)
	topic := mustTopic(t, c, TopicConfig{Partitions: 2, Storage: StorageMemory})
	sub, err := c.Subscribe(ctx, topic, SubscribeOptions{Subscription: "work", Start: Start{Kind: StartEarliest}, Window: 8})
	if err != nil {
		t.Fatal(err)
	}
	if sub.Name() != "work" || sub.Partitions() != 2 {
		t.Fatalf("subscribed %s %d", sub.Name(), sub.Partitions())
	}
	id, err := c.Publish(ctx, topic, Message{Key: []byte("k1"), Headers: []Header{{"h", "v"}}, Priority: 3, Body: []byte("hello")})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []Message
	for i := 0; i < 50; i++ {
		msgs = append(msgs, Message{Key: []byte(fmt.Sprint(i % 5)), Body: []byte(fmt.Sprintf("m%d", i))})
	}
	r, err := c.PublishBatch(ctx, topic, msgs)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.IDs) != 50 || r.Durability != DurabilityMemory {
		t.Fatalf("receipt %+v", r)
	}
	// Keys that are numbers go to key mod partitions.
	for i, p := range r.IDs {
		if p.Partition != uint32(i%5)%2 {
			t.Fatalf("message %d (key %d) in partition %d", i, i%5, p.Partition)
		}
	}
	want := map[Position]string{id: "hello"}
	for i, p := range r.IDs {
		want[p] = fmt.Sprintf("m%d", i)
	}
	got := 0
	for got < 51 {
		d, err := sub.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		body, ok := want[d.ID()]
		if !ok || body != string(d.Message.Body) || d.Attempt != 1 {
			t.Fatalf("unexpected delivery %v %q attempt %d", d.ID(), d.Message.Body, d.Attempt)
		}
		if d.ID() == id {
			if v, _ := d.Message.Header("h"); v != "v" || d.Message.Priority != 3 || string(d.Message.Key) != "k1" || d.Time().IsZero() {
				t.Fatalf("first message %+v", d.Message)
			}
		}
		delete(want, d.ID())
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
		got++
	}
	eventually(t, "acks counted", func() bool {
		st, err := c.Stats(ctx, topic)
		return err == nil && len(st) == 1 && len(st[0].Subscriptions) == 1 && st[0].Subscriptions[0].Acked == 51
	})
	if err := sub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Next(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("next after close: %v", err)
	}
	// The broker detaches the consumer after it answers UNSUBSCRIBE: wait for it.
	eventually(t, "the subscription deleted", func() bool {
		err := c.DeleteSubscription(ctx, topic, "work")
		if err != nil && !errors.Is(err, ErrConflict) {
			t.Fatal(err)
		}
		return err == nil
	})
	if err := c.DeleteSubscription(ctx, topic, "work"); !errors.Is(err, ErrUnknownSubscription) {
		t.Fatalf("second delete: %v", err)
	}
}

func TestCreditWindowBoundsDeliveries(t *testing.T) {
	noLeaks(t)
	c := connect(t, shared.Addr)
	ctx := testCtx(t)
	topic := mustTopic(t, c, TopicConfig{Storage: StorageMemory})
	msgs := make([]Message, 20)
	for i := range msgs {
		msgs[i] = Message{Body: []byte{byte(i)}}
	}
	if _, err := c.PublishBatch(ctx, topic, msgs); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, topic, SubscribeOptions{Subscription: "w", Start: Start{Kind: StartEarliest}, Window: 4})
	if err != nil {
		t.Fatal(err)
	}
	var held []*Delivery
	for len(held) < 4 {
		d, err := sub.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, d)
	}
	// Nothing more comes while four are unsettled: the broker shows exactly 4 in flight.
	eventually(t, "4 in flight", func() bool {
		st, err := c.Stats(ctx, topic)
		return err == nil && st[0].Subscriptions[0].InFlight == 4 && st[0].Subscriptions[0].Backlog == 16
	})
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if d, err := sub.Next(short); err == nil {
		t.Fatalf("a fifth delivery %v beyond the window", d.ID())
	}
	cancel()
	if err := sub.Ack(ctx, held...); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 16; i++ {
		d, err := sub.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := sub.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestNackDelayDeadLetterReleaseStatus(t *testing.T) {
	noLeaks(t)
	c := connect(t, shared.Addr)
	ctx := testCtx(t)
	topic := mustTopic(t, c, TopicConfig{Storage: StorageMemory, RetentionPolicy: RetentionStream})
	sub, err := c.Subscribe(ctx, topic, SubscribeOptions{Subscription: "s", Start: Start{Kind: StartEarliest}})
	if err != nil {
		t.Fatal(err)
	}
	id, err := c.Publish(ctx, topic, Message{Body: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	d, err := sub.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Release: the same attempt again.
	if err := d.Release(ctx); err != nil {
		t.Fatal(err)
	}
	d, err = sub.Next(ctx)
	if err != nil || d.Attempt != 1 {
		t.Fatalf("after release: %v attempt %d", err, d.Attempt)
	}
	// Nack with a delay: the next attempt, not before the delay.
	start := time.Now()
	if err := d.Nack(ctx, NackOptions{Delay: 200 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	st, err := c.MessageStatus(ctx, topic, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Subscriptions) != 1 || st.Subscriptions[0].Entry.State != StateDelayed && st.Subscriptions[0].Entry.State != StatePending {
		t.Fatalf("status after nack %+v", st)
	}
	d, err = sub.Next(ctx)
	if err != nil || d.Attempt != 2 || time.Since(start) < 150*time.Millisecond {
		t.Fatalf("after delayed nack: %v attempt %d after %v", err, d.Attempt, time.Since(start))
	}
	// Dead-letter it with a reason.
	if err := d.Nack(ctx, NackOptions{DeadLetter: true, Reason: "bad body"}); err != nil {
		t.Fatal(err)
	}
	var entry MessageEntry
	eventually(t, "dead lettered", func() bool {
		st, err := c.MessageStatus(ctx, topic, id)
		if err != nil || len(st.Subscriptions) != 1 {
			t.Logf("status: %v", err)
			return false
		}
		entry = st.Subscriptions[0].Entry
		return entry.State == StateDeadLettered && entry.DeadLetter != nil
	})
	if entry.Reason != "bad body" {
		t.Fatalf("entry %+v", entry)
	}
	list, err := c.ListMessages(ctx, topic, "s", ListDeadLettered, nil, 10)
	if err != nil || len(list.Entries) != 1 || list.Entries[0].Offset != id.Offset {
		t.Fatalf("dead-letter listing %+v %v", list, err)
	}
	// The dead letter is in <topic>.dlq with the broker's headers.
	dlq, err := c.Subscribe(ctx, topic+".dlq", SubscribeOptions{Start: Start{Kind: StartEarliest}})
	if err != nil {
		t.Fatal(err)
	}
	dl, err := dlq.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := dl.Message.Header("x-ferrymq-dead-reason"); v != "bad body" || string(dl.Message.Body) != "x" {
		t.Fatalf("dead letter %+v", dl.Message)
	}
	// Requeue it: it comes back to the subscription.
	rq, err := c.RequeueDead(ctx, topic+".dlq", Selection{All: true})
	if err != nil || rq.Requeued != 1 {
		t.Fatalf("requeue %+v %v", rq, err)
	}
	d, err = sub.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := d.Message.Header("x-ferrymq-requeue-for"); v != "s" {
		t.Fatalf("requeued %+v", d.Message)
	}
	if err := d.AckWithResult(ctx, []byte("done")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "acked with result", func() bool {
		l, err := c.ListMessages(ctx, topic, "s", ListAcked, nil, 10)
		return err == nil && len(l.Entries) == 1 && string(l.Entries[0].Result) == "done"
	})
	if _, err := c.MessageStatus(ctx, topic, Position{0, 999}); !errors.Is(err, ErrUnknownMessage) {
		t.Fatalf("unknown message: %v", err)
	}
	if err := dlq.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sub.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestDedupID(t *testing.T) {
	noLeaks(t)
	c := connect(t, shared.Addr)
	ctx := testCtx(t)
	topic := mustTopic(t, c, TopicConfig{Storage: StorageMemory})
	m := Message{Body: []byte("once")}.WithDedupID(NewDedupID())
	a, err := c.Publish(ctx, topic, m)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Publish(ctx, topic, m)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatalf("dedup gave %v then %v", a, b)
	}
	info, err := c.DescribeTopic(ctx, topic)
	if err != nil || info.Messages != 1 {
		t.Fatalf("%+v %v", info, err)
	}
}

func TestPublishLimits(t *testing.T) {
	noLeaks(t)
	b := newBroker(t, nil, "--message-max-bytes", "1024")
	c := connect(t, b.Addr)
	ctx := testCtx(t)
	topic := mustTopic(t, c, TopicConfig{Storage: StorageMemory})
	_, err := c.Publish(ctx, topic, Message{Body: make([]byte, 1025)})
	var le *LimitError
	if !errors.Is(err, ErrTooLarge) || !errors.As(err, &le) || le.Index != 0 {
		t.Fatalf("oversize body: %v", err)
	}
	_, err = c.PublishBatch(ctx, topic, []Message{{Body: []byte("ok")}, {Priority: 10}})
	if !errors.As(err, &le) || le.Index != 1 || !errors.Is(err, ErrProtocol) {
		t.Fatalf("priority 10: %v", err)
	}
	_, err = c.Publish(ctx, topic, Message{Key: make([]byte, 1025)})
	if !errors.Is(err, ErrProtocol) {
		t.Fatalf("long key: %v", err)
	}
	_, err = c.Publish(ctx, topic, Message{Body: []byte("x")}.WithDedupID(strings.Repeat("d", 300)))
	if !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("long dedup id: %v", err)
	}
	// A batch whose frame is above frame_bytes_max never leaves the client.
	big := make([]Message, c.Server().FrameBytesMax/1000+1)
	for i := range big {
		big[i].Body = make([]byte, 1000)
	}
	if _, err := c.PublishBatch(ctx, topic, big); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("batch above the frame limit: %v", err)
	}
	// Nothing was stored, and the connection still works.
	info, err := c.DescribeTopic(ctx, topic)
	if err != nil || info.Messages != 0 {
		t.Fatalf("%+v %v", info, err)
	}
	if _, err := c.Publish(ctx, topic, Message{Body: make([]byte, 1024)}); err != nil {
		t.Fatal(err)
	}
}

func TestPublishWindowAndConcurrency(t *testing.T) {
	noLeaks(t)
	c := connect(t, shared.Addr, WithPublishWindow(16))
	ctx := testCtx(t)
	topic := mustTopic(t, c, TopicConfig{Storage: StorageMemory, Partitions: 4})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	seen := sync.Map{}
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			var pend []*PendingPublish
			for i := 0; i < 100; i++ {
				pend = append(pend, c.PublishBatchAsync(ctx, topic, []Message{{Body: []byte(fmt.Sprint(g, i))}}))
			}
			for _, p := range pend {
				r, err := p.Wait(ctx)
				if err != nil {
					errs <- err
					return
				}
				if _, dup := seen.LoadOrStore(r.IDs[0], true); dup {
					errs <- fmt.Errorf("id %v twice", r.IDs[0])
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	info, err := c.DescribeTopic(ctx, topic)
	if err != nil || info.Messages != 800 {
		t.Fatalf("%+v %v", info, err)
	}
	// A batch larger than the window goes alone.
	big := make([]Message, 40)
	for i := range big {
		big[i].Body = []byte("b")
	}
	if r, err := c.PublishBatch(ctx, topic, big, ToPartition(2)); err != nil || len(r.IDs) != 40 || r.IDs[39].Partition != 2 {
		t.Fatalf("big batch: %v", err)
	}
}

func TestCancelledRequest(t *testing.T) {
	noLeaks(t)
	c := connect(t, shared.Addr)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Ping(ctx); !errors.Is(err, context.Canceled) || errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("cancelled before sending: %v", err)
	}
	topic := mustTopic(t, c, TopicConfig{Storage: StorageMemory})
	sub, err := c.Subscribe(testCtx(t), topic, SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	if _, err := sub.Next(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("next: %v", err)
	}
	// A publish whose wait is cut short after sending: outcome unknown, and it is stored.
	p := c.PublishBatchAsync(testCtx(t), topic, []Message{{Body: []byte("x")}})
	done, cancel3 := context.WithCancel(context.Background())
	cancel3()
	if _, err := p.Wait(done); err != nil && !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("wait cancelled: %v", err)
	}
	if r, err := p.Wait(testCtx(t)); err != nil || len(r.IDs) != 1 {
		t.Fatalf("receipt after all: %v", err)
	}
	if _, err := c.Ping(testCtx(t)); err != nil {
		t.Fatal(err)
	}
}

func TestWrongCredentials(t *testing.T) {
	noLeaks(t)
	ctx := testCtx(t)
	_, err := Connect(ctx, Options{Addr: shared.Addr}, WithCredentials("nobody", "wrong-password"))
	if !errors.Is(err, ErrAuthenticationFailed) {
		t.Fatalf("credentials on a broker without users: %v", err)
	}
}

func TestBrokerKilledAndRestarted(t *testing.T) {
	noLeaks(t)
	b := newBroker(t, nil)
	ctx := testCtx(t)
	c := connect(t, b.Addr, WithReconnect(Reconnect{InitialDelay: 20 * time.Millisecond, MaxDelay: 200 * time.Millisecond}), WithHeartbeat(200*time.Millisecond))
	topic := topicName(t)
	if err := c.CreateTopic(ctx, topic, TopicConfig{Storage: StorageDisk, Fsync: FsyncAlways}); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, topic, SubscribeOptions{Subscription: "durable", Start: Start{Kind: StartEarliest}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, topic, Message{Body: []byte("before")}); err != nil {
		t.Fatal(err)
	}
	d, err := sub.Next(ctx)
	if err != nil || string(d.Message.Body) != "before" {
		t.Fatalf("%v %v", d, err)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.restart(true); err != nil {
		t.Fatal(err)
	}
	// Requests wait for the reconnection; the consumer is attached again.
	var id Position
	eventually(t, "a publish after the restart", func() bool {
		id, err = c.Publish(ctx, topic, Message{Body: []byte("after")})
		return err == nil
	})
	d, err = sub.Next(ctx)
	if err != nil || string(d.Message.Body) != "after" || d.ID() != id {
		t.Fatalf("after restart: %v %v", d, err)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	sub.Close(ctx)
}

func TestConnectionLostWithoutReconnect(t *testing.T) {
	noLeaks(t)
	b := newBroker(t, nil)
	ctx := testCtx(t)
	c := connect(t, b.Addr)
	topic := mustTopic(t, c, TopicConfig{Storage: StorageMemory})
	sub, err := c.Subscribe(ctx, topic, SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b.stop(true)
	if _, err := sub.Next(ctx); !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("next: %v", err)
	}
	if _, err := c.Ping(ctx); !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("ping: %v", err)
	}
}

func TestTopicDeletedEndsConsumer(t *testing.T) {
	noLeaks(t)
	c := connect(t, shared.Addr)
	ctx := testCtx(t)
	topic := mustTopic(t, c, TopicConfig{Storage: StorageMemory})
	sub, err := c.Subscribe(ctx, topic, SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteTopic(ctx, topic); err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Next(ctx); !errors.Is(err, ErrUnknownTopic) {
		t.Fatalf("next after delete: %v", err)
	}
}

func TestHeartbeatsKeepIdleConnection(t *testing.T) {
	noLeaks(t)
	c := connect(t, shared.Addr, WithHeartbeat(100*time.Millisecond))
	if hb := c.Server().HeartbeatMs; hb != 100 {
		t.Fatalf("heartbeat %d", hb)
	}
	k, _ := c.conn(testCtx(t))
	// Idle for more than 3 intervals: the connection lives because both sides ping.
	start := k.lastRecv.Load()
	eventually(t, "several pings received", func() bool {
		return time.Duration(k.lastRecv.Load()-start) > 400*time.Millisecond
	})
	if _, err := c.Ping(testCtx(t)); err != nil || k.isClosed() {
		t.Fatal(err)
	}
}

func TestSilentPeerIsDropped(t *testing.T) {
	noLeaks(t)
	// A fake broker that answers HELLO and then says nothing at all.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	served := make(chan struct{})
	go func() {
		defer close(served)
		nc, err := l.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		if _, err := readFrame(nc, DefaultFrameBytes); err != nil {
			return
		}
		b, _ := EncodeFrame(nil, 1, &HelloOK{Version: 2, HeartbeatMs: 100, FrameBytesMax: DefaultFrameBytes, MessageBytesMax: 1 << 18, Server: "fake"})
		nc.Write(b)
		buf := make([]byte, 4096)
		for {
			if _, err := nc.Read(buf); err != nil {
				return
			}
		}
	}()
	c := connect(t, l.Addr().String())
	_, err = c.Ping(testCtx(t))
	if !errors.Is(err, ErrConnectionLost) || !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("ping to a silent peer: %v", err)
	}
	c.Close()
	<-served
}

func TestMalformedFrameFromPeer(t *testing.T) {
	noLeaks(t)
	for _, bad := range [][]byte{
		{0, 0, 0, 0x7f, 0x82, 0, 0, 0, 1, 0, 0, 0},    // a frame far above the limit
		{0, 0, 0, 0, 0x82, 0, 1, 0, 1, 0, 0, 0},       // flags set
		{1, 0, 0, 0, 0x82, 0, 0, 0, 2, 0, 0, 0, 0xff}, // OK with a trailing byte
		{0, 0, 0, 0, 0x7f, 0, 0, 0, 2, 0, 0, 0},       // unknown opcode
	} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			defer nc.Close()
			readFrame(nc, DefaultFrameBytes)
			b, _ := EncodeFrame(nil, 1, &HelloOK{Version: 2, HeartbeatMs: 5000, FrameBytesMax: 1 << 20, MessageBytesMax: 1 << 18, Server: "fake"})
			nc.Write(b)
			readFrame(nc, DefaultFrameBytes)
			nc.Write(bad)
			buf := make([]byte, 4096)
			for {
				if _, err := nc.Read(buf); err != nil {
					return
				}
			}
		}()
		c, err := Connect(testCtx(t), Options{Addr: l.Addr().String()})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Ping(testCtx(t))
		if !errors.Is(err, ErrConnectionLost) || !errors.Is(err, ErrProtocol) {
			t.Fatalf("%x: %v", bad, err)
		}
		c.Close()
		l.Close()
	}
}

func TestStatsAndPartitions(t *testing.T) {
	noLeaks(t)
	c := connect(t, shared.Addr)
	ctx := testCtx(t)
	topic := mustTopic(t, c, TopicConfig{Partitions: 8, Storage: StorageMemory})
	parts, err := ParsePartitions("1,2,4-7")
	if err != nil || len(parts) != 3 || parts[2] != (PartitionRange{4, 7}) {
		t.Fatalf("%v %v", parts, err)
	}
	if _, err := ParsePartitions("3-1"); err == nil {
		t.Fatal("backwards range accepted")
	}
	sub, err := c.Subscribe(ctx, topic, SubscribeOptions{Subscription: "p", Partitions: parts, AutoAck: true, Start: Start{Kind: StartEarliest}})
	if err != nil {
		t.Fatal(err)
	}
	for p := uint32(0); p < 8; p++ {
		if _, err := c.Publish(ctx, topic, Message{Body: []byte{byte(p)}}, ToPartition(p)); err != nil {
			t.Fatal(err)
		}
	}
	got := map[uint32]bool{}
	for len(got) < 6 {
		d, err := sub.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d.Partition == 0 || d.Partition == 3 {
			t.Fatalf("partition %d delivered", d.Partition)
		}
		got[d.Partition] = true
	}
	st, err := c.Stats(ctx, topic)
	if err != nil || len(st) != 1 || st[0].MessagesIn != 8 {
		t.Fatalf("%+v %v", st, err)
	}
	all, err := c.Stats(ctx, "")
	if err != nil || len(all) < 1 {
		t.Fatalf("%v", err)
	}
	sub.Close(ctx)
}

func TestNextBatchAckNoWait(t *testing.T) {
	noLeaks(t)
	c := connect(t, shared.Addr)
	ctx := testCtx(t)
	topic := mustTopic(t, c, TopicConfig{Storage: StorageMemory, RetentionPolicy: RetentionStream})
	msgs := make([]Message, 1000)
	for i := range msgs {
		msgs[i].Body = []byte(fmt.Sprint(i))
	}
	if _, err := c.PublishBatch(ctx, topic, msgs); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, topic, SubscribeOptions{Subscription: "b", Start: Start{Kind: StartEarliest}, Window: 100})
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for seen < 1000 {
		ds, err := sub.NextBatch(ctx, 64)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 0 || len(ds) > 64 {
			t.Fatalf("batch of %d", len(ds))
		}
		for _, d := range ds {
			if string(d.Message.Body) != fmt.Sprint(d.Offset) {
				t.Fatalf("offset %d body %s", d.Offset, d.Message.Body)
			}
		}
		if err := sub.AckNoWait(ds...); err != nil {
			t.Fatal(err)
		}
		seen += len(ds)
	}
	eventually(t, "1000 acked", func() bool {
		st, err := c.Stats(ctx, topic)
		return err == nil && st[0].Subscriptions[0].Acked == 1000
	})
	if err := sub.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestKilledMidStreamNothingLost(t *testing.T) {
	noLeaks(t)
	b := newBroker(t, nil)
	ctx := testCtx(t)
	c := connect(t, b.Addr, WithReconnect(Reconnect{InitialDelay: 20 * time.Millisecond, MaxDelay: 200 * time.Millisecond}))
	topic := mustTopic(t, c, TopicConfig{Storage: StorageDisk, Fsync: FsyncAlways, RetentionPolicy: RetentionStream})
	sub, err := c.Subscribe(ctx, topic, SubscribeOptions{Subscription: "all", Start: Start{Kind: StartEarliest}, Window: 16})
	if err != nil {
		t.Fatal(err)
	}
	const total = 200
	received := map[string]bool{}
	var mu sync.Mutex
	consumed := make(chan error, 1)
	go func() {
		for {
			mu.Lock()
			n := len(received)
			mu.Unlock()
			if n == total {
				consumed <- nil
				return
			}
			d, err := sub.Next(ctx)
			if err != nil {
				consumed <- err
				return
			}
			mu.Lock()
			received[string(d.Message.Body)] = true
			mu.Unlock()
			d.Ack(ctx) // an ack lost with the connection only means a redelivery
		}
	}()
	// The broker is killed while publishes and deliveries are under way.
	restarted := make(chan error, 1)
	go func() {
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			mu.Lock()
			n := len(received)
			mu.Unlock()
			if n >= total/4 {
				break
			}
		}
		restarted <- b.restart(true)
	}()
	retries := 0
	for i := 0; i < total; i++ {
		m := Message{Body: []byte(fmt.Sprintf("m%03d", i))}.WithDedupID(fmt.Sprintf("id-%d", i))
		for attempt := 0; ; attempt++ {
			_, err := c.Publish(ctx, topic, m)
			if err == nil {
				break
			}
			if !errors.Is(err, ErrConnectionLost) || attempt > 100 {
				t.Fatalf("publish %d: %v", i, err)
			}
			retries++
		}
	}
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	if err := <-consumed; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d publishes sent again", retries)
	info, err := c.DescribeTopic(ctx, topic)
	if err != nil || info.Messages != total {
		t.Fatalf("%d stored (%d retries), want %d: %v", info.Messages, retries, total, err)
	}
	if err := sub.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestAckNoWaitGatheredAndFlushed(t *testing.T) {
	noLeaks(t)
	c := connect(t, shared.Addr)
	ctx := testCtx(t)
	topic := mustTopic(t, c, TopicConfig{Storage: StorageMemory, RetentionPolicy: RetentionStream})
	msgs := make([]Message, 10)
	for i := range msgs {
		msgs[i].Body = []byte{byte(i)}
	}
	if _, err := c.PublishBatch(ctx, topic, msgs); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, topic, SubscribeOptions{Subscription: "g", Start: Start{Kind: StartEarliest}, Window: 1000})
	if err != nil {
		t.Fatal(err)
	}
	// Fewer acks than a quarter of the window: they go after a short while all the same,
	// while the application waits for nothing.
	for i := 0; i < 3; i++ {
		d, err := sub.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := sub.AckNoWait(d); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "3 acked", func() bool {
		st, err := c.Stats(ctx, topic)
		return err == nil && st[0].Subscriptions[0].Acked == 3
	})
	for i := 3; i < 10; i++ {
		d, err := sub.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sub.AckNoWait(d)
	}
	// Close sends what is still gathered.
	if err := sub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "10 acked", func() bool {
		st, err := c.Stats(ctx, topic)
		return err == nil && st[0].Subscriptions[0].Acked == 10
	})
}

func TestListMessagesPages(t *testing.T) {
	noLeaks(t)
	c := connect(t, shared.Addr)
	ctx := testCtx(t)
	topic := mustTopic(t, c, TopicConfig{Storage: StorageMemory})
	// The subscription exists before the messages come; a window of 1 takes one of them.
	sub, err := c.Subscribe(ctx, topic, SubscribeOptions{Subscription: "pages", Window: 1})
	if err != nil {
		t.Fatal(err)
	}
	msgs := make([]Message, 5)
	for i := range msgs {
		msgs[i].Body = []byte{byte(i)}
	}
	if _, err := c.PublishBatch(ctx, topic, msgs); err != nil {
		t.Fatal(err)
	}
	d, err := sub.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inflight, err := c.ListMessages(ctx, topic, "pages", ListInFlight, nil, 10)
	if err != nil || len(inflight.Entries) != 1 || inflight.Entries[0].Offset != d.Offset || inflight.Entries[0].State != StateInFlight {
		t.Fatalf("in flight %+v %v", inflight, err)
	}
	var offsets []uint64
	var page []byte
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatal("too many pages")
		}
		l, err := c.ListMessages(ctx, topic, "pages", ListPending, page, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Entries) > 2 {
			t.Fatalf("%d entries on a page of 2", len(l.Entries))
		}
		for _, e := range l.Entries {
			offsets = append(offsets, e.Offset)
		}
		if len(l.NextPage) == 0 {
			break
		}
		page = l.NextPage
	}
	if fmt.Sprint(offsets) != "[1 2 3 4]" {
		t.Fatalf("pending %v", offsets)
	}
	if _, err := c.ListMessages(ctx, topic, "pages", ListPending, nil, 0); !errors.Is(err, ErrProtocol) {
		t.Fatalf("limit 0: %v", err)
	}
	if err := sub.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestOrderedSubscriptionOneInFlightPerKey(t *testing.T) {
	noLeaks(t)
	c := connect(t, shared.Addr)
	ctx := testCtx(t)
	topic := mustTopic(t, c, TopicConfig{Storage: StorageMemory})
	sub, err := c.Subscribe(ctx, topic, SubscribeOptions{Subscription: "o", Ordered: true, Window: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PublishBatch(ctx, topic, []Message{{Key: []byte("k"), Body: []byte("1")}, {Key: []byte("k"), Body: []byte("2")}}); err != nil {
		t.Fatal(err)
	}
	d, err := sub.Next(ctx)
	if err != nil || string(d.Message.Body) != "1" {
		t.Fatalf("%v %v", d, err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if d2, err := sub.Next(short); err == nil {
		t.Fatalf("second message of the key %s while the first is in flight", d2.Message.Body)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	d, err = sub.Next(ctx)
	if err != nil || string(d.Message.Body) != "2" {
		t.Fatalf("%v %v", d, err)
	}
	d.Ack(ctx)
	if _, err := c.Subscribe(ctx, topic, SubscribeOptions{Ordered: true, AutoAck: true}); !errors.Is(err, ErrProtocol) {
		t.Fatalf("ordered with auto-ack: %v", err)
	}
	if err := sub.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestFrozenPeerDoesNotBlockWriters(t *testing.T) {
	noLeaks(t)
	// A fake broker that answers HELLO, then neither reads nor writes.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	release := make(chan struct{})
	served := make(chan struct{})
	go func() {
		defer close(served)
		nc, err := l.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		readFrame(nc, DefaultFrameBytes)
		b, _ := EncodeFrame(nil, 1, &HelloOK{Version: 2, HeartbeatMs: 100, FrameBytesMax: DefaultFrameBytes, MessageBytesMax: 1 << 20, Server: "frozen"})
		nc.Write(b)
		<-release
	}()
	c := connect(t, l.Addr().String())
	body := make([]byte, 1<<20)
	var lastErr error
	// Publishes fill the socket buffers; then they fail instead of blocking forever.
	for i := 0; i < 64 && lastErr == nil; i++ {
		_, lastErr = c.Publish(testCtx(t), "t", Message{Body: body})
	}
	if !errors.Is(lastErr, ErrConnectionLost) {
		t.Fatalf("publish to a frozen peer: %v", lastErr)
	}
	c.Close()
	close(release)
	<-served
}

func TestReconnectGivesUp(t *testing.T) {
	noLeaks(t)
	b := newBroker(t, nil)
	ctx := testCtx(t)
	c := connect(t, b.Addr, WithReconnect(Reconnect{InitialDelay: 10 * time.Millisecond, MaxDelay: 20 * time.Millisecond, MaxAttempts: 3}))
	topic := mustTopic(t, c, TopicConfig{Storage: StorageMemory})
	sub, err := c.Subscribe(ctx, topic, SubscribeOptions{Subscription: "s"})
	if err != nil {
		t.Fatal(err)
	}
	b.stop(true)
	// Requests wait for the reconnection, then fail once it gives up.
	if _, err := c.Ping(ctx); !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("ping: %v", err)
	}
	if _, err := sub.Next(ctx); !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("next: %v", err)
	}
	if _, err := c.Publish(ctx, topic, Message{Body: []byte("x")}); !errors.Is(err, ErrConnectionLost) || errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("publish after giving up: %v", err)
	}
}
