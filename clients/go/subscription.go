package ferrymq

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// SubscribeOptions configure a consumer. Zero values let the broker decide, except Window.
type SubscribeOptions struct {
	// Subscription names a shared subscription; empty creates an ephemeral one.
	Subscription string
	// Start applies when the subscription is created (latest by default).
	Start Start
	// AckTimeout and MaxAttempts: zero takes the broker's defaults.
	AckTimeout  time.Duration
	MaxAttempts uint32
	// Window is the credit window: messages delivered and not yet settled at most (256 by
	// default). Credit goes back to the broker as messages are acked or nacked (auto-ack: as
	// Next returns them).
	Window uint32
	// AutoAck is at-most-once delivery; Ordered keeps one message per key in flight.
	AutoAck, Ordered bool
	// Partitions this consumer takes; empty takes every partition. See ParsePartitions.
	Partitions []PartitionRange
	// DeadLetterTopic is where given-up messages go; empty is <topic>.dlq.
	DeadLetterTopic string
}

// Subscription is one consumer. Next returns its messages; Close releases it.
//
// In a cluster it is attached on every node (see Client.Subscribe): each node's attachment is a
// leg, and the deliveries of every leg are merged into the one queue Next reads.
type Subscription struct {
	client *Client
	topic  string
	opts   SubscribeOptions
	// cluster: attached on every node, each leg on a connection of its own that the
	// subscription dials, watches and closes; otherwise one leg on the client's connection.
	cluster bool
	ctx     context.Context // ends with the subscription
	cancel  context.CancelFunc
	wg      sync.WaitGroup // the legs' goroutines (cluster only)

	mu         sync.Mutex
	legs       []*leg
	name       string
	partitions uint32
	queue      []*Delivery
	ackPending []*Delivery
	ackTimer   *time.Timer
	err        error
	notify     chan struct{}
	ended      chan struct{}
}

// leg is the subscription's consumer on one node: the connection it is attached on (nil while
// it is not) and the consumer id that node gave it. Guarded by the subscription's mu.
type leg struct {
	node uint64 // the cluster's node id; 0 for the client's own connection
	addr string
	conn *conn
	cid  uint32
	owed uint32 // credit returned by the application, not yet sent
}

// Delivery is one message delivered to a Subscription; settle it once with Ack, AckWithResult,
// Nack or Release (auto-ack subscriptions need none). Its key and body share the memory of the
// frame they arrived in (many deliveries each): copy them to keep one long after the others.
type Delivery struct {
	DeliveryRecord
	sub  *Subscription
	conn *conn // the connection it came on: its acks go there
	cid  uint32
}

// ID is the message id, `<partition>-<offset>`.
func (d *Delivery) ID() Position { return Position{d.Partition, d.Offset} }

// Time is the broker's publish time.
func (d *Delivery) Time() time.Time { return time.UnixMilli(int64(d.TimestampMs)).UTC() }

func newSubscription(c *Client, topic string, opts SubscribeOptions, cluster bool) *Subscription {
	s := &Subscription{client: c, topic: topic, opts: opts, cluster: cluster, notify: make(chan struct{}, 1), ended: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// Subscribe attaches a consumer to a topic.
//
// In a cluster (CLUSTER_INFO names more than one node, and Options.LeaderTimeout is not
// negative) only a partition's leader delivers its messages and takes their acks, so the
// subscription is attached on every node the cluster names, each on a connection of its own:
// Next returns what any node delivered, and each Ack, Nack or Release goes to the node that
// delivered the message. A node whose connection breaks is attached again (with backoff from
// 50 ms to 1 s, reading CLUSTER_INFO again so that restarted or new nodes are found). Each node
// gets the credit window of its own. Subscribe returns once at least one node has attached it;
// a refusal (a missing grant, an invalid option) is its error.
func (c *Client) Subscribe(ctx context.Context, topic string, opts SubscribeOptions) (*Subscription, error) {
	if opts.Window == 0 {
		opts.Window = 256
	}
	k, err := c.conn(ctx)
	if err != nil {
		// The first node is gone: in a cluster the others serve the subscription.
		if !c.following() || errors.Is(err, ErrClosed) || ctx.Err() != nil {
			return nil, err
		}
		if other, aerr := c.anyConn(ctx); aerr == nil {
			if nodes := c.subscriptionNodes(ctx, other); len(nodes) > 1 {
				return c.subscribeCluster(ctx, topic, opts, nodes)
			}
		}
		return nil, err
	}
	if nodes := c.subscriptionNodes(ctx, k); len(nodes) > 1 {
		return c.subscribeCluster(ctx, topic, opts, nodes)
	}
	s := newSubscription(c, topic, opts, false)
	s.legs = []*leg{{addr: k.addr}}
	// Known to the client before SUBSCRIBE goes, so that a connection lost meanwhile ends it or
	// attaches it again.
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	c.subs[s] = struct{}{}
	c.mu.Unlock()
	if err := s.attach(ctx, k); err != nil {
		s.end(nil, err)
		s.mu.Lock()
		other, cid := s.legs[0].conn, s.legs[0].cid
		s.mu.Unlock()
		if other != nil && other != k {
			// A reconnection attached it meanwhile: take that consumer down.
			other.mu.Lock()
			delete(other.consumers, cid)
			other.mu.Unlock()
			other.sendNoReply(0, &Unsubscribe{ConsumerID: cid})
		}
		return nil, err
	}
	return s, nil
}

// attach sends SUBSCRIBE on k (the client's connection) for the only leg.
func (s *Subscription) attach(ctx context.Context, k *conn) error {
	return s.attachLeg(ctx, s.legs[0], k)
}

// attachLeg sends SUBSCRIBE on k for l and registers the consumer before any delivery is read.
func (s *Subscription) attachLeg(ctx context.Context, l *leg, k *conn) error {
	o := &s.opts
	// An ephemeral subscription is gone with its connection: after a reconnection a new one is
	// made (empty name again).
	f := &Subscribe{Topic: s.topic, Subscription: o.Subscription, Start: o.Start, AckTimeoutMs: uint32(o.AckTimeout / time.Millisecond),
		MaxAttempts: o.MaxAttempts, Credit: o.Window, AutoAck: o.AutoAck, Ordered: o.Ordered, Partitions: o.Partitions, DeadLetterTopic: o.DeadLetterTopic}
	if f.Partitions == nil {
		f.Partitions = []PartitionRange{}
	}
	ch := make(chan result, 1)
	err := k.start(f, func(p Payload, err error) {
		if sd, ok := p.(*Subscribed); ok && err == nil {
			// On the reader goroutine: registered before the next frame is read.
			s.mu.Lock()
			l.conn, l.cid, l.owed = k, sd.ConsumerID, 0
			if s.name == "" || !s.cluster {
				s.name = sd.Subscription
			}
			s.partitions = sd.Partitions
			s.dropStale()
			s.mu.Unlock()
			k.mu.Lock()
			k.consumers[sd.ConsumerID] = s
			k.mu.Unlock()
		}
		ch <- result{p, err}
	})
	if err != nil && err != errAlreadyCompleted {
		return err
	}
	select {
	case r := <-ch:
		if r.err != nil {
			return r.err
		}
		if _, ok := r.p.(*Subscribed); !ok {
			return &ProtocolError{Kind: KindInvalidValue, Field: "answer", Msg: fmt.Sprintf("SUBSCRIBE answered with %#x", uint16(r.p.Opcode()))}
		}
		return nil
	case <-ctx.Done():
		// The consumer may exist: take it down when its SUBSCRIBED comes.
		go func() {
			r := <-ch
			if sd, ok := r.p.(*Subscribed); ok {
				k.mu.Lock()
				delete(k.consumers, sd.ConsumerID)
				k.mu.Unlock()
				k.sendNoReply(0, &Unsubscribe{ConsumerID: sd.ConsumerID})
			}
		}()
		return &CancelledError{Sent: true, Err: ctx.Err()}
	}
}

// legOf is the leg attached on k; nil when none is (any longer). Called with s.mu held.
func (s *Subscription) legOf(k *conn) *leg {
	if k == nil {
		return nil
	}
	for _, l := range s.legs {
		if l.conn == k {
			return l
		}
	}
	return nil
}

// current reports whether d came on the attachment its leg still has, so that it can be
// settled. Called with s.mu held.
func (s *Subscription) current(d *Delivery) *leg {
	if l := s.legOf(d.conn); l != nil && l.cid == d.cid {
		return l
	}
	return nil
}

// dropStale forgets the deliveries received and acks gathered on attachments that are gone:
// the broker delivers those messages again. Called with s.mu held.
func (s *Subscription) dropStale() {
	keep := s.queue[:0]
	for _, d := range s.queue {
		if s.current(d) != nil {
			keep = append(keep, d)
		}
	}
	clear(s.queue[len(keep):])
	s.queue = keep
	pending := s.ackPending[:0]
	for _, d := range s.ackPending {
		if s.current(d) != nil {
			pending = append(pending, d)
		}
	}
	clear(s.ackPending[len(pending):])
	s.ackPending = pending
}

// Name is the subscription's name (the broker's for an ephemeral one; in a cluster, the
// first node's: each node makes an ephemeral subscription of its own).
func (s *Subscription) Name() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.name
}

// Partitions is the topic's partition count.
func (s *Subscription) Partitions() uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.partitions
}

func (s *Subscription) push(k *conn, ds []DeliveryRecord) {
	s.mu.Lock()
	l := s.legOf(k)
	if l == nil || s.err != nil {
		s.mu.Unlock()
		return
	}
	cid := l.cid
	for i := range ds {
		s.queue = append(s.queue, &Delivery{DeliveryRecord: ds[i], sub: s, conn: k, cid: cid})
	}
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// end stops the subscription with err; from a connection k only if a leg is still attached
// on it.
func (s *Subscription) end(k *conn, err error) {
	s.mu.Lock()
	if s.err != nil || (k != nil && s.legOf(k) == nil) {
		s.mu.Unlock()
		return
	}
	s.err = err
	s.queue = nil
	s.ackPending = nil
	if s.ackTimer != nil {
		s.ackTimer.Stop()
		s.ackTimer = nil
	}
	close(s.ended)
	s.mu.Unlock()
	s.cancel()
	s.client.mu.Lock()
	delete(s.client.subs, s)
	s.client.mu.Unlock()
}

// Next waits for the next message. It fails when ctx ends, or with the reason the
// subscription ended (ErrClosed after Close, the broker's error, a lost connection).
func (s *Subscription) Next(ctx context.Context) (*Delivery, error) {
	for {
		s.mu.Lock()
		if s.err != nil {
			err := s.err
			s.mu.Unlock()
			return nil, err
		}
		if len(s.queue) > 0 {
			d := s.queue[0]
			s.queue[0] = nil
			s.queue = s.queue[1:]
			s.mu.Unlock()
			if s.opts.AutoAck {
				s.giveCredit(d.conn, 1)
			}
			return d, nil
		}
		gathered := len(s.ackPending) > 0
		s.mu.Unlock()
		if gathered {
			s.flushAcks()
			continue
		}
		select {
		case <-s.notify:
		case <-s.ended:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// NextBatch waits for at least one message and returns up to max of those already received.
func (s *Subscription) NextBatch(ctx context.Context, max int) ([]*Delivery, error) {
	if max < 1 {
		max = 1
	}
	for {
		s.mu.Lock()
		if s.err != nil {
			err := s.err
			s.mu.Unlock()
			return nil, err
		}
		if n := len(s.queue); n > 0 {
			if n > max {
				n = max
			}
			out := make([]*Delivery, n)
			copy(out, s.queue)
			clear(s.queue[:n])
			s.queue = s.queue[n:]
			s.mu.Unlock()
			if s.opts.AutoAck {
				for _, g := range byConn(out) {
					s.giveCredit(g[0].conn, uint32(len(g)))
				}
			}
			return out, nil
		}
		gathered := len(s.ackPending) > 0
		s.mu.Unlock()
		if gathered {
			s.flushAcks()
			continue
		}
		select {
		case <-s.notify:
		case <-s.ended:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// byConn groups deliveries by the connection they came on, in order of first appearance.
func byConn(ds []*Delivery) [][]*Delivery {
	if len(ds) > 0 && ds[0].conn == ds[len(ds)-1].conn {
		same := true
		for _, d := range ds {
			if d.conn != ds[0].conn {
				same = false
				break
			}
		}
		if same {
			return [][]*Delivery{ds}
		}
	}
	var out [][]*Delivery
	index := map[*conn]int{}
	for _, d := range ds {
		i, ok := index[d.conn]
		if !ok {
			i = len(out)
			index[d.conn] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], d)
	}
	return out
}

// giveCredit returns n credit to the leg attached on k, batched: a CREDIT goes once a quarter
// of the window is owed.
func (s *Subscription) giveCredit(k *conn, n uint32) {
	s.mu.Lock()
	l := s.legOf(k)
	if l == nil || s.err != nil {
		s.mu.Unlock()
		return
	}
	l.owed += n
	threshold := s.opts.Window / 4
	if threshold == 0 {
		threshold = 1
	}
	if l.owed < threshold {
		s.mu.Unlock()
		return
	}
	owed, cid := l.owed, l.cid
	l.owed = 0
	s.mu.Unlock()
	k.sendNoReply(0, &Credit{ConsumerID: cid, Credit: owed})
}

// coalesce turns deliveries into ranges of consecutive offsets per partition.
func coalesce(ds []*Delivery) []Range {
	sorted := append([]*Delivery(nil), ds...)
	sort.Slice(sorted, func(i, j int) bool {
		if sorted[i].Partition != sorted[j].Partition {
			return sorted[i].Partition < sorted[j].Partition
		}
		return sorted[i].Offset < sorted[j].Offset
	})
	var out []Range
	for _, d := range sorted {
		if n := len(out); n > 0 && out[n-1].Partition == d.Partition && out[n-1].Offset+uint64(out[n-1].Count) == d.Offset {
			out[n-1].Count++
			continue
		}
		if n := len(out); n > 0 && out[n-1].Partition == d.Partition && out[n-1].Offset+uint64(out[n-1].Count) > d.Offset {
			continue // the same delivery twice
		}
		out = append(out, Range{Partition: d.Partition, Offset: d.Offset, Count: 1})
	}
	return out
}

// NackOptions say what a Nack does.
type NackOptions struct {
	// Delay before the messages are ready again; zero is at once.
	Delay time.Duration
	// DeadLetter moves them to the dead-letter topic now.
	DeadLetter bool
	// Reason is carried in the dead letter's x-ferrymq-dead-reason header.
	Reason string
}

// settle sends one ACK, ACK_RESULT or NACK for deliveries of this subscription to each node
// that delivered some of them, and returns their credit. It waits for every node's answer and
// returns the first error.
func (s *Subscription) settle(ctx context.Context, ds []*Delivery, build func(cid uint32, rs []Range) Payload) error {
	if len(ds) == 0 {
		return nil
	}
	for _, d := range ds {
		if d.sub != s {
			return fmt.Errorf("ferrymq: delivery %v is not of this subscription", d.ID())
		}
	}
	groups := byConn(ds)
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		return err
	}
	cids := make([]uint32, len(groups))
	for i, g := range groups {
		for _, d := range g {
			if s.current(d) == nil {
				s.mu.Unlock()
				return &ConnectionLostError{Err: fmt.Errorf("delivery %v came on an earlier connection; the broker delivers it again", d.ID())}
			}
		}
		cids[i] = g[0].cid
	}
	s.mu.Unlock()
	one := func(i int) error {
		k := groups[i][0].conn
		_, err := k.roundTrip(ctx, build(cids[i], coalesce(groups[i])))
		if err == nil && !s.opts.AutoAck {
			s.giveCredit(k, uint32(len(groups[i])))
		}
		return err
	}
	if len(groups) == 1 {
		return one(0)
	}
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for i := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = one(i)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Ack acks deliveries of this subscription in one request (in a cluster, one per node that
// delivered some of them), and waits for the broker's answer: in a cluster the ack is then
// committed through the partition's group, and the message is not delivered again, not even by
// the next leader after a failover. An ack refused with not_leader (the node stopped leading
// the partition) has an unknown outcome: the message may come again.
func (s *Subscription) Ack(ctx context.Context, ds ...*Delivery) error {
	return s.settle(ctx, ds, func(cid uint32, rs []Range) Payload { return &Ack{ConsumerID: cid, Ranges: rs} })
}

// AckNoWait acks deliveries without waiting for the broker's answer (request id 0, so a
// refusal reaches only Options.OnError). Acks are gathered: they go in one ACK (per node) once a
// quarter of the window is pending, when Next finds nothing to return, after 2 ms, or on Close.
// It fails only for a delivery this consumer cannot ack.
func (s *Subscription) AckNoWait(ds ...*Delivery) error {
	if len(ds) == 0 {
		return nil
	}
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		return err
	}
	for _, d := range ds {
		if d.sub != s || s.current(d) == nil {
			s.mu.Unlock()
			return &ConnectionLostError{Err: fmt.Errorf("delivery %v is not of this consumer's connection", d.ID())}
		}
	}
	s.ackPending = append(s.ackPending, ds...)
	full := uint32(len(s.ackPending)) >= max(s.opts.Window/4, 1)
	if !full && s.ackTimer == nil {
		s.ackTimer = time.AfterFunc(2*time.Millisecond, func() { s.flushAcks() })
	}
	s.mu.Unlock()
	if full {
		return s.flushAcks()
	}
	return nil
}

// flushAcks sends the gathered acks of the current attachments and returns their credit.
func (s *Subscription) flushAcks() error {
	s.mu.Lock()
	pending := s.ackPending
	s.ackPending = nil
	if s.ackTimer != nil {
		s.ackTimer.Stop()
		s.ackTimer = nil
	}
	ds := pending[:0]
	for _, d := range pending {
		if s.current(d) != nil {
			ds = append(ds, d)
		}
	}
	s.mu.Unlock()
	var first error
	for _, g := range byConn(ds) {
		k := g[0].conn
		if err := k.sendNoReply(0, &Ack{ConsumerID: g[0].cid, Ranges: coalesce(g)}); err != nil {
			if first == nil {
				first = err
			}
			continue
		}
		if !s.opts.AutoAck {
			s.giveCredit(k, uint32(len(g)))
		}
	}
	return first
}

// AckWithResult acks deliveries and attaches result (at most 4096 bytes) to each.
func (s *Subscription) AckWithResult(ctx context.Context, result []byte, ds ...*Delivery) error {
	if len(result) > ResultBytesMax {
		return fmt.Errorf("%w: result of %d bytes, at most %d", ErrTooLarge, len(result), ResultBytesMax)
	}
	if result == nil {
		result = []byte{}
	}
	return s.settle(ctx, ds, func(cid uint32, rs []Range) Payload { return &AckResult{ConsumerID: cid, Result: result, Ranges: rs} })
}

// Nack gives deliveries back: again after o.Delay, or to the dead-letter topic.
func (s *Subscription) Nack(ctx context.Context, o NackOptions, ds ...*Delivery) error {
	if len(o.Reason) > ReasonBytesMax {
		return fmt.Errorf("%w: reason of %d bytes, at most %d", ErrTooLarge, len(o.Reason), ReasonBytesMax)
	}
	return s.settle(ctx, ds, func(cid uint32, rs []Range) Payload {
		return &Nack{ConsumerID: cid, DelayMs: uint32(o.Delay / time.Millisecond), DeadLetter: o.DeadLetter, Reason: o.Reason, Ranges: rs}
	})
}

// Release gives deliveries back unprocessed: their delivery does not count as an attempt.
func (s *Subscription) Release(ctx context.Context, ds ...*Delivery) error {
	return s.settle(ctx, ds, func(cid uint32, rs []Range) Payload {
		return &Nack{ConsumerID: cid, Release: true, Ranges: rs}
	})
}

// Ack acks the delivery.
func (d *Delivery) Ack(ctx context.Context) error { return d.sub.Ack(ctx, d) }

// AckWithResult acks the delivery with a result.
func (d *Delivery) AckWithResult(ctx context.Context, result []byte) error {
	return d.sub.AckWithResult(ctx, result, d)
}

// Nack gives the delivery back.
func (d *Delivery) Nack(ctx context.Context, o NackOptions) error { return d.sub.Nack(ctx, o, d) }

// Release gives the delivery back unprocessed.
func (d *Delivery) Release(ctx context.Context) error { return d.sub.Release(ctx, d) }

// Close releases the messages received and not yet returned by Next, and detaches the consumer
// (in a cluster, from every node, and closes the subscription's connections).
func (s *Subscription) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	}
	var queued []*Delivery
	for _, d := range s.queue {
		if s.current(d) != nil && !d.conn.isClosed() {
			queued = append(queued, d)
		}
	}
	type attached struct {
		k   *conn
		cid uint32
	}
	var legs []attached
	for _, l := range s.legs {
		if l.conn != nil && !l.conn.isClosed() {
			legs = append(legs, attached{l.conn, l.cid})
		}
	}
	s.mu.Unlock()
	var err error
	if len(legs) > 0 {
		err = s.flushAcks()
		if len(queued) > 0 && !s.opts.AutoAck {
			if e := s.Release(ctx, queued...); e != nil && err == nil {
				err = e
			}
		}
		if s.cluster && isConnectionError(err) {
			err = nil // a node lost meanwhile: it delivers nothing more, and its messages come again
		}
	}
	for _, a := range legs {
		a.k.mu.Lock()
		delete(a.k.consumers, a.cid)
		a.k.mu.Unlock()
		if _, e := a.k.roundTrip(ctx, &Unsubscribe{ConsumerID: a.cid}); e != nil && err == nil && !(s.cluster && isConnectionError(e)) {
			err = e
		}
	}
	s.end(nil, ErrClosed)
	s.wg.Wait()
	return err
}

// ParsePartitions reads a partition list such as `1,2,4-7`.
func ParsePartitions(s string) ([]PartitionRange, error) {
	var out []PartitionRange
	if s == "" {
		return out, nil
	}
	start := 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) && s[i] != ',' {
			continue
		}
		part := s[start:i]
		start = i + 1
		var a, b uint32
		if n, err := fmt.Sscanf(part, "%d-%d", &a, &b); err == nil && n == 2 && fmt.Sprintf("%d-%d", a, b) == part {
		} else if n, err := fmt.Sscanf(part, "%d", &a); err == nil && n == 1 && fmt.Sprintf("%d", a) == part {
			b = a
		} else {
			return nil, fmt.Errorf("ferrymq: %q is not a partition list such as 1,2,4-7", s)
		}
		if b < a {
			return nil, fmt.Errorf("ferrymq: partition range %q runs backwards", part)
		}
		out = append(out, PartitionRange{First: a, Last: b})
	}
	return out, nil
}
