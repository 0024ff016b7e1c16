package ferrymq

import (
	"context"
	"errors"
	"sort"
	"time"
)

// A subscription across the nodes of a cluster.
//
// In a cluster only a partition's leader delivers its messages and takes their acks, and
// leaders move when nodes fail. Subscribe then attaches the same subscription on every node
// (each serves the partitions it leads; the others hold the subscription without delivering),
// each on a connection of the subscription's own, merges what they deliver, and sends each ack,
// nack or release to the node that delivered the message. A node whose connection breaks is
// connected to again, with backoff, and the subscription attached there again; the cursor it
// resumes from is the one the partition's group replicated, so nothing acked with confirmation
// comes again.

// Backoff between attempts to attach to a node again: doubling from the first to the last.
const (
	legRetryFirst = 50 * time.Millisecond
	legRetryMax   = time.Second
)

// clusterNode is a node a subscription attaches on.
type clusterNode struct {
	id   uint64
	addr string
}

// subscriptionNodes are the nodes a new subscription attaches on: every node CLUSTER_INFO
// (asked on k) names with an address, in id order; none (a single node) for a broker that runs
// alone, speaks version 2, or when the client does not follow leaders.
func (c *Client) subscriptionNodes(ctx context.Context, k *conn) []clusterNode {
	if k.hello.Version < 3 || c.opts.LeaderTimeout < 0 {
		return nil
	}
	ictx, cancel := context.WithTimeout(ctx, c.opts.DialTimeout)
	defer cancel()
	info, err := clusterInfoOn(ictx, k)
	if err != nil {
		// The node asked is gone or busy: what the client learnt of the cluster decides.
		c.cluster.mu.Lock()
		defer c.cluster.mu.Unlock()
		if !c.cluster.clustered {
			return nil
		}
		return sortedNodes(c.cluster.nodes)
	}
	c.learn(info)
	if info.NodeID == 0 {
		return nil
	}
	nodes := map[uint64]string{}
	for _, n := range info.Nodes {
		if n.Addr != "" {
			nodes[n.ID] = n.Addr
		}
	}
	return sortedNodes(nodes)
}

func sortedNodes(nodes map[uint64]string) []clusterNode {
	out := make([]clusterNode, 0, len(nodes))
	for id, addr := range nodes {
		out = append(out, clusterNode{id, addr})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// subscribeCluster attaches a subscription on every node (see Client.Subscribe). The first
// attachments are made before it returns, so that a refusal is the caller's error; a node
// that cannot be reached now (or does not know the topic yet) is retried by its leg.
func (c *Client) subscribeCluster(ctx context.Context, topic string, opts SubscribeOptions, nodes []clusterNode) (*Subscription, error) {
	s := newSubscription(c, topic, opts, true)
	for _, n := range nodes {
		s.legs = append(s.legs, &leg{node: n.id, addr: n.addr})
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		s.cancel()
		return nil, ErrClosed
	}
	c.subs[s] = struct{}{}
	c.mu.Unlock()
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopA := context.AfterFunc(s.ctx, cancel)
	defer stopA()

	type first struct {
		k   *conn
		err error
	}
	firsts := make([]first, len(s.legs))
	done := make(chan struct{}, len(s.legs))
	for i, l := range s.legs {
		go func() {
			k, err := s.dialLeg(actx, l)
			firsts[i] = first{k, err}
			done <- struct{}{}
		}()
	}
	for range s.legs {
		<-done
	}
	var refusal, lost error
	attached := 0
	for _, f := range firsts {
		switch {
		case f.err == nil:
			attached++
		case retryableAttach(f.err):
			if lost == nil {
				lost = f.err
			}
		case refusal == nil:
			refusal = f.err
		}
	}
	switch {
	case c.isClosed():
		refusal = ErrClosed
	case ctx.Err() != nil:
		refusal = &CancelledError{Sent: true, Err: ctx.Err()}
	case attached == 0 && refusal == nil:
		refusal = lost
	}
	if refusal != nil {
		s.end(nil, refusal)
		for _, f := range firsts {
			if f.k != nil {
				f.k.fail(ErrClosed)
				f.k.wg.Wait()
			}
		}
		return nil, refusal
	}
	for i, l := range s.legs {
		s.spawnLeg(l, firsts[i].k)
	}
	return s, nil
}

// retryableAttach reports whether a failed attachment is worth trying again later: the node
// could not be reached, did not answer in time, or is not ready for the topic yet. The caller
// checks first whether the subscription or its context ended.
func retryableAttach(err error) bool {
	var e *Error
	var ce *CancelledError
	switch {
	case errors.Is(err, ErrClosed):
		return false
	case errors.As(err, &e):
		switch e.Code {
		case CodeUnknownTopic, CodeNotLeader, CodeShuttingDown, CodeStorageUnavailable, CodeTooManyConnections:
			return true
		}
		return false
	case errors.As(err, &ce):
		return true
	}
	return isConnectionError(err)
}

// dialLeg connects to l's node on a connection of the subscription's own and attaches l there.
func (s *Subscription) dialLeg(ctx context.Context, l *leg) (*conn, error) {
	s.mu.Lock()
	addr := l.addr
	s.mu.Unlock()
	k, err := dialTimeout(ctx, s.client, addr)
	if err != nil {
		if ctx.Err() != nil {
			return nil, &CancelledError{Err: ctx.Err()}
		}
		if sameEverywhere(err) {
			return nil, err
		}
		return nil, &ConnectionLostError{Err: err}
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.attachLeg(actx, l, k); err != nil {
		s.mu.Lock()
		if l.conn == k {
			l.conn = nil
		}
		s.mu.Unlock()
		k.fail(ErrClosed)
		k.wg.Wait()
		return nil, err
	}
	return k, nil
}

// spawnLeg starts the goroutine that keeps l attached: k is its connection, nil when it is
// not attached yet.
func (s *Subscription) spawnLeg(l *leg, k *conn) {
	s.wg.Add(1)
	if !s.client.spawn(func() {
		defer s.wg.Done()
		s.runLeg(l, k)
	}) {
		s.wg.Done()
		if k != nil {
			k.fail(ErrClosed)
			k.wg.Wait()
		}
	}
}

// runLeg keeps l attached until the subscription ends, then closes its connection: it waits
// for the connection to break, and attaches again at once, then with backoff, reading
// CLUSTER_INFO before each attempt.
func (s *Subscription) runLeg(l *leg, k *conn) {
	delay := legRetryFirst
	wait := false // the last attempt failed: back off before the next
	for {
		if k != nil {
			select {
			case <-k.done:
				s.mu.Lock()
				if l.conn == k {
					l.conn, l.owed = nil, 0
				}
				s.dropStale()
				s.mu.Unlock()
				k.wg.Wait()
				k = nil
				delay, wait = legRetryFirst, false
			case <-s.ended:
				k.fail(ErrClosed)
				k.wg.Wait()
				return
			}
		}
		if wait {
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-s.ended:
				t.Stop()
				return
			}
			delay = min(delay*2, legRetryMax)
		}
		wait = true
		s.refreshNodes()
		var err error
		k, err = s.dialLeg(s.ctx, l)
		if err == nil {
			continue
		}
		if s.ctx.Err() != nil {
			return
		}
		if !retryableAttach(err) {
			// Refused (the topic deleted, a grant revoked): the consumer hears it.
			s.end(nil, err)
			return
		}
	}
}

// refreshNodes reads CLUSTER_INFO from a node the subscription is attached on (else through
// the client) and adds a leg for each node it does not know yet; a known node's address is
// updated for the next attempt.
func (s *Subscription) refreshNodes() {
	ctx, cancel := context.WithTimeout(s.ctx, s.client.opts.DialTimeout)
	defer cancel()
	s.mu.Lock()
	var ks []*conn
	for _, l := range s.legs {
		if l.conn != nil {
			ks = append(ks, l.conn)
		}
	}
	s.mu.Unlock()
	var info *ClusterInfo
	for _, k := range ks {
		if i, err := clusterInfoOn(ctx, k); err == nil && i.NodeID != 0 {
			info = i
			break
		}
	}
	if info == nil {
		i, err := s.client.ClusterInfo(ctx)
		if err != nil || i.NodeID == 0 {
			return
		}
		info = i
	}
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	var added []*leg
	for _, n := range info.Nodes {
		if n.Addr == "" {
			continue
		}
		found := false
		for _, l := range s.legs {
			if l.node == n.ID {
				l.addr, found = n.Addr, true
				break
			}
		}
		if !found {
			l := &leg{node: n.ID, addr: n.Addr}
			s.legs = append(s.legs, l)
			added = append(added, l)
		}
	}
	s.mu.Unlock()
	for _, l := range added {
		s.spawnLeg(l, nil)
	}
}
