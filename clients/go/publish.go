package ferrymq

import (
	"context"
	"errors"
	"fmt"
)

// PublishOption changes one publish.
type PublishOption func(*Publish)

// ToPartition sends every message of the publish to one partition instead of letting the
// broker choose.
func ToPartition(p uint32) PublishOption { return func(f *Publish) { f.Partition = &p } }

// Receipt confirms a publish: the durability reached and each message's id, in batch order.
type Receipt struct {
	Durability Durability
	IDs        []Position
}

// PendingPublish is a publish sent (or failed) and not yet confirmed.
type PendingPublish struct {
	done    chan struct{}
	receipt *Receipt
	err     error
}

// Done is closed when the publish is confirmed or failed.
func (p *PendingPublish) Done() <-chan struct{} { return p.done }

// Wait waits for the receipt. When ctx ends first the error matches ErrOutcomeUnknown if the
// publish was sent: it may still be stored.
func (p *PendingPublish) Wait(ctx context.Context) (*Receipt, error) {
	select {
	case <-p.done:
		return p.receipt, p.err
	default:
	}
	select {
	case <-p.done:
		return p.receipt, p.err
	case <-ctx.Done():
		return nil, &CancelledError{Sent: true, Err: ctx.Err()}
	}
}

func failedPublish(err error) *PendingPublish {
	p := &PendingPublish{done: make(chan struct{}), err: err}
	close(p.done)
	return p
}

// LimitError is a message refused before it was sent because it breaks a limit; it matches
// ErrTooLarge when a size limit is at fault.
type LimitError struct {
	Index int
	Err   error
}

func (e *LimitError) Error() string { return fmt.Sprintf("ferrymq: message %d: %v", e.Index, e.Err) }

// Unwrap gives the cause.
func (e *LimitError) Unwrap() error { return e.Err }

// PublishBatchAsync sends a batch and returns at once (after waiting, under ctx, for room in the
// publish window); the receipt comes later. Nothing of a batch that fails is reported stored.
// In a cluster the batch goes to its partition's leader, followed (see Client) while ctx lasts.
func (c *Client) PublishBatchAsync(ctx context.Context, topic string, msgs []Message, opts ...PublishOption) *PendingPublish {
	f := &Publish{Topic: topic, Messages: msgs}
	for _, o := range opts {
		o(f)
	}
	if len(msgs) > BatchCountMax {
		return failedPublish(fmt.Errorf("%w: %d messages in one batch, at most %d", ErrTooLarge, len(msgs), BatchCountMax))
	}
	key := publishRoute(topic, f.Partition)
	safe := allDeduplicated(msgs)
	k, err := c.leaderConn(ctx, key)
	if err != nil && !(c.following() && followable(err, safe)) {
		return failedPublish(err)
	}
	for i := range msgs {
		if err := checkMessage(&msgs[i]); err != nil {
			return failedPublish(&LimitError{Index: i, Err: err})
		}
		if k == nil {
			continue
		}
		if max := k.hello.MessageBytesMax; max != 0 && uint64(len(msgs[i].Body)) > uint64(max) {
			return failedPublish(&LimitError{Index: i, Err: fmt.Errorf("%w: body of %d bytes above message_bytes_max %d", ErrTooLarge, len(msgs[i].Body), max)})
		}
	}
	n, werr := c.pubWin.acquire(ctx, max(len(msgs), 1))
	if werr != nil {
		return failedPublish(&CancelledError{Err: werr})
	}
	p := &PendingPublish{done: make(chan struct{})}
	finish := func(r *Receipt, err error) {
		p.receipt, p.err = r, err
		c.pubWin.release(n)
		close(p.done)
	}
	// followed hands a failed publish to a goroutine that follows the leader; false when it
	// cannot be sent again.
	followed := func(err error, tried string) bool {
		if !c.following() || !followable(err, safe) {
			return false
		}
		return c.spawn(func() {
			fctx, cancel := c.withClient(ctx)
			defer cancel()
			var r *Receipt
			err := c.follow(fctx, key, safe, tried, err, func(k *conn) error {
				ans, err := k.roundTrip(fctx, f)
				r, err = publishAnswer(ans, err, len(msgs))
				return err
			})
			finish(r, err)
		})
	}
	if k == nil {
		if !followed(err, "") {
			finish(nil, err)
		}
		return p
	}
	err = k.start(f, func(ans Payload, err error) {
		r, err := publishAnswer(ans, err, len(msgs))
		if err != nil && followed(err, k.addr) {
			return
		}
		finish(r, err)
	})
	if err == errAlreadyCompleted {
		return p
	}
	if err != nil {
		var pe *ProtocolError
		if errors.As(err, &pe) || errors.Is(err, ErrTooLarge) {
			err = &LimitError{Index: -1, Err: err}
		} else if followed(err, k.addr) {
			return p
		}
		finish(nil, err)
	}
	return p
}

// publishAnswer is the receipt a PUBLISH got, or why it has none.
func publishAnswer(ans Payload, err error, count int) (*Receipt, error) {
	if err != nil {
		return nil, err
	}
	pub, ok := ans.(*Published)
	if !ok {
		return nil, &ProtocolError{Kind: KindInvalidValue, Field: "answer", Msg: fmt.Sprintf("PUBLISH answered with %#x", uint16(ans.Opcode()))}
	}
	ids := pub.Positions()
	if len(ids) != count {
		return nil, &ProtocolError{Kind: KindInvalidValue, Field: "published.ranges", Msg: fmt.Sprintf("%d ids for %d messages", len(ids), count)}
	}
	return &Receipt{Durability: pub.Durability, IDs: ids}, nil
}

// allDeduplicated reports whether every message carries a deduplication id, which makes
// sending the batch again safe.
func allDeduplicated(msgs []Message) bool {
	for i := range msgs {
		found := false
		for _, h := range msgs[i].Headers {
			if h.Name == DedupHeader && h.Value != "" {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return len(msgs) > 0
}

// PublishBatch publishes a batch and waits for its receipt.
func (c *Client) PublishBatch(ctx context.Context, topic string, msgs []Message, opts ...PublishOption) (*Receipt, error) {
	return c.PublishBatchAsync(ctx, topic, msgs, opts...).Wait(ctx)
}

// Publish publishes one message and returns its id.
func (c *Client) Publish(ctx context.Context, topic string, msg Message, opts ...PublishOption) (Position, error) {
	r, err := c.PublishBatch(ctx, topic, []Message{msg}, opts...)
	if err != nil {
		return Position{}, err
	}
	return r.IDs[0], nil
}
