// Command ferrymq-bench measures the Go client against a broker: publishing batches with
// receipts, and consuming with acks. It starts its own broker (from --bin or $FERRYMQ_BIN, on
// free loopback ports and a temporary data directory) unless --addr is given.
//
//	go run ./cmd/ferrymq-bench --messages 1000000 --storage disk
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	ferrymq "github.com/ferrymq/ferrymq/clients/go"
)

type result struct {
	Scenario    string  `json:"scenario"`
	Messages    int     `json:"messages"`
	Seconds     float64 `json:"seconds"`
	PerSecond   float64 `json:"msg_per_s"`
	CPUNsPerMsg float64 `json:"client_cpu_ns_per_msg"`
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func measure(name string, n int, f func() error) (result, error) {
	cpu0, t0 := cpuTime(), time.Now()
	if err := f(); err != nil {
		return result{}, fmt.Errorf("%s: %w", name, err)
	}
	secs := time.Since(t0).Seconds()
	return result{Scenario: name, Messages: n, Seconds: secs, PerSecond: float64(n) / secs, CPUNsPerMsg: float64(cpuTime()-cpu0) / float64(n)}, nil
}

func startBroker(bin string) (string, func(), error) {
	dir, err := os.MkdirTemp("", "ferrymq-bench-")
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
	return "", nil, fmt.Errorf("the broker did not start")
}

func main() {
	addr := flag.String("addr", "", "broker address; empty starts one")
	bin := flag.String("bin", os.Getenv("FERRYMQ_BIN"), "broker binary to start")
	messages := flag.Int("messages", 1_000_000, "messages per scenario")
	batch := flag.Int("batch", 1000, "messages per publish")
	bodySize := flag.Int("body", 100, "body bytes")
	storage := flag.String("storage", "disk", "disk or memory")
	inflight := flag.Int("inflight", 16, "batches in flight")
	window := flag.Uint("window", 4096, "consumer credit window")
	asJSON := flag.Bool("json", false, "print JSON lines")
	flag.Parse()
	if *addr == "" {
		if *bin == "" {
			fmt.Fprintln(os.Stderr, "give --addr, or --bin / $FERRYMQ_BIN to start a broker")
			os.Exit(2)
		}
		a, stop, err := startBroker(*bin)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer stop()
		*addr = a
	}
	if err := run(*addr, *messages, *batch, *bodySize, *storage, *inflight, uint32(*window), *asJSON); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(addr string, n, batch, bodySize int, storage string, inflight int, window uint32, asJSON bool) error {
	ctx := context.Background()
	c, err := ferrymq.Connect(ctx, ferrymq.Options{Addr: addr}, ferrymq.WithPublishWindow(batch*inflight))
	if err != nil {
		return err
	}
	defer c.Close()
	st := ferrymq.StorageDisk
	if storage == "memory" {
		st = ferrymq.StorageMemory
	}
	topic := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	if err := c.CreateTopic(ctx, topic, ferrymq.TopicConfig{Storage: st, MaxMessages: ferrymq.NoLimit, MaxBytes: ferrymq.NoLimit, RetentionPolicy: ferrymq.RetentionStream}); err != nil {
		return err
	}
	body := make([]byte, bodySize)
	msgs := make([]ferrymq.Message, batch)
	for i := range msgs {
		msgs[i] = ferrymq.Message{Body: body}
	}
	var results []result
	r, err := measure(fmt.Sprintf("publish, batches of %d, receipts (%s)", batch, storage), n, func() error {
		var pending []*ferrymq.PendingPublish
		for sent := 0; sent < n; sent += batch {
			m := msgs
			if n-sent < batch {
				m = msgs[:n-sent]
			}
			pending = append(pending, c.PublishBatchAsync(ctx, topic, m))
			if len(pending) >= 2*inflight {
				for _, p := range pending {
					if _, err := p.Wait(ctx); err != nil {
						return err
					}
				}
				pending = pending[:0]
			}
		}
		for _, p := range pending {
			if _, err := p.Wait(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	results = append(results, r)
	sub, err := c.Subscribe(ctx, topic, ferrymq.SubscribeOptions{Subscription: "bench", Start: ferrymq.Start{Kind: ferrymq.StartEarliest}, Window: window})
	if err != nil {
		return err
	}
	r, err = measure(fmt.Sprintf("consume + ack, acks batched per read (%s)", storage), n, func() error {
		for got := 0; got < n; {
			ds, err := sub.NextBatch(ctx, n-got)
			if err != nil {
				return err
			}
			if err := sub.AckNoWait(ds...); err != nil {
				return err
			}
			got += len(ds)
		}
		return nil
	})
	if err != nil {
		return err
	}
	results = append(results, r)
	sub.Close(ctx)
	// The same messages again, under a second subscription, acked one by one.
	sub, err = c.Subscribe(ctx, topic, ferrymq.SubscribeOptions{Subscription: "bench-each", Start: ferrymq.Start{Kind: ferrymq.StartEarliest}, Window: window})
	if err != nil {
		return err
	}
	r, err = measure(fmt.Sprintf("consume + ack each message, no wait (%s)", storage), n, func() error {
		for got := 0; got < n; got++ {
			d, err := sub.Next(ctx)
			if err != nil {
				return err
			}
			if err := sub.AckNoWait(d); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	results = append(results, r)
	sub.Close(ctx)
	for _, r := range results {
		if asJSON {
			b, _ := json.Marshal(r)
			fmt.Println(string(b))
		} else {
			fmt.Printf("%-55s %9d msg in %6.2f s: %10.0f msg/s, client CPU %6.0f ns/msg\n", r.Scenario, r.Messages, r.Seconds, r.PerSecond, r.CPUNsPerMsg)
		}
	}
	return nil
}
