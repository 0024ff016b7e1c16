package ferrymq

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Headers of a bus message, set by the sender in this order.
const (
	HeaderBusType       = "x-bus-type"
	HeaderBusSerializer = "x-bus-serializer"
	HeaderBusSender     = "x-bus-sender"
	HeaderBusShard      = "x-bus-shard"
	HeaderBusPrepared   = "x-bus-prepared-ms"
	HeaderBusSent       = "x-bus-sent-ms"
)

// BusSettings say where the bus connects and who it is. LoadBusSettings reads them from the
// environment (the same names as the Python and TypeScript buses):
//
//	FERRYMQ_ADDR                 broker, host:port, or a cluster's nodes: a:7070,b:7070
//	FERRYMQ_BUS_IDENTITY         this service's name
//	FERRYMQ_BUS_SHARDS           shard count, the same everywhere
//	FERRYMQ_BUS_LISTEN_SERVICES  sender services to receive from, comma-separated
//	FERRYMQ_BUS_LISTEN_SHARDS    shards to receive, e.g. 1,2,4-7
//	FERRYMQ_BUS_SERIALIZER       json, deflate-json, msgpack, protobuf
type BusSettings struct {
	// Addr is Options.Addr's form: one address or several, comma-separated.
	Addr     string
	Identity string
	Shards   int
	// ListenServices are the sender services to receive from; empty is every sender.
	ListenServices []string
	// ListenShards are the shards to receive, e.g. "1,2,4-7"; empty is every shard.
	ListenShards string
	Serializer   string
	// TopicTemplate names a type's topic: {type} is its name, {sender} the sending service.
	TopicTemplate string
}

// DefaultBusSettings are the settings without environment.
func DefaultBusSettings() BusSettings {
	return BusSettings{Addr: "127.0.0.1:7070", Identity: "NoIdentification", Shards: 10, Serializer: "json", TopicTemplate: "{type}"}
}

// LoadBusSettings starts from DefaultBusSettings, applies the environment (lookup, or
// os.LookupEnv when nil), then the overrides, and checks the result.
func LoadBusSettings(lookup func(string) (string, bool), overrides ...func(*BusSettings)) (BusSettings, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	s := DefaultBusSettings()
	if v, ok := lookup("FERRYMQ_ADDR"); ok && v != "" {
		s.Addr = v
	}
	if v, ok := lookup("FERRYMQ_BUS_IDENTITY"); ok && v != "" {
		s.Identity = v
	}
	if v, ok := lookup("FERRYMQ_BUS_SHARDS"); ok && v != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return s, busErr("FERRYMQ_BUS_SHARDS is a number, got %q", v)
		}
		s.Shards = n
	}
	if v, ok := lookup("FERRYMQ_BUS_LISTEN_SERVICES"); ok && v != "" {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				s.ListenServices = append(s.ListenServices, p)
			}
		}
	}
	if v, ok := lookup("FERRYMQ_BUS_LISTEN_SHARDS"); ok && v != "" {
		s.ListenShards = v
	}
	if v, ok := lookup("FERRYMQ_BUS_SERIALIZER"); ok && v != "" {
		s.Serializer = v
	}
	for _, o := range overrides {
		o(&s)
	}
	return s, s.Check()
}

// Check validates the settings.
func (s *BusSettings) Check() error {
	if s.Shards < 1 || s.Shards > PartitionsMax {
		return busErr("the shard count is 1..=1024 (a topic's partitions), got %d", s.Shards)
	}
	if s.Identity == "" || len(s.Identity) > 200 {
		return busErr("the identity is 1..=200 bytes: it names subscriptions and appears in topics")
	}
	if s.TopicTemplate == "" {
		s.TopicTemplate = "{type}"
	}
	if s.ListenShards != "" {
		rs, err := ParsePartitions(s.ListenShards)
		if err != nil {
			return busErr("%v", err)
		}
		for _, r := range rs {
			if int(r.Last) >= s.Shards {
				return busErr("shard %d in %q is not below the shard count %d", r.Last, s.ListenShards, s.Shards)
			}
		}
	}
	return nil
}

func (s *BusSettings) topic(schema *Schema, sender string) string {
	if schema.Topic != "" {
		return schema.Topic
	}
	return strings.NewReplacer("{type}", schema.Name, "{sender}", sender).Replace(s.TopicTemplate)
}

// Bus sends and receives typed messages over a Client.
type Bus struct {
	client      *Client
	settings    BusSettings
	serializers *Serializers
	storage     Storage

	mu    sync.Mutex
	ready map[string]bool
}

// BusOption changes a Bus.
type BusOption func(*Bus)

// WithSerializers replaces the serializers (DefaultSerializers by default).
func WithSerializers(s *Serializers) BusOption { return func(b *Bus) { b.serializers = s } }

// WithBusStorage is the storage of the topics the bus creates (disk by default).
func WithBusStorage(s Storage) BusOption { return func(b *Bus) { b.storage = s } }

// NewBus makes a bus; an unknown serializer in the settings fails here.
func NewBus(c *Client, s BusSettings, opts ...BusOption) (*Bus, error) {
	if err := s.Check(); err != nil {
		return nil, err
	}
	b := &Bus{client: c, settings: s, serializers: DefaultSerializers(), storage: StorageDisk, ready: map[string]bool{}}
	for _, o := range opts {
		o(b)
	}
	if _, err := b.serializers.Get(s.Serializer); err != nil {
		return nil, err
	}
	return b, nil
}

// Settings returns the bus's settings.
func (b *Bus) Settings() BusSettings { return b.settings }

func (b *Bus) ensureTopic(ctx context.Context, topic string) error {
	b.mu.Lock()
	ok := b.ready[topic]
	b.mu.Unlock()
	if ok {
		return nil
	}
	n := b.settings.Shards
	if err := b.client.EnsureTopic(ctx, topic, TopicConfig{Partitions: uint32(n), Storage: b.storage}); err != nil {
		return err
	}
	info, err := b.client.DescribeTopic(ctx, topic)
	if err != nil {
		return err
	}
	if int(info.Config.Partitions) != n {
		return busErr("topic %q has %d partitions but the bus has %d shards: every service must use the same shard count (FERRYMQ_BUS_SHARDS)", topic, info.Config.Partitions, n)
	}
	b.mu.Lock()
	b.ready[topic] = true
	b.mu.Unlock()
	return nil
}

// SendOptions change one send.
type SendOptions struct {
	// Serializer overrides the settings' serializer.
	Serializer string
	// ShardResolver replaces the default shard rule: (key, shard count) -> shard.
	ShardResolver func(key any, shards int) int
	Priority      uint8
	Delay         time.Duration
}

// Prepared is a typed message made ready for the broker.
type Prepared struct {
	Topic   string
	Shard   int
	Message Message
}

func nowMs() string { return strconv.FormatInt(time.Now().UnixMilli(), 10) }

// Prepare serializes msg and returns its topic, shard and broker message, without sending it.
func Prepare[T any](b *Bus, msg T, opts ...SendOptions) (*Prepared, error) {
	var o SendOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	schema, err := SchemaOf(reflect.TypeOf(msg))
	if err != nil {
		return nil, err
	}
	values, err := schema.values(reflect.ValueOf(msg))
	if err != nil {
		return nil, err
	}
	key := values[schema.Key]
	n := b.settings.Shards
	var shard int
	if o.ShardResolver != nil {
		shard = o.ShardResolver(key, n)
		if shard < 0 || shard >= n {
			return nil, busErr("the shard resolver returned %d for %v: a shard is 0..%d", shard, key, n-1)
		}
	} else if shard, err = ShardForKey(key, n); err != nil {
		return nil, err
	}
	name := o.Serializer
	if name == "" {
		name = b.settings.Serializer
	}
	ser, err := b.serializers.Get(name)
	if err != nil {
		return nil, err
	}
	body, err := ser.Marshal(schema, values)
	if err != nil {
		return nil, err
	}
	kb, err := KeyBytes(key)
	if err != nil {
		return nil, err
	}
	m := Message{Key: kb, Priority: o.Priority, Body: body, Headers: []Header{
		{HeaderBusType, schema.Name}, {HeaderBusSerializer, name}, {HeaderBusSender, b.settings.Identity},
		{HeaderBusShard, strconv.Itoa(shard)}, {HeaderBusPrepared, nowMs()},
	}}
	if o.Delay > 0 {
		m.DeliverAfterMs = DelayMs(uint64(o.Delay / time.Millisecond))
	}
	return &Prepared{Topic: b.settings.topic(schema, b.settings.Identity), Shard: shard, Message: m}, nil
}

// Send publishes one typed message to its shard and waits for the receipt.
func Send[T any](ctx context.Context, b *Bus, msg T, opts ...SendOptions) (Position, error) {
	ids, err := SendMany(ctx, b, []T{msg}, opts...)
	if err != nil {
		return Position{}, err
	}
	return ids[0], nil
}

// SendMany publishes typed messages, one batch per (topic, shard) with several in flight, and
// returns their ids in order.
func SendMany[T any](ctx context.Context, b *Bus, msgs []T, opts ...SendOptions) ([]Position, error) {
	type group struct {
		topic string
		shard int
		idx   []int
		msgs  []Message
	}
	var groups []*group
	byKey := map[string]*group{}
	for i, msg := range msgs {
		p, err := Prepare(b, msg, opts...)
		if err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		k := p.Topic + "\x00" + strconv.Itoa(p.Shard)
		g := byKey[k]
		if g == nil {
			g = &group{topic: p.Topic, shard: p.Shard}
			byKey[k] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
		g.msgs = append(g.msgs, p.Message)
	}
	pending := make([]*PendingPublish, len(groups))
	for gi, g := range groups {
		if err := b.ensureTopic(ctx, g.topic); err != nil {
			return nil, err
		}
		sent := nowMs()
		for i := range g.msgs {
			g.msgs[i].Headers = append(g.msgs[i].Headers, Header{HeaderBusSent, sent})
		}
		pending[gi] = b.client.PublishBatchAsync(ctx, g.topic, g.msgs, ToPartition(uint32(g.shard)))
	}
	out := make([]Position, len(msgs))
	var firstErr error
	for gi, p := range pending {
		r, err := p.Wait(ctx)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		for j, i := range groups[gi].idx {
			out[i] = r.IDs[j]
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return out, nil
}

// ---- receiving

// Outcomes of a received bus message.
const (
	OutcomeHandled      = "handled"
	OutcomeRefused      = "refused"
	OutcomeFailed       = "failed"
	OutcomeDeadLettered = "dead_lettered"
	OutcomeSkipped      = "skipped"
)

// MessageContext is what a handler knows about the message it handles.
type MessageContext struct {
	Delivery   *Delivery
	Type       string
	Sender     string
	Shard      int
	Serializer string
	Attempt    uint16
}

// MessageStats is one message's outcome, size and UTC times. Prepared and Sent are zero when
// the sender did not say.
type MessageStats struct {
	Message  any
	Type     string
	Outcome  string
	Size     int
	Prepared time.Time
	Sent     time.Time
	Received time.Time
	Handled  time.Time
	Shard    int
	Sender   string
	Error    string
}

// Handler handles one message type T. Before returns false to refuse a message (it is acked
// without handling); Handle returning an error (or panicking) nacks it so that the broker
// delivers it again up to the subscription's max attempts; After runs once it was handled.
// Before and After may be nil.
type Handler[T any] struct {
	Before func(ctx context.Context, msg T, mc *MessageContext) bool
	Handle func(ctx context.Context, msg T, mc *MessageContext) error
	After  func(ctx context.Context, msg T, mc *MessageContext) error
}

type typeHandler struct {
	schema *Schema
	run    func(ctx context.Context, v reflect.Value, mc *MessageContext) (outcome, reason string, msg any)
}

// ReceiverOptions configure a Receiver; zero values let the broker decide, except Window.
type ReceiverOptions struct {
	// OnStats receives every message's statistics.
	OnStats     func(MessageStats)
	Window      uint32
	AckTimeout  time.Duration
	MaxAttempts uint32
	// Start is where new subscriptions start: earliest by default.
	Start *Start
	// Logf logs handler failures; log.Printf by default.
	Logf func(format string, args ...any)
}

// Receiver receives the message types of its handlers from the listened services and shards.
type Receiver struct {
	bus      *Bus
	opts     ReceiverOptions
	handlers map[string]*typeHandler

	mu     sync.Mutex
	subs   []*Subscription
	cancel context.CancelFunc
	wg     sync.WaitGroup
	counts map[string]int
	errs   chan error
}

// NewReceiver makes a receiver; add handlers with Handle, then Start.
func NewReceiver(b *Bus, opts ReceiverOptions) *Receiver {
	if opts.Logf == nil {
		opts.Logf = log.Printf
	}
	return &Receiver{bus: b, opts: opts, handlers: map[string]*typeHandler{}, counts: map[string]int{}, errs: make(chan error, 1)}
}

// Handle adds the handler of message type T.
func Handle[T any](r *Receiver, h Handler[T]) error {
	var zero T
	schema, err := SchemaOf(reflect.TypeOf(zero))
	if err != nil {
		return err
	}
	if h.Handle == nil {
		return busErr("the handler of %s has no Handle", schema.Name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel != nil {
		return busErr("the receiver is already started")
	}
	if _, dup := r.handlers[schema.Name]; dup {
		return busErr("two handlers for %s", schema.Name)
	}
	r.handlers[schema.Name] = &typeHandler{schema: schema, run: func(ctx context.Context, v reflect.Value, mc *MessageContext) (outcome, reason string, msg any) {
		m := v.Interface().(T)
		defer func() {
			if p := recover(); p != nil {
				outcome, reason = OutcomeFailed, fmt.Sprintf("handler of %s panicked: %v", schema.Name, p)
			}
		}()
		if h.Before != nil && !h.Before(ctx, m, mc) {
			return OutcomeRefused, "", m
		}
		if err := h.Handle(ctx, m, mc); err != nil {
			return OutcomeFailed, fmt.Sprintf("handler of %s failed: %v", schema.Name, err), m
		}
		if h.After != nil {
			func() {
				defer func() {
					if p := recover(); p != nil {
						r.opts.Logf("ferrymq bus: After of %s panicked: %v; the message was handled and is acked", schema.Name, p)
					}
				}()
				if err := h.After(ctx, m, mc); err != nil {
					r.opts.Logf("ferrymq bus: After of %s failed: %v; the message was handled and is acked", schema.Name, err)
				}
			}()
		}
		return OutcomeHandled, "", m
	}}
	return nil
}

type busTopic struct {
	topic  string
	sender string
}

func (r *Receiver) topics() ([]busTopic, error) {
	s := &r.bus.settings
	perSender := strings.Contains(s.TopicTemplate, "{sender}")
	var out []busTopic
	for _, h := range r.handlers {
		if perSender && h.schema.Topic == "" {
			if len(s.ListenServices) == 0 {
				return nil, busErr("with a {sender} topic template, ListenServices must name the senders")
			}
			for _, svc := range s.ListenServices {
				out = append(out, busTopic{s.topic(h.schema, svc), svc})
			}
		} else {
			out = append(out, busTopic{s.topic(h.schema, ""), ""})
		}
	}
	return out, nil
}

// Start subscribes to every topic; messages are handled from then on until Stop.
func (r *Receiver) Start(ctx context.Context) error {
	r.mu.Lock()
	if r.cancel != nil {
		r.mu.Unlock()
		return busErr("the receiver is already started")
	}
	if len(r.handlers) == 0 {
		r.mu.Unlock()
		return busErr("a receiver needs at least one handler")
	}
	runCtx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	r.mu.Unlock()
	topics, err := r.topics()
	if err != nil {
		r.Stop(ctx)
		return err
	}
	s := &r.bus.settings
	parts, _ := ParsePartitions(s.ListenShards)
	start := Start{Kind: StartEarliest}
	if r.opts.Start != nil {
		start = *r.opts.Start
	}
	for _, t := range topics {
		if err := r.bus.ensureTopic(ctx, t.topic); err != nil {
			r.Stop(ctx)
			return err
		}
		sub, err := r.bus.client.Subscribe(ctx, t.topic, SubscribeOptions{Subscription: s.Identity, Start: start, AckTimeout: r.opts.AckTimeout,
			MaxAttempts: r.opts.MaxAttempts, Window: r.opts.Window, Partitions: parts})
		if err != nil {
			r.Stop(ctx)
			return err
		}
		r.mu.Lock()
		r.subs = append(r.subs, sub)
		r.mu.Unlock()
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			for {
				d, err := sub.Next(runCtx)
				if err != nil {
					if runCtx.Err() == nil && !errors.Is(err, ErrClosed) {
						select {
						case r.errs <- err:
						default:
						}
					}
					return
				}
				// A message taken is handled and settled even when Stop comes meanwhile.
				r.Process(context.WithoutCancel(runCtx), d)
			}
		}()
	}
	return nil
}

// Run starts the receiver (unless started) and handles messages until ctx ends (it returns nil)
// or a subscription ends with an error (returned); it stops the receiver before returning.
func (r *Receiver) Run(ctx context.Context) error {
	r.mu.Lock()
	started := r.cancel != nil
	r.mu.Unlock()
	if !started {
		if err := r.Start(ctx); err != nil {
			return err
		}
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-r.errs:
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	r.Stop(stopCtx)
	return err
}

// Err returns a channel that receives the first error that ended a subscription.
func (r *Receiver) Err() <-chan error { return r.errs }

// Stop closes the subscriptions and waits for the messages being handled.
func (r *Receiver) Stop(ctx context.Context) error {
	r.mu.Lock()
	subs, cancel := r.subs, r.cancel
	r.subs = nil
	r.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	r.wg.Wait()
	var first error
	for _, s := range subs {
		if err := s.Close(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Counts returns how many messages ended with each outcome.
func (r *Receiver) Counts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.counts))
	for k, v := range r.counts {
		out[k] = v
	}
	return out
}

func msTime(v string) time.Time {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}
	}
	return time.UnixMilli(n).UTC()
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }

// Process handles one delivery and settles it; it returns the outcome.
func (r *Receiver) Process(ctx context.Context, d *Delivery) string {
	received := time.Now().UTC()
	h := map[string]string{}
	for _, hd := range d.Message.Headers {
		if _, ok := h[hd.Name]; !ok {
			h[hd.Name] = hd.Value
		}
	}
	typeName, sender := h[HeaderBusType], h[HeaderBusSender]
	shard := -1
	if n, err := strconv.Atoi(h[HeaderBusShard]); err == nil && n >= 0 {
		shard = n
	}
	var outcome, reason string
	var msg any
	var settleErr error
	listens := len(r.bus.settings.ListenServices) == 0
	for _, s := range r.bus.settings.ListenServices {
		listens = listens || s == sender
	}
	deadLetter := func(why string) {
		outcome, reason = OutcomeDeadLettered, why
		settleErr = d.Nack(ctx, NackOptions{DeadLetter: true, Reason: truncate(why, ReasonBytesMax)})
	}
	th := r.handlers[typeName]
	switch {
	case !listens:
		outcome = OutcomeSkipped
		settleErr = d.Ack(ctx)
	case th == nil:
		deadLetter(fmt.Sprintf("no handler for message type %q in receiver %q", typeName, r.bus.settings.Identity))
	default:
		serName := h[HeaderBusSerializer]
		ser, err := r.bus.serializers.Get(serName)
		if err != nil {
			deadLetter(err.Error())
			break
		}
		vals, err := ser.Unmarshal(th.schema, d.Message.Body)
		if err != nil {
			deadLetter(err.Error())
			break
		}
		v, err := th.schema.build(vals)
		if err != nil {
			deadLetter(err.Error())
			break
		}
		mc := &MessageContext{Delivery: d, Type: typeName, Sender: sender, Shard: shard, Serializer: serName, Attempt: d.Attempt}
		outcome, reason, msg = th.run(ctx, v, mc)
		switch outcome {
		case OutcomeFailed:
			r.opts.Logf("ferrymq bus: message %v (%s, attempt %d): %s", d.ID(), typeName, d.Attempt, reason)
			settleErr = d.Nack(ctx, NackOptions{Reason: truncate(reason, ReasonBytesMax)})
		default:
			settleErr = d.Ack(ctx)
		}
	}
	if settleErr != nil && ctx.Err() == nil {
		r.opts.Logf("ferrymq bus: settling message %v: %v", d.ID(), settleErr)
	}
	r.mu.Lock()
	r.counts[outcome]++
	r.mu.Unlock()
	if r.opts.OnStats != nil {
		st := MessageStats{Message: msg, Type: typeName, Outcome: outcome, Size: len(d.Message.Body), Prepared: msTime(h[HeaderBusPrepared]),
			Sent: msTime(h[HeaderBusSent]), Received: received, Handled: time.Now().UTC(), Shard: shard, Sender: sender, Error: reason}
		func() {
			defer func() {
				if p := recover(); p != nil {
					r.opts.Logf("ferrymq bus: the statistics hook panicked: %v", p)
				}
			}()
			r.opts.OnStats(st)
		}()
	}
	return outcome
}
