package ferrymq

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// routeKey names what a request needs a leader of: a partition of a topic, any partition of a
// topic (the broker picks it by key: partition -1), or the cluster metadata (metadataRoute).
type routeKey struct {
	topic     string
	partition int64
}

var metadataRoute = routeKey{partition: -2}

func publishRoute(topic string, partition *uint32) routeKey {
	if partition != nil {
		return routeKey{topic, int64(*partition)}
	}
	return routeKey{topic, -1}
}

// clusterState is what a Client knows of its cluster: the nodes' addresses, where leaders
// were last found, and its connections to nodes other than the main one.
type clusterState struct {
	mu        sync.Mutex
	clustered bool              // a node said it belongs to a cluster
	nodes     map[uint64]string // node id → client address
	routes    map[routeKey]string
	peers     map[string]*conn
	closed    bool
	dialMu    sync.Mutex // one dial of a peer at a time
}

func (cs *clusterState) init() {
	cs.nodes = map[uint64]string{}
	cs.routes = map[routeKey]string{}
	cs.peers = map[string]*conn{}
}

// closeAll ends the use of peers and returns them, for Close to close.
func (cs *clusterState) closeAll() []*conn {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.closed = true
	out := make([]*conn, 0, len(cs.peers))
	for _, k := range cs.peers {
		out = append(out, k)
	}
	cs.peers = map[string]*conn{}
	return out
}

// following reports whether requests that need a leader look for it: in a cluster, or with
// several seeds.
func (c *Client) following() bool {
	if c.opts.LeaderTimeout < 0 {
		return false
	}
	if len(c.seeds) > 1 {
		return true
	}
	c.cluster.mu.Lock()
	defer c.cluster.mu.Unlock()
	return c.cluster.clustered
}

// candidates are the addresses to try for any node: the seeds, then the other nodes the
// cluster named.
func (c *Client) candidates() []string {
	out := append([]string(nil), c.seeds...)
	seen := map[string]bool{}
	for _, a := range out {
		seen[a] = true
	}
	c.cluster.mu.Lock()
	ids := make([]uint64, 0, len(c.cluster.nodes))
	for id := range c.cluster.nodes {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		if a := c.cluster.nodes[id]; !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	c.cluster.mu.Unlock()
	return out
}

// discover asks a new connection's node for the cluster (version 3 only), so that the client
// knows the other nodes before it needs them. A failure is not the caller's: it is ignored.
func (c *Client) discover(ctx context.Context, k *conn) {
	if k.hello.Version < 3 || c.opts.LeaderTimeout < 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.DialTimeout)
	defer cancel()
	if info, err := clusterInfoOn(ctx, k); err == nil {
		c.learn(info)
	}
}

func clusterInfoOn(ctx context.Context, k *conn) (*ClusterInfo, error) {
	if k.hello.Version < 3 {
		return &ClusterInfo{Nodes: []ClusterNode{}, Partitions: []PartitionLeader{}}, nil
	}
	ans, err := k.roundTrip(ctx, &ClusterInfoRequest{})
	if err != nil {
		return nil, err
	}
	r, err := answerAs[*ClusterInfoReply](&ClusterInfoRequest{}, ans)
	if err != nil {
		return nil, err
	}
	return &r.ClusterInfo, nil
}

// ClusterInfo returns the cluster's nodes, the metadata leader and each replicated partition's
// leader and replicas, as the node asked sees them. A broker that runs alone (or speaks
// protocol version 2) answers NodeID 0 and empty lists. In a cluster, a node that the client
// cannot reach is skipped for the next one it knows.
func (c *Client) ClusterInfo(ctx context.Context) (*ClusterInfo, error) {
	k, err := c.conn(ctx)
	if err != nil && c.following() && !errors.Is(err, ErrClosed) && ctx.Err() == nil {
		k, err = c.anyConn(ctx)
	}
	if err != nil {
		return nil, err
	}
	info, err := clusterInfoOn(ctx, k)
	if err != nil {
		return nil, err
	}
	c.learn(info)
	return info, nil
}

// learn records what a node said of the cluster.
func (c *Client) learn(info *ClusterInfo) {
	if info.NodeID == 0 {
		return
	}
	cs := &c.cluster
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.clustered = true
	for _, n := range info.Nodes {
		if n.Addr != "" {
			cs.nodes[n.ID] = n.Addr
		}
	}
	set := func(k routeKey, leader uint64) {
		if a := cs.nodes[leader]; leader != 0 && a != "" {
			cs.routes[k] = a
		} else {
			delete(cs.routes, k)
		}
	}
	set(metadataRoute, info.MetadataLeader)
	byTopic := map[string]uint64{}
	for _, p := range info.Partitions {
		set(routeKey{p.Topic, int64(p.Partition)}, p.Leader)
		if l, ok := byTopic[p.Topic]; !ok || l == p.Leader {
			byTopic[p.Topic] = p.Leader
		} else {
			byTopic[p.Topic] = 0 // partitions led by different nodes: let not_leader say
		}
	}
	for t, l := range byTopic {
		set(routeKey{t, -1}, l)
	}
}

// learnFrom records where an error says the leader is. It returns true when a not_leader named
// a leader at an address other than the one the request went to: worth trying at once.
func (c *Client) learnFrom(err error, key routeKey, tried string) bool {
	cs := &c.cluster
	cs.mu.Lock()
	defer cs.mu.Unlock()
	var nl *NotLeaderError
	if !errors.As(err, &nl) {
		if cs.routes[key] == tried {
			delete(cs.routes, key)
		}
		return false
	}
	cs.clustered = true
	addr := nl.LeaderAddr
	if addr != "" {
		cs.nodes[nl.Leader] = addr
	} else if nl.Leader != 0 {
		addr = cs.nodes[nl.Leader]
	}
	if addr == "" {
		delete(cs.routes, key)
		return false
	}
	cs.routes[key] = addr
	if nl.Topic != "" && nl.Partition >= 0 {
		cs.routes[routeKey{nl.Topic, nl.Partition}] = addr
	}
	return addr != tried
}

// refresh asks any node reachable for the cluster, to find the leader of key.
func (c *Client) refresh(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.DialTimeout)
	defer cancel()
	k, err := c.anyConn(ctx)
	if err != nil {
		return
	}
	if info, err := clusterInfoOn(ctx, k); err == nil {
		c.learn(info)
	}
}

// current is the main connection when it is usable.
func (c *Client) current() *conn {
	c.mu.Lock()
	k := c.cur
	c.mu.Unlock()
	if k != nil && !k.isClosed() {
		return k
	}
	return nil
}

// nodeConn is a connection to the node at addr: the main one, or a peer, dialled when needed.
func (c *Client) nodeConn(ctx context.Context, addr string) (*conn, error) {
	if c.isClosed() {
		return nil, ErrClosed
	}
	if k := c.current(); k != nil && k.addr == addr {
		return k, nil
	}
	cs := &c.cluster
	peer := func() *conn {
		cs.mu.Lock()
		defer cs.mu.Unlock()
		if k := cs.peers[addr]; k != nil && !k.isClosed() {
			return k
		}
		return nil
	}
	if k := peer(); k != nil {
		return k, nil
	}
	cs.dialMu.Lock()
	defer cs.dialMu.Unlock()
	if k := peer(); k != nil {
		return k, nil
	}
	k, err := dialTimeout(ctx, c, addr)
	if err != nil {
		return nil, &ConnectionLostError{Err: err}
	}
	cs.mu.Lock()
	if cs.closed {
		cs.mu.Unlock()
		k.fail(ErrClosed)
		k.wg.Wait()
		return nil, ErrClosed
	}
	cs.peers[addr] = k
	cs.mu.Unlock()
	return k, nil
}

// anyConn is a connection to any node: the main one, a peer, or the first candidate that
// answers.
func (c *Client) anyConn(ctx context.Context) (*conn, error) {
	if k := c.current(); k != nil {
		return k, nil
	}
	c.cluster.mu.Lock()
	for _, k := range c.cluster.peers {
		if !k.isClosed() {
			c.cluster.mu.Unlock()
			return k, nil
		}
	}
	c.cluster.mu.Unlock()
	var errs []error
	for _, addr := range c.candidates() {
		k, err := c.nodeConn(ctx, addr)
		if err == nil {
			return k, nil
		}
		if errors.Is(err, ErrClosed) || ctx.Err() != nil {
			return nil, err
		}
		errs = append(errs, err)
	}
	return nil, &ConnectionLostError{Err: fmt.Errorf("ferrymq: no node answered: %w", errors.Join(errs...))}
}

// leaderConn is the connection for a request that needs the leader of key: where it was last
// found, else any node (which names the leader if it is not).
func (c *Client) leaderConn(ctx context.Context, key routeKey) (*conn, error) {
	if !c.following() {
		return c.conn(ctx)
	}
	c.cluster.mu.Lock()
	addr := c.cluster.routes[key]
	c.cluster.mu.Unlock()
	if addr == "" {
		return c.anyConn(ctx)
	}
	return c.nodeConn(ctx, addr)
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// followable reports whether a request that failed with err may go to the leader again: it was
// not carried out (not_leader, shutting_down, never sent), or sending it twice is safe. A safe
// request is also sent again after storage_unavailable: a leader answers so when it cannot tell
// whether a replicated write took effect, and while a publish with the same dedup ids is still
// being replicated (the retry then gets the first copy's ids).
func followable(err error, safe bool) bool {
	var nl *NotLeaderError
	var e *Error
	var lost *ConnectionLostError
	switch {
	case errors.Is(err, ErrClosed):
		return false
	case errors.As(err, &nl):
		return true
	case errors.As(err, &e):
		return e.Code == CodeShuttingDown || (safe && e.Code == CodeStorageUnavailable)
	case errors.As(err, &lost):
		return !lost.Sent || safe
	}
	return false
}

// follow sends a request that needs the leader of key again, after err, until it succeeds,
// fails in a way following cannot mend, ctx ends (a *CancelledError), or the leader timeout
// passes (the last error). attempt sends the request once on a connection.
func (c *Client) follow(ctx context.Context, key routeKey, safe bool, tried string, err error, attempt func(k *conn) error) error {
	deadline := time.Now().Add(c.opts.LeaderTimeout)
	delay := 20 * time.Millisecond
	quick := 0
	doubt := false // an attempt may have been carried out
	cancelled := func() error { return &CancelledError{Sent: doubt, Err: ctx.Err()} }
	for err != nil && c.following() && followable(err, safe) && !c.isClosed() {
		doubt = doubt || errors.Is(err, ErrOutcomeUnknown)
		if ctx.Err() != nil {
			return cancelled()
		}
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		if c.learnFrom(err, key, tried) && quick < 3 {
			quick++
		} else {
			quick = 0
			t := time.NewTimer(min(delay, left))
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return cancelled()
			}
			if delay *= 2; delay > 500*time.Millisecond {
				delay = 500 * time.Millisecond
			}
			c.refresh(ctx)
		}
		k, cerr := c.leaderConn(ctx, key)
		if cerr != nil {
			if errors.Is(cerr, ErrClosed) {
				return cerr
			}
			if ctx.Err() != nil {
				return cancelled()
			}
			err, tried = cerr, ""
			continue
		}
		tried = k.addr
		err = attempt(k)
	}
	return err
}

// leaderRequest sends a request that needs the leader of key and waits for its answer,
// following the leader (see Client). safe says whether sending it twice is harmless.
func leaderRequest[T Payload](ctx context.Context, c *Client, key routeKey, safe bool, p Payload) (T, error) {
	var out T
	attempt := func(k *conn) error {
		ans, err := k.roundTrip(ctx, p)
		if err != nil {
			return err
		}
		out, err = answerAs[T](p, ans)
		return err
	}
	k, err := c.leaderConn(ctx, key)
	tried := ""
	if err == nil {
		tried = k.addr
		err = attempt(k)
	}
	if err != nil {
		err = c.follow(ctx, key, safe, tried, err, attempt)
	}
	return out, err
}

// spawn runs f on a goroutine Close waits for; false when the client is closed.
func (c *Client) spawn(f func()) bool {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false
	}
	c.wg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.wg.Done()
		f()
	}()
	return true
}

// withClient is ctx that also ends when the client closes.
func (c *Client) withClient(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}
