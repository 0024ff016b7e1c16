// Command clusterbench measures the Go client against a single node and against a cluster of
// three nodes in the same run: N messages published in batches with receipts (each batch to
// one partition, which in the cluster goes to that partition's leader), then consumed with acks
// by one subscription (in the cluster attached on every node). The nodes start on 127.0.0.1 with
// temporary data directories and the broker's defaults (disk topics, fsync=always); the rounds
// alternate between the two and the medians are reported.
//
//	go run ./bench/cluster --bin ../../target/release/ferrymq --messages 200000
package main

import (
	"context"
	"errors"
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
)

type config struct {
	n, body, window, batch, partitions int
}

func main() {
	bin := flag.String("bin", os.Getenv("FERRYMQ_BIN"), "ferrymq binary")
	n := flag.Int("messages", 200_000, "messages per round")
	body := flag.Int("body", 100, "body bytes")
	window := flag.Int("window", 16_000, "messages in unconfirmed publishes, and the consumer's credit window")
	batch := flag.Int("batch", 1000, "messages per publish batch, and per NextBatch")
	partitions := flag.Int("partitions", 3, "partitions of each topic")
	rounds := flag.Int("rounds", 3, "rounds of each")
	flag.Parse()
	cfg := config{n: *n, body: *body, window: *window, batch: *batch, partitions: *partitions}
	if err := run(*bin, *rounds, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "clusterbench:", err)
		os.Exit(1)
	}
}

func run(bin string, rounds int, cfg config) error {
	if bin == "" {
		return errors.New("give --bin or $FERRYMQ_BIN")
	}
	dir, err := os.MkdirTemp("", "clusterbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	single, err := startNodes(bin, filepath.Join(dir, "single"), 1)
	if err != nil {
		return err
	}
	defer single.stop()
	cluster, err := startNodes(bin, filepath.Join(dir, "cluster"), 3)
	if err != nil {
		return err
	}
	defer cluster.stop()
	targets := []struct {
		name  string
		nodes *nodes
	}{{"single node", single}, {"3-node cluster", cluster}}
	pubs := make([][]float64, len(targets))
	cons := make([][]float64, len(targets))
	for r := 0; r < rounds; r++ {
		for i, t := range targets {
			p, c, err := round(t.nodes, fmt.Sprintf("bench%d", r), cfg)
			if err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
			fmt.Printf("round %d %-15s publish %10.0f msg/s, consume %10.0f msg/s\n", r+1, t.name+":", p, c)
			pubs[i], cons[i] = append(pubs[i], p), append(cons[i], c)
		}
	}
	for i, t := range targets {
		fmt.Printf("median %-15s publish %10.0f msg/s, consume %10.0f msg/s\n", t.name+":", median(pubs[i]), median(cons[i]))
	}
	fmt.Printf("cluster / single: publish %.2f, consume %.2f\n", median(pubs[1])/median(pubs[0]), median(cons[1])/median(cons[0]))
	return nil
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// nodes are the broker processes of one target: one node, or the nodes of a cluster.
type nodes struct {
	addrs []string
	cmds  []*exec.Cmd
}

func (ns *nodes) stop() {
	for _, c := range ns.cmds {
		c.Process.Signal(syscall.SIGTERM)
		c.Wait()
	}
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// startNodes starts count nodes in dir: a broker that runs alone for 1, else a cluster.
func startNodes(bin, dir string, count int) (*nodes, error) {
	tcp := make([]string, count)
	peers := make([]string, count)
	for i := range tcp {
		var err error
		if tcp[i], err = freeAddr(); err != nil {
			return nil, err
		}
		p, err := freeAddr()
		if err != nil {
			return nil, err
		}
		peers[i] = fmt.Sprintf("%d=%s", i+1, p)
	}
	ns := &nodes{addrs: tcp}
	for i := range tcp {
		nd := filepath.Join(dir, fmt.Sprintf("node%d", i+1))
		if err := os.MkdirAll(nd, 0o755); err != nil {
			ns.stop()
			return nil, err
		}
		args := []string{"serve", "--data-dir", filepath.Join(nd, "data"), "--tcp-addr", tcp[i], "--http-addr", "127.0.0.1:0", "--log", "warn,ferrymq=info"}
		if count > 1 {
			args = append(args, "--node-id", fmt.Sprint(i+1), "--cluster-addr", strings.SplitN(peers[i], "=", 2)[1], "--peers", strings.Join(peers, ","))
		}
		cmd, err := start(bin, args, filepath.Join(nd, "broker.log"))
		if err != nil {
			ns.stop()
			return nil, err
		}
		ns.cmds = append(ns.cmds, cmd)
	}
	return ns, nil
}

var servingLine = regexp.MustCompile(`serving the binary protocol tcp=(\S+)`)

// start runs one node and waits (at most 30 s) until it serves the binary protocol.
func start(bin string, args []string, logPath string) (*exec.Cmd, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stderr = logf
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FERRYMQ_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		text, _ := os.ReadFile(logPath)
		if servingLine.Match(text) {
			return cmd, nil
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	return nil, fmt.Errorf("%s did not start: see %s", bin, logPath)
}

func rate(n int, t0 time.Time) float64 { return float64(n) / time.Since(t0).Seconds() }

// ready waits (at most 30 s) until every partition of topic has a leader; at once for a single
// node.
func ready(ctx context.Context, c *ferrymq.Client, topic string, partitions int) error {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		info, err := c.ClusterInfo(ctx)
		if err != nil {
			return err
		}
		if info.NodeID == 0 {
			return nil
		}
		led := 0
		for p := 0; p < partitions; p++ {
			if info.Leader(topic, uint32(p)) != 0 {
				led++
			}
		}
		if led == partitions {
			return nil
		}
	}
	return fmt.Errorf("the partitions of %s have no leaders after 30 s", topic)
}

func round(ns *nodes, topic string, cfg config) (float64, float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := ferrymq.Connect(ctx, ferrymq.Options{Addrs: ns.addrs}, ferrymq.WithPublishWindow(cfg.window))
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	tc := ferrymq.TopicConfig{Partitions: uint32(cfg.partitions), Storage: ferrymq.StorageDisk, MaxMessages: ferrymq.NoLimit, MaxBytes: ferrymq.NoLimit}
	if err := c.CreateTopic(ctx, topic, tc); err != nil {
		return 0, 0, err
	}
	if err := ready(ctx, c, topic, cfg.partitions); err != nil {
		return 0, 0, err
	}
	body := make([]byte, cfg.body)
	msgs := make([]ferrymq.Message, cfg.batch)
	for i := range msgs {
		msgs[i] = ferrymq.Message{Body: body}
	}
	inflight := max(1, cfg.window/cfg.batch)
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
	t0 := time.Now()
	for sent, b := 0, 0; sent < cfg.n; sent, b = sent+cfg.batch, b+1 {
		part := ferrymq.ToPartition(uint32(b % cfg.partitions))
		pending = append(pending, c.PublishBatchAsync(ctx, topic, msgs[:min(cfg.batch, cfg.n-sent)], part))
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
	seen := make(map[ferrymq.Position]bool, cfg.n)
	t0 = time.Now()
	for len(seen) < cfg.n {
		ds, err := sub.NextBatch(ctx, cfg.batch)
		if err != nil {
			return 0, 0, fmt.Errorf("%d of %d consumed: %w", len(seen), cfg.n, err)
		}
		for _, d := range ds {
			seen[d.ID()] = true
		}
		if err := sub.AckNoWait(ds...); err != nil {
			return 0, 0, err
		}
	}
	return pub, rate(cfg.n, t0), nil
}
