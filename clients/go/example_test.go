package ferrymq_test

import (
	"context"
	"fmt"
	"os"
	"time"

	ferrymq "github.com/ferrymq/ferrymq/clients/go"
)

// brokerAddr is where the examples' broker listens: TestMain starts one and sets
// FERRYMQ_EXAMPLE_ADDR; a real program would use 127.0.0.1:7070 or its settings.
func brokerAddr() string { return os.Getenv("FERRYMQ_EXAMPLE_ADDR") }

func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	c, err := ferrymq.Connect(ctx, ferrymq.Options{Addr: brokerAddr()})
	if err != nil {
		panic(err)
	}
	defer c.Close()

	if err := c.CreateTopic(ctx, "quickstart", ferrymq.TopicConfig{Partitions: 2}); err != nil {
		panic(err)
	}
	id, err := c.Publish(ctx, "quickstart", ferrymq.Message{Key: []byte("customer-42"), Body: []byte("hello")})
	if err != nil {
		panic(err)
	}
	fmt.Println("published", id)

	sub, err := c.Subscribe(ctx, "quickstart", ferrymq.SubscribeOptions{
		Subscription: "billing",
		Start:        ferrymq.Start{Kind: ferrymq.StartEarliest},
	})
	if err != nil {
		panic(err)
	}
	defer sub.Close(ctx)
	d, err := sub.Next(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Printf("received %s: %s (attempt %d)\n", d.ID(), d.Message.Body, d.Attempt)
	if err := d.Ack(ctx); err != nil {
		panic(err)
	}
	// Output:
	// published 0-0
	// received 0-0: hello (attempt 1)
}

// Greeting is a bus message type: its key field picks the shard.
type Greeting struct {
	ID   int64  `bus:"id,key"`
	Text string `bus:"text"`
}

func Example_bus() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	c, err := ferrymq.Connect(ctx, ferrymq.Options{Addr: brokerAddr()})
	if err != nil {
		panic(err)
	}
	defer c.Close()

	// Settings come from FERRYMQ_BUS_* variables; here they are given in code.
	settings, err := ferrymq.LoadBusSettings(nil, func(s *ferrymq.BusSettings) {
		s.Identity, s.Shards, s.Serializer = "greeter", 4, "msgpack"
	})
	if err != nil {
		panic(err)
	}
	bus, err := ferrymq.NewBus(c, settings)
	if err != nil {
		panic(err)
	}

	done := make(chan struct{})
	r := ferrymq.NewReceiver(bus, ferrymq.ReceiverOptions{
		OnStats: func(s ferrymq.MessageStats) {
			fmt.Println(s.Type, s.Outcome, "in shard", s.Shard)
			close(done)
		},
	})
	err = ferrymq.Handle(r, ferrymq.Handler[Greeting]{
		Handle: func(ctx context.Context, g Greeting, mc *ferrymq.MessageContext) error {
			fmt.Printf("%d: %s (from %s)\n", g.ID, g.Text, mc.Sender)
			return nil
		},
	})
	if err != nil {
		panic(err)
	}
	if err := r.Start(ctx); err != nil {
		panic(err)
	}
	defer r.Stop(ctx)

	if _, err := ferrymq.Send(ctx, bus, Greeting{ID: 7, Text: "hello, bus"}); err != nil {
		panic(err)
	}
	<-done
	// Output:
	// 7: hello, bus (from greeter)
	// Greeting handled in shard 3
}
