// Command natsbench compares FerryMQ with NATS JetStream in the same run, on the same machine:
// N messages published with acknowledgements (a window of publishes in flight), then
// pull-consumed with acks, on durable storage (a JetStream file stream; a FerryMQ disk topic
// with the default fsync). Both servers start on 127.0.0.1 with temporary data directories;
// the rounds alternate between the two and the medians are reported.
//
//	go run . --ferrymq ../../../../target/release/ferrymq --nats-server $(which nats-server)
//
// It is a module of its own so that the client module does not depend on nats.go.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"

	ferrymq "github.com/ferrymq/ferrymq/clients/go"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

type config struct {
	n, body, window, batch int
}

func main() {
	ferryBin := flag.String("ferrymq", os.Getenv("FERRYMQ_BIN"), "ferrymq binary")
	natsBin := flag.String("nats-server", "nats-server", "nats-server binary")
	n := flag.Int("messages", 200_000, "messages per round")
	body := flag.Int("body", 100, "body bytes")
	window := flag.Int("window", 16_000, "publishes in flight (messages), and the consumers' ack window")
	batch := flag.Int("batch", 1000, "FerryMQ publish batch, and the fetch size of both consumers")
	rounds := flag.Int("rounds", 3, "rounds of each")
	flag.Parse()
	cfg := config{n: *n, body: *body, window: *window, batch: *batch}
	if err := run(*ferryBin, *natsBin, *rounds, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "natsbench:", err)
		os.Exit(1)
	}
}

func run(ferryBin, natsBin string, rounds int, cfg config) error {
	if ferryBin == "" {
		return fmt.Errorf("give --ferrymq or $FERRYMQ_BIN")
	}
	fAddr, fStop, err := startFerry(ferryBin)
	if err != nil {
		return err
	}
	defer fStop()
	nURL, nStop, err := startNats(natsBin)
	if err != nil {
		return err
	}
	defer nStop()
	var fp, fc, np, nc []float64
	for i := 0; i < rounds; i++ {
		p, c, err := roundNats(nURL, i, cfg)
		if err != nil {
			return fmt.Errorf("jetstream: %w", err)
		}
		fmt.Printf("round %d jetstream: publish %10.0f msg/s, consume %10.0f msg/s\n", i+1, p, c)
		np, nc = append(np, p), append(nc, c)
		p, c, err = roundFerry(fAddr, i, cfg)
		if err != nil {
			return fmt.Errorf("ferrymq: %w", err)
		}
		fmt.Printf("round %d ferrymq:   publish %10.0f msg/s, consume %10.0f msg/s\n", i+1, p, c)
		fp, fc = append(fp, p), append(fc, c)
	}
	mfp, mfc, mnp, mnc := median(fp), median(fc), median(np), median(nc)
	fmt.Printf("median publish: ferrymq %.0f, jetstream %.0f msg/s: %.2fx\n", mfp, mnp, mfp/mnp)
	fmt.Printf("median consume: ferrymq %.0f, jetstream %.0f msg/s: %.2fx\n", mfc, mnc, mfc/mnc)
	return nil
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startNats(bin string) (string, func(), error) {
	dir, err := os.MkdirTemp("", "natsbench-js-")
	if err != nil {
		return "", nil, err
	}
	port, err := freePort()
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "-js", "-a", "127.0.0.1", "-p", fmt.Sprint(port), "-sd", dir)
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		os.RemoveAll(dir)
	}
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if nc, err := nats.Connect(url); err == nil {
			nc.Close()
			return url, stop, nil
		}
	}
	stop()
	return "", nil, fmt.Errorf("nats-server did not start")
}

func startFerry(bin string) (string, func(), error) {
	dir, err := os.MkdirTemp("", "natsbench-ferrymq-")
	if err != nil {
		return "", nil, err
	}
	logPath := filepath.Join(dir, "broker.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "serve", "--data-dir", filepath.Join(dir, "data"), "--tcp-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log", "warn,ferrymq=info")
	cmd.Stderr = logf
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FERRYMQ_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		logf.Close()
		os.RemoveAll(dir)
	}
	re := regexp.MustCompile(`serving the binary protocol tcp=(\S+)`)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		text, _ := os.ReadFile(logPath)
		if m := re.FindSubmatch(text); m != nil {
			return string(m[1]), stop, nil
		}
	}
	stop()
	return "", nil, fmt.Errorf("ferrymq did not start")
}

func rate(n int, t0 time.Time) float64 { return float64(n) / time.Since(t0).Seconds() }

func roundNats(url string, round int, cfg config) (float64, float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	nc, err := nats.Connect(url)
	if err != nil {
		return 0, 0, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(cfg.window))
	if err != nil {
		return 0, 0, err
	}
	name := fmt.Sprintf("bench%d", round)
	subject := name + ".data"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Storage: jetstream.FileStorage}); err != nil {
		return 0, 0, err
	}
	defer js.DeleteStream(context.Background(), name)
	body := make([]byte, cfg.body)
	t0 := time.Now()
	for i := 0; i < cfg.n; i++ {
		if _, err := js.PublishAsync(subject, body); err != nil {
			return 0, 0, err
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	pub := rate(cfg.n, t0)
	if info, err := js.Stream(ctx, name); err != nil {
		return 0, 0, err
	} else if got := info.CachedInfo().State.Msgs; got != uint64(cfg.n) {
		return 0, 0, fmt.Errorf("stream holds %d messages, want %d", got, cfg.n)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: cfg.window})
	if err != nil {
		return 0, 0, err
	}
	t0 = time.Now()
	for got := 0; got < cfg.n; {
		batch, err := cons.FetchNoWait(min(cfg.batch, cfg.n-got))
		if err != nil {
			return 0, 0, err
		}
		k := 0
		for m := range batch.Messages() {
			if err := m.Ack(); err != nil {
				return 0, 0, err
			}
			k++
		}
		if err := batch.Error(); err != nil {
			return 0, 0, err
		}
		if k == 0 {
			if ctx.Err() != nil {
				return 0, 0, ctx.Err()
			}
			time.Sleep(time.Millisecond)
		}
		got += k
	}
	if err := nc.Flush(); err != nil {
		return 0, 0, err
	}
	return pub, rate(cfg.n, t0), nil
}

func roundFerry(addr string, round int, cfg config) (float64, float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := ferrymq.Connect(ctx, ferrymq.Options{Addr: addr}, ferrymq.WithPublishWindow(cfg.window))
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	topic := fmt.Sprintf("bench%d", round)
	if err := c.CreateTopic(ctx, topic, ferrymq.TopicConfig{Storage: ferrymq.StorageDisk, MaxMessages: ferrymq.NoLimit, MaxBytes: ferrymq.NoLimit}); err != nil {
		return 0, 0, err
	}
	defer c.DeleteTopic(context.Background(), topic)
	body := make([]byte, cfg.body)
	msgs := make([]ferrymq.Message, cfg.batch)
	for i := range msgs {
		msgs[i] = ferrymq.Message{Body: body}
	}
	inflight := max(1, cfg.window/cfg.batch)
	t0 := time.Now()
	var pending []*ferrymq.PendingPublish
	wait := func() error {
		for _, p := range pending {
			if _, err := p.Wait(ctx); err != nil {
				return err
			}
		}
		pending = pending[:0]
		return nil
	}
	for sent := 0; sent < cfg.n; sent += cfg.batch {
		pending = append(pending, c.PublishBatchAsync(ctx, topic, msgs[:min(cfg.batch, cfg.n-sent)]))
		if len(pending) >= 2*inflight {
			if err := wait(); err != nil {
				return 0, 0, err
			}
		}
	}
	if err := wait(); err != nil {
		return 0, 0, err
	}
	pub := rate(cfg.n, t0)
	sub, err := c.Subscribe(ctx, topic, ferrymq.SubscribeOptions{Subscription: "bench", Start: ferrymq.Start{Kind: ferrymq.StartEarliest}, Window: uint32(cfg.window)})
	if err != nil {
		return 0, 0, err
	}
	defer sub.Close(context.Background())
	t0 = time.Now()
	for got := 0; got < cfg.n; {
		ds, err := sub.NextBatch(ctx, min(cfg.batch, cfg.n-got))
		if err != nil {
			return 0, 0, err
		}
		if err := sub.AckNoWait(ds...); err != nil {
			return 0, 0, err
		}
		got += len(ds)
	}
	return pub, rate(cfg.n, t0), nil
}
