package ferrymq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

type Ping2 struct {
	ID   int64  `bus:"id,key"`
	Text string `bus:"text"`
}

func (Ping2) BusType() string { return "Ping2" }

type statsLog struct {
	mu  sync.Mutex
	all []MessageStats
}

func (l *statsLog) add(s MessageStats) { l.mu.Lock(); l.all = append(l.all, s); l.mu.Unlock() }
func (l *statsLog) count(outcome string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.all {
		if s.Outcome == outcome {
			n++
		}
	}
	return n
}

func quietLogf(string, ...any) {}

func TestBusSendReceiveEverySerializer(t *testing.T) {
	noLeaks(t)
	c := connect(t, shared.Addr)
	ctx := testCtx(t)
	type OrderPlacedT struct {
		OrderID  int64   `bus:"order_id,key"`
		Customer string  `bus:"customer"`
		Total    float64 `bus:"total"`
		Express  bool    `bus:"express"`
	}
	for _, ser := range []string{"json", "deflate-json", "msgpack", "protobuf"} {
		t.Run(ser, func(t *testing.T) {
			topic := topicName(t)
			settings := BusSettings{Identity: "checkout", Shards: 4, Serializer: ser, TopicTemplate: topic + "-{type}"}
			sender, err := NewBus(c, settings, WithBusStorage(StorageMemory))
			if err != nil {
				t.Fatal(err)
			}
			recvSettings := settings
			recvSettings.Identity = "billing"
			recvBus, err := NewBus(c, recvSettings, WithBusStorage(StorageMemory))
			if err != nil {
				t.Fatal(err)
			}
			var log statsLog
			var mu sync.Mutex
			got := map[int64]OrderPlacedT{}
			afters := 0
			r := NewReceiver(recvBus, ReceiverOptions{OnStats: log.add, Logf: quietLogf})
			err = Handle(r, Handler[OrderPlacedT]{
				Before: func(ctx context.Context, m OrderPlacedT, mc *MessageContext) bool { return m.OrderID != 13 },
				Handle: func(ctx context.Context, m OrderPlacedT, mc *MessageContext) error {
					if mc.Sender != "checkout" || mc.Serializer != ser || mc.Attempt != 1 || mc.Type != "OrderPlacedT" {
						return fmt.Errorf("context %+v", mc)
					}
					if want, _ := ShardForKey(m.OrderID, 4); mc.Shard != want || int(mc.Delivery.Partition) != want {
						return fmt.Errorf("shard %d partition %d, want %d", mc.Shard, mc.Delivery.Partition, want)
					}
					mu.Lock()
					got[m.OrderID] = m
					mu.Unlock()
					return nil
				},
				After: func(ctx context.Context, m OrderPlacedT, mc *MessageContext) error {
					mu.Lock()
					afters++
					mu.Unlock()
					if m.OrderID == 5 {
						return errors.New("after failed: logged, the message stays handled")
					}
					return nil
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer r.Stop(ctx)
			var msgs []OrderPlacedT
			for i := int64(0); i < 20; i++ {
				msgs = append(msgs, OrderPlacedT{OrderID: i, Customer: fmt.Sprintf("c-%d ✓", i), Total: float64(i) / 10, Express: i%2 == 0})
			}
			ids, err := SendMany(ctx, sender, msgs)
			if err != nil || len(ids) != 20 {
				t.Fatalf("%v %v", ids, err)
			}
			if _, err := Send(ctx, sender, OrderPlacedT{OrderID: -1, Total: 1e21}); err != nil {
				t.Fatal(err)
			}
			eventually(t, "20 handled and 1 refused", func() bool { return log.count(OutcomeHandled) == 20 && log.count(OutcomeRefused) == 1 })
			mu.Lock()
			if afters != 20 {
				t.Fatalf("After ran %d times", afters)
			}
			for _, m := range msgs {
				if m.OrderID != 13 && got[m.OrderID] != m {
					t.Fatalf("got %+v, want %+v", got[m.OrderID], m)
				}
			}
			mu.Unlock()
			log.mu.Lock()
			for _, s := range log.all {
				if s.Prepared.IsZero() || s.Sent.Before(s.Prepared) || s.Received.Before(s.Sent.Add(-time.Second)) || s.Handled.Before(s.Received) || s.Handled.Location() != time.UTC || s.Size == 0 {
					t.Fatalf("stats %+v", s)
				}
			}
			log.mu.Unlock()
			if err := r.Stop(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestBusFailurePaths(t *testing.T) {
	noLeaks(t)
	c := connect(t, shared.Addr)
	ctx := testCtx(t)
	topic := topicName(t)
	settings := BusSettings{Identity: "svc", Shards: 2, Serializer: "json", TopicTemplate: topic}
	b, err := NewBus(c, settings, WithBusStorage(StorageMemory))
	if err != nil {
		t.Fatal(err)
	}
	var log statsLog
	r := NewReceiver(b, ReceiverOptions{OnStats: log.add, MaxAttempts: 2, Logf: quietLogf})
	calls := 0
	var mu sync.Mutex
	err = Handle(r, Handler[Ping2]{Handle: func(ctx context.Context, m Ping2, mc *MessageContext) error {
		mu.Lock()
		calls++
		mu.Unlock()
		switch m.Text {
		case "panic":
			panic("boom")
		case "fail":
			return errors.New("no")
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := Handle(r, Handler[Ping2]{Handle: func(context.Context, Ping2, *MessageContext) error { return nil }}); err == nil {
		t.Fatal("two handlers for one type accepted")
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.Stop(ctx)
	for _, text := range []string{"ok", "panic", "fail"} {
		if _, err := Send(ctx, b, Ping2{ID: 1, Text: text}); err != nil {
			t.Fatal(err)
		}
	}
	// A body the bus cannot read, an unknown serializer and an unknown type.
	raw := []Message{
		{Key: []byte("1"), Body: []byte("{broken"), Headers: []Header{{HeaderBusType, "Ping2"}, {HeaderBusSerializer, "json"}, {HeaderBusSender, "x"}}},
		{Key: []byte("1"), Body: []byte("{}"), Headers: []Header{{HeaderBusType, "Ping2"}, {HeaderBusSerializer, "yaml"}}},
		{Key: []byte("1"), Body: []byte("{}"), Headers: []Header{{HeaderBusType, "Nope"}, {HeaderBusSerializer, "json"}}},
	}
	if _, err := c.PublishBatch(ctx, topic, raw, ToPartition(1)); err != nil {
		t.Fatal(err)
	}
	// ok handled; panic and fail tried twice then dead-lettered by the broker; three dead-lettered at once.
	eventually(t, "outcomes", func() bool {
		return log.count(OutcomeHandled) == 1 && log.count(OutcomeFailed) == 4 && log.count(OutcomeDeadLettered) == 3
	})
	eventually(t, "dead letters stored", func() bool {
		info, err := c.DescribeTopic(ctx, topic+".dlq")
		return err == nil && info.Messages == 5
	})
	log.mu.Lock()
	for _, s := range log.all {
		if s.Outcome == OutcomeFailed && s.Error == "" || s.Outcome == OutcomeDeadLettered && s.Error == "" {
			t.Errorf("no reason: %+v", s)
		}
	}
	log.mu.Unlock()
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestBusListenedShardsAndServices(t *testing.T) {
	noLeaks(t)
	c := connect(t, shared.Addr)
	ctx := testCtx(t)
	topic := topicName(t)
	mk := func(identity, shards string, services ...string) *Bus {
		b, err := NewBus(c, BusSettings{Identity: identity, Shards: 8, Serializer: "json", TopicTemplate: topic, ListenShards: shards, ListenServices: services}, WithBusStorage(StorageMemory))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var log statsLog
	r := NewReceiver(mk("reader", "1,2,4-7", "alpha"), ReceiverOptions{OnStats: log.add, Logf: quietLogf})
	if err := Handle(r, Handler[Ping2]{Handle: func(context.Context, Ping2, *MessageContext) error { return nil }}); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.Stop(ctx)
	alpha, beta := mk("alpha", ""), mk("beta", "")
	want := map[string]int{}
	for id := int64(0); id < 16; id++ {
		shard := int(id % 8)
		listened := shard != 0 && shard != 3
		for _, b := range []*Bus{alpha, beta} {
			if _, err := Send(ctx, b, Ping2{ID: id}); err != nil {
				t.Fatal(err)
			}
			if listened && b == alpha {
				want[OutcomeHandled]++
			} else if listened {
				want[OutcomeSkipped]++
			}
		}
	}
	eventually(t, "handled and skipped", func() bool {
		return log.count(OutcomeHandled) == want[OutcomeHandled] && log.count(OutcomeSkipped) == want[OutcomeSkipped]
	})
	log.mu.Lock()
	for _, s := range log.all {
		if s.Shard == 0 || s.Shard == 3 {
			t.Fatalf("shard %d received", s.Shard)
		}
	}
	log.mu.Unlock()
}

func TestBusReceiverRun(t *testing.T) {
	noLeaks(t)
	c := connect(t, shared.Addr)
	ctx := testCtx(t)
	topic := topicName(t)
	b, err := NewBus(c, BusSettings{Identity: "runner", Shards: 1, Serializer: "protobuf", TopicTemplate: topic}, WithBusStorage(StorageMemory))
	if err != nil {
		t.Fatal(err)
	}
	handled := make(chan Ping2, 1)
	r := NewReceiver(b, ReceiverOptions{Logf: quietLogf})
	Handle(r, Handler[Ping2]{Handle: func(ctx context.Context, m Ping2, mc *MessageContext) error { handled <- m; return nil }})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	eventually(t, "the topic", func() bool { _, err := c.DescribeTopic(ctx, topic); return err == nil })
	if _, err := Send(ctx, b, Ping2{ID: 9, Text: "run"}); err != nil {
		t.Fatal(err)
	}
	if m := <-handled; m.Text != "run" {
		t.Fatalf("%+v", m)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// A deleted topic ends the subscription: Run returns the broker's error.
	r2 := NewReceiver(b, ReceiverOptions{Logf: quietLogf})
	Handle(r2, Handler[Ping2]{Handle: func(context.Context, Ping2, *MessageContext) error { return nil }})
	if err := r2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteTopic(ctx, topic); err != nil {
		t.Fatal(err)
	}
	if err := r2.Run(ctx); !errors.Is(err, ErrUnknownTopic) {
		t.Fatalf("run after the topic went: %v", err)
	}
}
