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
	"os"
	"strings"
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
	// Addr is host:port, or several separated by commas (the nodes of a cluster:
	// "a:7070,b:7070,c:7070"). Addrs, when set, is used instead. With neither,
	// $FERRYMQ_ADDR (the same form), else 127.0.0.1:7070.
	Addr string
	// Addrs are seed addresses, tried in order: the client connects to the first that
	// answers (and, after a loss, reconnects the same way).
	Addrs []string
	// DialTimeout bounds connecting to one address, TLS and HELLO included; 5 s by default.
	DialTimeout time.Duration
	// LeaderTimeout bounds how long a publish, CreateTopic, EnsureTopic or DeleteTopic keeps
	// following the leader in a cluster (after not_leader, or a lost connection) before it
	// fails with the last error; 15 s by default, negative: never follows (and subscriptions
	// stay on the client's connection). See Client.
	LeaderTimeout time.Duration
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

// WithAddrs sets the seed addresses: the first that answers is used.
func WithAddrs(addrs ...string) Option { return func(o *Options) { o.Addrs = addrs } }

// WithLeaderTimeout bounds how long requests follow a cluster's leaders (negative: never).
func WithLeaderTimeout(d time.Duration) Option { return func(o *Options) { o.LeaderTimeout = d } }

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

// Client is a connection to a broker, or to the nodes of a cluster. It is safe for concurrent
// use; Close releases it.
//
// In a cluster (protocol version 3) the client connects to the first seed that answers and
// asks it for the cluster's nodes (CLUSTER_INFO). Publishes, CreateTopic, EnsureTopic and
// DeleteTopic need a leader (of the partition, or of the cluster metadata): when a node
// answers not_leader, or the connection to the leader is lost, the client finds the leader
// (from the answer, else CLUSTER_INFO from any node it reaches), connects to it and sends the
// request again, for up to Options.LeaderTimeout. A request whose outcome is unknown (sent,
// and the connection lost before the answer) is sent again only when that is safe: EnsureTopic,
// and a publish whose every message carries a deduplication id (Message.WithDedupID); otherwise
// it fails matching ErrOutcomeUnknown, as with a single broker. A subscription is attached on
// every node, since only a partition's leader delivers its messages (see Client.Subscribe).
// Every other request uses the connection to the first node that answered: any node serves it.
type Client struct {
	opts  Options
	seeds []string
	ctx   context.Context // ends at Close
	stop  context.CancelFunc

	mu      sync.Mutex
	cur     *conn
	ready   chan struct{} // closed when cur is usable or the client is done
	closed  bool
	lostErr error // set when the connection is gone for good
	subs    map[*Subscription]struct{}
	closing chan struct{}
	wg      sync.WaitGroup
	pubWin  *window

	cluster clusterState
}

// Connect opens a connection and says HELLO. Options given as functions apply over opts.
func Connect(ctx context.Context, opts Options, more ...Option) (*Client, error) {
	for _, f := range more {
		f(&opts)
	}
	seeds := opts.Addrs
	if len(seeds) == 0 {
		addr := opts.Addr
		if addr == "" {
			addr = os.Getenv("FERRYMQ_ADDR")
		}
		seeds = SplitAddrs(addr)
	}
	if len(seeds) == 0 {
		seeds = []string{"127.0.0.1:7070"}
	}
	opts.Addr = strings.Join(seeds, ",")
	if opts.ClientName == "" {
		opts.ClientName = "ferrymq-go/" + Version
	}
	if opts.PublishWindow <= 0 {
		opts.PublishWindow = 1024
	}
	if opts.DialTimeout == 0 {
		opts.DialTimeout = 5 * time.Second
	}
	if opts.LeaderTimeout == 0 {
		opts.LeaderTimeout = 15 * time.Second
	}
	c := &Client{opts: opts, seeds: seeds, subs: map[*Subscription]struct{}{}, closing: make(chan struct{}), pubWin: newWindow(opts.PublishWindow)}
	c.cluster.init()
	k, err := dialAny(ctx, c, seeds)
	if err != nil {
		return nil, err
	}
	c.ctx, c.stop = context.WithCancel(context.Background())
	c.cur = k
	c.ready = make(chan struct{})
	close(c.ready)
	c.discover(ctx, k)
	return c, nil
}

// SplitAddrs splits a comma-separated list of addresses ("a:7070, b:7070"), dropping blanks.
func SplitAddrs(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
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
	c.stop()
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
	for _, p := range c.cluster.closeAll() {
		p.fail(ErrClosed)
		p.wg.Wait()
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
		subs := c.ownSubs()
		c.mu.Unlock()
		for _, s := range subs {
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
		k, err := dialAny(ctx, c, c.candidates())
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
		subs := c.ownSubs()
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
	subs := c.ownSubs()
	close(c.ready)
	c.mu.Unlock()
	for _, s := range subs {
		s.end(nil, &ConnectionLostError{Err: lastErr})
	}
}

// ownSubs are the subscriptions on the client's connection (a cluster subscription has
// connections of its own). Called with c.mu held.
func (c *Client) ownSubs() []*Subscription {
	out := make([]*Subscription, 0, len(c.subs))
	for s := range c.subs {
		if !s.cluster {
			out = append(out, s)
		}
	}
	return out
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
	return answerAs[T](p, ans)
}

// answerAs checks an answer's type.
func answerAs[T Payload](p, ans Payload) (T, error) {
	t, ok := ans.(T)
	if !ok {
		return t, &ProtocolError{Kind: KindInvalidValue, Field: "answer", Msg: fmt.Sprintf("opcode %#x answered with %#x", uint16(p.Opcode()), uint16(ans.Opcode()))}
	}
	return t, nil
}

// Ping measures one round trip.
func (c *Client) Ping(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	_, err := request[*Pong](ctx, c, &Ping{})
	return time.Since(start), err
}

// CreateTopic creates a topic; zero config fields take the broker's defaults. In a cluster it
// goes to the metadata leader.
func (c *Client) CreateTopic(ctx context.Context, name string, cfg TopicConfig) error {
	_, err := leaderRequest[*OK](ctx, c, metadataRoute, false, &CreateTopic{Name: name, Config: cfg})
	return err
}

// EnsureTopic creates a topic unless it exists. In a cluster it goes to the metadata leader,
// and is sent again after a lost connection, which is safe.
func (c *Client) EnsureTopic(ctx context.Context, name string, cfg TopicConfig) error {
	_, err := leaderRequest[*OK](ctx, c, metadataRoute, true, &CreateTopic{Name: name, Config: cfg, IfNotExists: true})
	return err
}

// DeleteTopic deletes a topic. In a cluster it goes to the metadata leader.
func (c *Client) DeleteTopic(ctx context.Context, name string) error {
	_, err := leaderRequest[*OK](ctx, c, metadataRoute, false, &DeleteTopic{Name: name})
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
