package ferrymq

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// testBroker is one `ferrymq serve` process on 127.0.0.1 with its own data directory; restart
// keeps the port and the data.
type testBroker struct {
	dir   string
	data  string
	log   string
	extra []string
	env   []string
	cmd   *exec.Cmd
	Addr  string
}

func brokerBinary() (string, error) {
	if p := os.Getenv("FERRYMQ_BIN"); p != "" {
		if st, err := os.Stat(p); err != nil || st.IsDir() {
			return "", fmt.Errorf("FERRYMQ_BIN=%s is not a file", p)
		}
		return p, nil
	}
	for _, profile := range []string{"release", "debug"} {
		p, _ := filepath.Abs(filepath.Join("..", "..", "target", profile, "ferrymq"))
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	return "", fmt.Errorf("no broker binary: set FERRYMQ_BIN or build target/release/ferrymq")
}

var servingLine = regexp.MustCompile(`serving the binary protocol tcp=(\S+)`)

func startBroker(dir string, env []string, extra ...string) (*testBroker, error) {
	b := &testBroker{dir: dir, data: filepath.Join(dir, "data"), log: filepath.Join(dir, "broker.log"), extra: extra, env: env, Addr: "127.0.0.1:0"}
	return b, b.start()
}

func (b *testBroker) start() error {
	bin, err := brokerBinary()
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(b.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	st, _ := logf.Stat()
	offset := st.Size()
	args := append([]string{"serve", "--data-dir", b.data, "--tcp-addr", b.Addr, "--http-addr", "127.0.0.1:0", "--log", "info"}, b.extra...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = nil, logf
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FERRYMQ_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, b.env...)
	brokerProcAttr(cmd)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	logf.Close()
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	b.cmd = cmd
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		text, _ := os.ReadFile(b.log)
		if int64(len(text)) > offset {
			if m := servingLine.FindSubmatch(text[offset:]); m != nil {
				b.Addr = string(m[1])
				b.cmd = cmd
				return nil
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("ferrymq serve exited:\n%s", text[offset:])
		case <-time.After(10 * time.Millisecond):
		}
	}
	cmd.Process.Kill()
	return fmt.Errorf("ferrymq serve did not listen within 30 s")
}

// stop ends the broker, killing it when kill is set.
func (b *testBroker) stop(kill bool) {
	if b.cmd == nil {
		return
	}
	if kill {
		b.cmd.Process.Kill()
	} else {
		b.cmd.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if b.cmd.Process.Signal(syscall.Signal(0)) != nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.cmd.Process.Kill()
	b.cmd = nil
}

func (b *testBroker) restart(kill bool) error {
	b.stop(kill)
	return b.start()
}

var shared *testBroker

func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.fuzzworker"); f != nil && f.Value.String() == "true" {
		// A fuzzing worker runs only the fuzz target, which needs no broker (and may be killed
		// without running the clean-up).
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "ferrymq-go-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	shared, err = startBroker(dir, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the broker:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	os.Setenv("FERRYMQ_EXAMPLE_ADDR", shared.Addr)
	code := m.Run()
	stopExampleCluster()
	shared.stop(false)
	os.RemoveAll(dir)
	os.Exit(code)
}

// newBroker starts a broker of the test's own, stopped when the test ends.
func newBroker(t *testing.T, env []string, extra ...string) *testBroker {
	t.Helper()
	b, err := startBroker(t.TempDir(), env, extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.stop(true) })
	return b
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// noLeaks fails the test when goroutines started during it are still running once it is over
// (polled with a deadline).
func noLeaks(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				n := runtime.Stack(buf, true)
				t.Errorf("goroutines: %d before, %d after:\n%s", before, runtime.NumGoroutine(), buf[:n])
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
}

func connect(t *testing.T, addr string, opts ...Option) *Client {
	t.Helper()
	c, err := Connect(testCtx(t), Options{Addr: addr}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

var topicSeq int

func topicName(t *testing.T) string {
	topicSeq++
	name := regexp.MustCompile(`[^A-Za-z0-9_.-]`).ReplaceAllString(t.Name(), "_")
	if len(name) > 200 {
		name = name[:200]
	}
	return fmt.Sprintf("%s-%d", name, topicSeq)
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
