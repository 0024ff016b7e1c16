// Package ferrymq is the Go client of the FerryMQ message broker: the binary protocol of
// docs/protocol.md (publish with receipts, consumers with a credit window, acks, topic and user
// administration, statistics) and a typed message bus on top of it (see Bus).
//
// A Client is safe for concurrent use. Every call that can block takes a context.Context.
package ferrymq

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand"
	"sync"
	"time"
)

// Reconnect says how a Client reconnects after losing its connection.
type Reconnect struct {
	// InitialDelay is the first wait after a loss, doubled after each failed attempt (with
	// jitter) up to MaxDelay. Defaults: 50 ms and 5 s.
	InitialDelay time.Duration
	MaxDelay     time.Duration
	// MaxAttempts bounds the attempts after one loss; 0 is unbounded.
	MaxAttempts int
}

// Options configure a Client. Fields left zero let the broker decide where the protocol has a
// default; the client-side defaults are given with each field.
type Options struct {
	// Addr is host:port; 127.0.0.1:7070 by default.
	Addr string
	// User and Password log in; Token logs in with an API token instead.
	User, Password, Token string
	// ClientName is shown in the broker's logs; "ferrymq-go/<version>" by default.
	ClientName string
	// Heartbeat is the wished interval; 0 takes the broker's.
	Heartbeat time.Duration
	// TLS, when set, connects with TLS.
	TLS *tls.Config
	// PublishWindow bounds messages in unconfirmed publishes (1024 by default); a batch larger
	// than the window is sent alone.
	PublishWindow int
	// Reconnect, when set, reconnects after a loss and subscribes again.
	Reconnect *Reconnect
	// OnError receives errors the broker reports without a request (request id 0).
	OnError func(error)
}

// Option changes Options.
type Option func(*Options)

// WithCredentials logs in as user.
func WithCredentials(user, password string) Option {
	return func(o *Options) { o.User, o.Password = user, password }
}

// WithToken logs in with an API token.
func WithToken(token string) Option { return func(o *Options) { o.Token = token } }

// WithClientName names the client in the broker's logs.
func WithClientName(name string) Option { return func(o *Options) { o.ClientName = name } }

// WithHeartbeat asks for a heartbeat interval.
func WithHeartbeat(d time.Duration) Option { return func(o *Options) { o.Heartbeat = d } }

// WithTLS connects with TLS.
func WithTLS(cfg *tls.Config) Option { return func(o *Options) { o.TLS = cfg } }

// WithPublishWindow bounds messages in unconfirmed publishes.
func WithPublishWindow(n int) Option { return func(o *Options) { o.PublishWindow = n } }

// WithReconnect reconnects with backoff after a loss and subscribes again.
func WithReconnect(r Reconnect) Option { return func(o *Options) { o.Reconnect = &r } }

// WithOnError receives errors the broker reports without a request.
func WithOnError(f func(error)) Option { return func(o *Options) { o.OnError = f } }

// Version is this package's version, sent in the default client name.
const Version = "0.1.0"

var _ io.Closer = (*Client)(nil)

// Client is a connection to a broker. It is safe for concurrent use; Close releases it.
type Client struct {
	opts Options

	mu      sync.Mutex
	cur     *conn
	ready   chan struct{} // closed when cur is usable or the client is done
	closed  bool
	lostErr error // set when the connection is gone for good
	subs    map[*Subscription]struct{}
	closing chan struct{}
	wg      sync.WaitGroup
	pubWin  *window
}

// Connect opens a connection and says HELLO. Options given as functions apply over opts.
func Connect(ctx context.Context, opts Options, more ...Option) (*Client, error) {
	for _, f := range more {
		f(&opts)
	}
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:7070"
	}
	if opts.ClientName == "" {
		opts.ClientName = "ferrymq-go/" + Version
	}
	if opts.PublishWindow <= 0 {
		opts.PublishWindow = 1024
	}
	c := &Client{opts: opts, subs: map[*Subscription]struct{}{}, closing: make(chan struct{}), pubWin: newWindow(opts.PublishWindow)}
	k, err := dial(ctx, c)
	if err != nil {
		return nil, err
	}
	c.cur = k
	c.ready = make(chan struct{})
	close(c.ready)
	return c, nil
}

// Server is what the broker said in HELLO_OK on the current connection.
func (c *Client) Server() HelloOK {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == nil {
		return HelloOK{}
	}
	return c.cur.hello
}

// Close closes the connection and every subscription, and waits for the client's goroutines.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.closing)
	k := c.cur
	subs := c.subs
	c.subs = map[*Subscription]struct{}{}
	c.mu.Unlock()
	for s := range subs {
		s.end(nil, ErrClosed)
	}
	if k != nil {
		k.fail(ErrClosed)
		k.wg.Wait()
	}
	c.wg.Wait()
	return nil
}

// conn returns the usable connection, waiting while a reconnection is under way.
func (c *Client) conn(ctx context.Context) (*conn, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		if c.lostErr != nil {
			err := c.lostErr
			c.mu.Unlock()
			return nil, &ConnectionLostError{Err: err}
		}
		k, ready := c.cur, c.ready
		c.mu.Unlock()
		if k != nil && !k.isClosed() {
			return k, nil
		}
		if k != nil && c.opts.Reconnect == nil {
			return nil, &ConnectionLostError{Err: k.cause()}
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, &CancelledError{Err: ctx.Err()}
		case <-c.closing:
		}
	}
}

// lost runs once per lost connection.
func (c *Client) lost(k *conn, cause error, consumers map[uint32]*Subscription) {
	c.mu.Lock()
	if c.cur != k || c.closed {
		c.mu.Unlock()
		return
	}
	if c.opts.Reconnect == nil {
		c.lostErr = cause
		subs := c.subs
		c.mu.Unlock()
		for s := range subs {
			s.end(nil, &ConnectionLostError{Err: cause})
		}
		return
	}
	c.ready = make(chan struct{})
	c.wg.Add(1)
	c.mu.Unlock()
	go c.reconnect(k)
}

func (c *Client) reconnect(old *conn) {
	defer c.wg.Done()
	old.wg.Wait()
	r := c.opts.Reconnect
	delay, maxDelay := r.InitialDelay, r.MaxDelay
	if delay <= 0 {
		delay = 50 * time.Millisecond
	}
	if maxDelay <= 0 {
		maxDelay = 5 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-c.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	var lastErr error
	for attempt := 1; r.MaxAttempts == 0 || attempt <= r.MaxAttempts; attempt++ {
		wait := delay/2 + time.Duration(mrand.Int63n(int64(delay/2)+1))
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
		if delay *= 2; delay > maxDelay {
			delay = maxDelay
		}
		dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
		k, err := dial(dctx, c)
		dcancel()
		if err != nil {
			lastErr = err
			var e *Error
			if errors.As(err, &e) && e.Code == CodeAuthenticationFailed {
				break
			}
			continue
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			k.fail(ErrClosed)
			k.wg.Wait()
			return
		}
		c.cur = k
		subs := make([]*Subscription, 0, len(c.subs))
		for s := range c.subs {
			subs = append(subs, s)
		}
		c.mu.Unlock()
		for _, s := range subs {
			sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
			if err := s.attach(sctx, k); err != nil && !k.isClosed() {
				s.end(nil, err)
			}
			scancel()
		}
		c.mu.Lock()
		close(c.ready)
		c.mu.Unlock()
		return
	}
	c.mu.Lock()
	c.lostErr = lastErr
	subs := c.subs
	close(c.ready)
	c.mu.Unlock()
	for s := range subs {
		s.end(nil, &ConnectionLostError{Err: lastErr})
	}
}

// request sends one request and waits for its answer, checking the answer's type.
func request[T Payload](ctx context.Context, c *Client, p Payload) (T, error) {
	var zero T
	k, err := c.conn(ctx)
	if err != nil {
		return zero, err
	}
	ans, err := k.roundTrip(ctx, p)
	if err != nil {
		return zero, err
	}
	t, ok := ans.(T)
	if !ok {
		return zero, &ProtocolError{Kind: KindInvalidValue, Field: "answer", Msg: fmt.Sprintf("opcode %#x answered with %#x", uint16(p.Opcode()), uint16(ans.Opcode()))}
	}
	return t, nil
}

// Ping measures one round trip.
func (c *Client) Ping(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	_, err := request[*Pong](ctx, c, &Ping{})
	return time.Since(start), err
}

// CreateTopic creates a topic; zero config fields take the broker's defaults.
func (c *Client) CreateTopic(ctx context.Context, name string, cfg TopicConfig) error {
	_, err := request[*OK](ctx, c, &CreateTopic{Name: name, Config: cfg})
	return err
}

// EnsureTopic creates a topic unless it exists.
func (c *Client) EnsureTopic(ctx context.Context, name string, cfg TopicConfig) error {
	_, err := request[*OK](ctx, c, &CreateTopic{Name: name, Config: cfg, IfNotExists: true})
	return err
}

// DeleteTopic deletes a topic.
func (c *Client) DeleteTopic(ctx context.Context, name string) error {
	_, err := request[*OK](ctx, c, &DeleteTopic{Name: name})
	return err
}

// DescribeTopic describes a topic.
func (c *Client) DescribeTopic(ctx context.Context, name string) (*TopicInfo, error) {
	t, err := request[*TopicInfoFrame](ctx, c, &DescribeTopic{Name: name})
	return (*TopicInfo)(t), err
}

// ListTopics lists every topic.
func (c *Client) ListTopics(ctx context.Context) ([]TopicInfo, error) {
	t, err := request[*TopicList](ctx, c, &ListTopics{})
	if err != nil {
		return nil, err
	}
	return t.Topics, nil
}

// Stats returns the counters of one topic, or of every topic when topic is empty.
func (c *Client) Stats(ctx context.Context, topic string) ([]TopicStats, error) {
	t, err := request[*StatsReply](ctx, c, &Stats{Topic: topic})
	if err != nil {
		return nil, err
	}
	return t.Topics, nil
}

// DeleteSubscription removes a named subscription.
func (c *Client) DeleteSubscription(ctx context.Context, topic, subscription string) error {
	_, err := request[*OK](ctx, c, &DeleteSubscription{Topic: topic, Subscription: subscription})
	return err
}

// MessageStatus says where a message (`<partition>-<offset>`) stands in each subscription.
func (c *Client) MessageStatus(ctx context.Context, topic string, id Position) (*MessageStatus, error) {
	t, err := request[*MessageStatusReply](ctx, c, &MessageStatusRequest{Topic: topic, Partition: id.Partition, Offset: id.Offset})
	return (*MessageStatus)(t), err
}

// ListMessages returns one page of a subscription's messages of one kind; page is nil for the
// first page, then the previous page's NextPage (nil or empty when there are no more).
func (c *Client) ListMessages(ctx context.Context, topic, subscription string, kind ListKind, page []byte, limit uint32) (*MessageList, error) {
	return request[*MessageList](ctx, c, &ListMessages{Topic: topic, Subscription: subscription, Kind: kind, Page: page, Limit: limit})
}

// RequeueDead publishes dead letters of a dead-letter topic again to their source.
func (c *Client) RequeueDead(ctx context.Context, deadLetterTopic string, sel Selection) (*Requeued, error) {
	return request[*Requeued](ctx, c, &RequeueDead{DeadLetterTopic: deadLetterTopic, Selection: sel})
}

// AddUser adds a user (admin only); roles are RoleAdmin and RoleMonitor bits.
func (c *Client) AddUser(ctx context.Context, user, password string, roles uint8) error {
	_, err := request[*OK](ctx, c, &UserAdd{User: user, Password: password, Roles: roles})
	return err
}

// RemoveUser removes a user (admin only).
func (c *Client) RemoveUser(ctx context.Context, user string) error {
	_, err := request[*OK](ctx, c, &UserRemove{User: user})
	return err
}

// SetPassword sets a user's password; an empty user is the connection's own.
func (c *Client) SetPassword(ctx context.Context, user, password string) error {
	_, err := request[*OK](ctx, c, &UserPasswd{User: user, Password: password})
	return err
}

// ListUsers lists every user (admin only).
func (c *Client) ListUsers(ctx context.Context) ([]UserInfo, error) {
	t, err := request[*UserListReply](ctx, c, &UserList{})
	if err != nil {
		return nil, err
	}
	return t.Users, nil
}

// Grant adds actions (ActionPublish... bits) on a topic pattern, and roles, to a user.
func (c *Client) Grant(ctx context.Context, user, pattern string, actions, roles uint8) error {
	_, err := request[*OK](ctx, c, &Grant{User: user, Pattern: pattern, Actions: actions, Roles: roles})
	return err
}

// Revoke takes actions on exactly pattern, and roles, away from a user.
func (c *Client) Revoke(ctx context.Context, user, pattern string, actions, roles uint8) error {
	_, err := request[*OK](ctx, c, &Revoke{User: user, Pattern: pattern, Actions: actions, Roles: roles})
	return err
}

// CreateToken creates an API token; an empty user is the connection's own, expires zero never
// expires.
func (c *Client) CreateToken(ctx context.Context, user, name string, expires time.Time) (*TokenCreated, error) {
	var ms uint64
	if !expires.IsZero() {
		ms = uint64(expires.UnixMilli())
	}
	return request[*TokenCreated](ctx, c, &TokenCreate{User: user, Name: name, ExpiresMs: ms})
}

// ListTokens lists a user's tokens; an empty user is the connection's own.
func (c *Client) ListTokens(ctx context.Context, user string) ([]TokenInfo, error) {
	t, err := request[*TokenListReply](ctx, c, &TokenList{User: user})
	if err != nil {
		return nil, err
	}
	return t.Tokens, nil
}

// RevokeToken revokes a token.
func (c *Client) RevokeToken(ctx context.Context, user, name string) error {
	_, err := request[*OK](ctx, c, &TokenRevoke{User: user, Name: name})
	return err
}

// NewDedupID returns a random deduplication id (32 hex digits).
func NewDedupID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// WithDedupID returns a copy of m carrying the deduplication id: within the topic's window
// the broker stores a message with the same id only once, so a publish whose outcome is
// unknown can be sent again safely.
func (m Message) WithDedupID(id string) Message {
	hs := make([]Header, 0, len(m.Headers)+1)
	for _, h := range m.Headers {
		if h.Name != DedupHeader {
			hs = append(hs, h)
		}
	}
	m.Headers = append(hs, Header{DedupHeader, id})
	return m
}

// window bounds messages in unconfirmed publishes.
type window struct {
	mu      sync.Mutex
	size    int
	used    int
	changed chan struct{}
}

func newWindow(size int) *window { return &window{size: size, changed: make(chan struct{})} }

func (w *window) acquire(ctx context.Context, n int) (int, error) {
	if n > w.size {
		n = w.size
	}
	for {
		w.mu.Lock()
		if w.used+n <= w.size {
			w.used += n
			w.mu.Unlock()
			return n, nil
		}
		ch := w.changed
		w.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

func (w *window) release(n int) {
	w.mu.Lock()
	w.used -= n
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
}
