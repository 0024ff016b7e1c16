package ferrymq_test

import (
	"context"
	"errors"
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

func Example_cluster() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The nodes of a cluster, as FERRYMQ_ADDR=a:7070,b:7070,c:7070 gives them (Options{} reads
	// that variable): the client uses the first that answers and learns the others from it.
	seeds := ferrymq.SplitAddrs(ferrymq.ExampleClusterSeeds())
	c, err := ferrymq.Connect(ctx, ferrymq.Options{Addrs: seeds})
	if err != nil {
		panic(err)
	}
	defer c.Close()

	// Creating a topic needs the metadata leader, publishing the partition's leader: the client
	// finds them, also after a failover. A dedup id lets it send a publish whose outcome a lost
	// connection left unknown again, without storing it twice.
	if err := c.EnsureTopic(ctx, "cluster-quickstart", ferrymq.TopicConfig{Partitions: 1, Storage: ferrymq.StorageDisk}); err != nil {
		panic(err)
	}
	id, err := c.Publish(ctx, "cluster-quickstart", ferrymq.Message{Body: []byte("hello")}.WithDedupID(ferrymq.NewDedupID()))
	var notLeader *ferrymq.NotLeaderError
	if errors.As(err, &notLeader) {
		// No leader answered within Options.LeaderTimeout (15 s): an election that lasts.
		fmt.Println("no leader yet; the last one named:", notLeader.Leader, notLeader.LeaderAddr)
	}
	if err != nil {
		panic(err)
	}
	fmt.Println("published", id)

	// Only a partition's leader delivers its messages: the subscription is attached on every
	// node, and each ack goes to the node that delivered the message. Ack waits until the ack
	// is committed through the partition's group: the next leader does not deliver it again.
	sub, err := c.Subscribe(ctx, "cluster-quickstart", ferrymq.SubscribeOptions{Subscription: "billing", Start: ferrymq.Start{Kind: ferrymq.StartEarliest}})
	if err != nil {
		panic(err)
	}
	d, err := sub.Next(ctx)
	if err != nil {
		panic(err)
	}
	if err := d.Ack(ctx); err != nil {
		panic(err)
	}
	fmt.Printf("received %s (%v)\n", d.Message.Body, d.ID())
	if err := sub.Close(ctx); err != nil {
		panic(err)
	}

	info, err := c.ClusterInfo(ctx)
	if err != nil {
		panic(err)
	}
	// info.Leader(topic, partition) is the node leading a partition as the node asked sees it
	// (0: unknown, or an election under way), info.Addr(id) the address of a node.
	fmt.Println("nodes:", len(info.Nodes))
	// Output:
	// published 0-0
	// received hello (0-0)
	// nodes: 3
}
