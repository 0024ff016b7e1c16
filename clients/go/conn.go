package ferrymq

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// ProtocolVersion is the highest protocol version this package speaks; HELLO offers
// protocolVersionMin..=ProtocolVersion, and the broker picks the highest it also speaks. A
// broker of version 2 is served without the version 3 requests (cluster and operator frames:
// VersionError) and without leader-following, which it has no need for.
const ProtocolVersion uint16 = 3

const protocolVersionMin uint16 = 2

// call is one request waiting for its answer. complete runs exactly once, on the reader
// goroutine (or the one failing the connection), and must not block.
type call struct {
	complete func(p Payload, err error)
}

// conn is one session on one socket: HELLO done, a reader and a heartbeat goroutine.
type conn struct {
	client *Client
	addr   string
	nc     net.Conn
	hello  HelloOK

	wmu sync.Mutex

	mu        sync.Mutex
	pending   map[uint32]*call
	nextID    uint32
	consumers map[uint32]*Subscription
	closed    bool
	err       error
	done      chan struct{}

	lastSent atomic.Int64
	lastRecv atomic.Int64
	wg       sync.WaitGroup
}

// dialAny connects to the first of addrs that answers, in order, each within the dial
// timeout. A refusal that every node would make alike (credentials, TLS, versions) ends the
// search at once.
func dialAny(ctx context.Context, c *Client, addrs []string) (*conn, error) {
	var errs []error
	for _, addr := range addrs {
		k, err := dialTimeout(ctx, c, addr)
		if err == nil {
			return k, nil
		}
		if len(addrs) == 1 || ctx.Err() != nil || sameEverywhere(err) {
			return nil, err
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("ferrymq: no node answered: %w", errors.Join(errs...))
}

// sameEverywhere reports whether another node would refuse a connection the same way.
func sameEverywhere(err error) bool {
	var e *Error
	var ce *tls.CertificateVerificationError
	var pe *ProtocolError
	return (errors.As(err, &e) && (e.Code == CodeAuthenticationFailed || e.Code == CodeUnsupportedVersion)) ||
		errors.As(err, &ce) || errors.As(err, &pe)
}

func dialTimeout(ctx context.Context, c *Client, addr string) (*conn, error) {
	if c.opts.DialTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opts.DialTimeout)
		defer cancel()
	}
	return dial(ctx, c, addr)
}

// dial opens a socket to addr, says HELLO and starts the reader and heartbeat goroutines.
func dial(ctx context.Context, c *Client, addr string) (*conn, error) {
	o := &c.opts
	d := net.Dialer{}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("ferrymq: connect %s: %w", addr, err)
	}
	if o.TLS != nil {
		cfg := o.TLS.Clone()
		if cfg.ServerName == "" {
			host, _, _ := net.SplitHostPort(addr)
			cfg.ServerName = host
		}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, fmt.Errorf("ferrymq: TLS handshake with %s: %w", addr, err)
		}
		nc = tc
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	hello, err := handshake(nc, o)
	if !stop() || ctx.Err() != nil {
		nc.Close()
		return nil, fmt.Errorf("ferrymq: connect %s: %w", addr, ctx.Err())
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	if hello.Version < protocolVersionMin || hello.Version > ProtocolVersion {
		nc.Close()
		return nil, &ProtocolError{Kind: KindInvalidValue, Field: "hello_ok.version", Msg: fmt.Sprintf("%s chose protocol version %d, this client speaks %d..=%d", addr, hello.Version, protocolVersionMin, ProtocolVersion)}
	}
	nc.SetDeadline(time.Time{})
	k := &conn{client: c, addr: addr, nc: nc, hello: *hello, pending: map[uint32]*call{}, consumers: map[uint32]*Subscription{}, done: make(chan struct{})}
	now := time.Now().UnixNano()
	k.lastSent.Store(now)
	k.lastRecv.Store(now)
	k.wg.Add(2)
	go k.readLoop(bufio.NewReaderSize(nc, 64<<10))
	go k.heartbeat()
	return k, nil
}

func handshake(nc net.Conn, o *Options) (*HelloOK, error) {
	h := &Hello{VersionMin: protocolVersionMin, VersionMax: ProtocolVersion, HeartbeatMs: uint32(o.Heartbeat / time.Millisecond),
		ClientName: o.ClientName, User: o.User, Password: o.Password}
	if o.Token != "" {
		h.User, h.Password = "", o.Token
	}
	b, err := EncodeFrame(nil, 1, h)
	if err != nil {
		return nil, err
	}
	if _, err := nc.Write(b); err != nil {
		return nil, fmt.Errorf("ferrymq: HELLO: %w", err)
	}
	f, err := readFrame(nc, DefaultFrameBytes)
	if err != nil {
		return nil, fmt.Errorf("ferrymq: HELLO: %w", err)
	}
	switch p := f.Payload.(type) {
	case *HelloOK:
		return p, nil
	case *ErrorFrame:
		return nil, &Error{Code: ErrorCode(p.Code), Message: p.Message}
	default:
		return nil, &ProtocolError{Kind: KindInvalidValue, Field: "hello", Msg: fmt.Sprintf("answered with opcode %#x", uint16(p.Opcode()))}
	}
}

// readFrame reads one whole frame in the newest layout, checking the header before reading the
// payload.
func readFrame(r io.Reader, limit uint32) (Frame, error) {
	return readFrameAs(r, limit, ProtocolVersion)
}

// readFrameAs reads one whole frame in the layout of protocol version.
func readFrameAs(r io.Reader, limit uint32, version uint16) (Frame, error) {
	var hb [HeaderBytes]byte
	if _, err := io.ReadFull(r, hb[:]); err != nil {
		return Frame{}, err
	}
	h, err := decodeHeader(hb[:], limit)
	if err != nil {
		return Frame{RequestID: h.requestID}, err
	}
	payload := make([]byte, h.payloadLen)
	if _, err := io.ReadFull(r, payload); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	p, err := decodePayloadAs(h.opcode, payload, true, version)
	if err != nil {
		return Frame{RequestID: h.requestID}, err
	}
	return Frame{RequestID: h.requestID, Payload: p}, nil
}

func (k *conn) readLoop(r io.Reader) {
	defer k.wg.Done()
	for {
		f, err := readFrameAs(r, k.hello.FrameBytesMax, k.hello.Version)
		if err != nil {
			k.fail(err)
			return
		}
		k.lastRecv.Store(time.Now().UnixNano())
		k.dispatch(f)
	}
}

func (k *conn) dispatch(f Frame) {
	switch p := f.Payload.(type) {
	case *Ping:
		if f.RequestID != 0 {
			k.sendNoReply(f.RequestID, &Pong{})
		}
		return
	case *Pong:
		if f.RequestID == 0 {
			return
		}
	case *Deliver:
		k.mu.Lock()
		s := k.consumers[p.ConsumerID]
		k.mu.Unlock()
		if s != nil {
			s.push(k, p.Deliveries)
		}
		return
	case *ErrorFrame:
		if f.RequestID == 0 {
			k.pushedError(&Error{Code: ErrorCode(p.Code), Message: p.Message})
			return
		}
	}
	if f.RequestID == 0 {
		return
	}
	k.mu.Lock()
	c := k.pending[f.RequestID]
	delete(k.pending, f.RequestID)
	k.mu.Unlock()
	if c == nil {
		return
	}
	if e, ok := f.Payload.(*ErrorFrame); ok {
		fe := brokerError(e.Code, e.Message)
		if ErrorCode(e.Code).Closes() {
			k.mu.Lock()
			if k.err == nil {
				k.err = fe
			}
			k.mu.Unlock()
		}
		c.complete(nil, fe)
		return
	}
	c.complete(f.Payload, nil)
}

// pushedError handles an ERROR with request id 0: about a consumer, or about the connection.
func (k *conn) pushedError(e *Error) {
	if id, ok := consumerOf(e.Message); ok {
		k.mu.Lock()
		s := k.consumers[id]
		delete(k.consumers, id)
		k.mu.Unlock()
		if s != nil {
			s.end(k, e)
			k.sendNoReply(0, &Unsubscribe{ConsumerID: id})
			return
		}
	}
	if e.Code.Closes() {
		k.mu.Lock()
		if k.err == nil {
			k.err = e
		}
		k.mu.Unlock()
	}
	if k.client.opts.OnError != nil {
		k.client.opts.OnError(e)
	}
}

func (k *conn) heartbeatInterval() time.Duration {
	if k.hello.HeartbeatMs == 0 {
		return 5 * time.Second
	}
	return time.Duration(k.hello.HeartbeatMs) * time.Millisecond
}

func (k *conn) heartbeat() {
	defer k.wg.Done()
	hb := k.heartbeatInterval()
	tick := hb / 4
	if tick < 10*time.Millisecond {
		tick = 10 * time.Millisecond
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-k.done:
			return
		case <-t.C:
		}
		now := time.Now().UnixNano()
		if time.Duration(now-k.lastRecv.Load()) >= 3*hb {
			k.fail(fmt.Errorf("ferrymq: nothing received for %v (3 heartbeats)", 3*hb))
			return
		}
		if time.Duration(now-k.lastSent.Load()) >= hb {
			k.sendNoReply(0, &Ping{})
		}
	}
}

// fail closes the connection once, failing every waiting request.
func (k *conn) fail(err error) {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return
	}
	k.closed = true
	if k.err == nil {
		k.err = err
	}
	cause := k.err
	pending := k.pending
	k.pending = map[uint32]*call{}
	consumers := k.consumers
	k.consumers = map[uint32]*Subscription{}
	close(k.done)
	k.mu.Unlock()
	k.nc.Close()
	for _, c := range pending {
		c.complete(nil, &ConnectionLostError{Sent: true, Err: cause})
	}
	go k.client.lost(k, cause, consumers)
}

// cause is why the connection closed (nil while open).
func (k *conn) cause() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

func (k *conn) isClosed() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.closed
}

// write sends one frame. A write that cannot finish within 3 heartbeat intervals fails (and
// closes the connection): a peer that reads nothing for that long counts as gone.
func (k *conn) write(b []byte) error {
	k.wmu.Lock()
	defer k.wmu.Unlock()
	k.nc.SetWriteDeadline(time.Now().Add(3 * k.heartbeatInterval()))
	_, err := k.nc.Write(b)
	if err == nil {
		k.lastSent.Store(time.Now().UnixNano())
	}
	return err
}

func (k *conn) encode(id uint32, p Payload) ([]byte, error) {
	b, err := encodeFrameAs(make([]byte, 0, sizeHint(p)), id, p, k.hello.Version)
	if err != nil {
		return nil, err
	}
	if max := k.hello.FrameBytesMax; max != 0 && uint64(len(b)) > uint64(max) {
		return nil, fmt.Errorf("%w: frame of %d bytes above frame_bytes_max %d", ErrTooLarge, len(b), max)
	}
	return b, nil
}

// sendNoReply sends a frame with request id 0 (or an answer such as PONG); failures close the
// connection.
func (k *conn) sendNoReply(id uint32, p Payload) error {
	b, err := k.encode(id, p)
	if err != nil {
		return err
	}
	if k.isClosed() {
		return &ConnectionLostError{Err: k.cause()}
	}
	if err := k.write(b); err != nil {
		k.fail(err)
		return &ConnectionLostError{Err: err}
	}
	return nil
}

// start sends a request whose answer is handed to complete. It fails without calling
// complete when the request could not be sent.
func (k *conn) start(p Payload, complete func(Payload, error)) error {
	b, err := k.encode(0, p)
	if err != nil {
		return err
	}
	k.mu.Lock()
	if k.closed {
		cause := k.err
		k.mu.Unlock()
		return &ConnectionLostError{Err: cause}
	}
	id := k.nextID
	for {
		id++
		if id == 0 {
			id = 1
		}
		if _, busy := k.pending[id]; !busy {
			break
		}
	}
	k.nextID = id
	putU32(b[8:], id)
	k.pending[id] = &call{complete: complete}
	k.mu.Unlock()
	if err := k.write(b); err != nil {
		k.mu.Lock()
		_, still := k.pending[id]
		delete(k.pending, id)
		k.mu.Unlock()
		k.fail(err)
		if still {
			return &ConnectionLostError{Err: err}
		}
		// Already failed by fail(): complete has run.
		return errAlreadyCompleted
	}
	return nil
}

var errAlreadyCompleted = errors.New("completed")

type result struct {
	p   Payload
	err error
}

// roundTrip sends a request and waits for its answer or ctx.
func (k *conn) roundTrip(ctx context.Context, p Payload) (Payload, error) {
	if err := ctx.Err(); err != nil {
		return nil, &CancelledError{Err: err}
	}
	ch := make(chan result, 1)
	err := k.start(p, func(p Payload, err error) { ch <- result{p, err} })
	if err != nil && err != errAlreadyCompleted {
		return nil, err
	}
	select {
	case r := <-ch:
		return r.p, r.err
	case <-ctx.Done():
		return nil, &CancelledError{Sent: true, Err: ctx.Err()}
	}
}
