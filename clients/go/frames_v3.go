package ferrymq

import "math"

// The frames of protocol version 3: the operator's (LIST_CONNECTIONS, CLOSE_CONNECTION,
// PURGE_TOPIC, PAUSE_SUBSCRIPTION and their answers) and the cluster's (CLUSTER_INFO). A
// connection that agreed on version 2 never sends them (see VersionError).

// ---- operator frames

// PurgeTopic drops every message a topic retains; answered Purged.
type PurgeTopic struct {
	Name string `json:"name"`
}

func (*PurgeTopic) Opcode() Opcode { return OpPurgeTopic }
func (f *PurgeTopic) encode(w *writer) error {
	if err := checkName("purge_topic.name", f.Name); err != nil {
		return err
	}
	w.str16(f.Name)
	return nil
}

// Purged answers PurgeTopic: the messages the topic retained before.
type Purged struct {
	Messages uint64 `json:"messages"`
}

func (*Purged) Opcode() Opcode           { return OpPurged }
func (f *Purged) encode(w *writer) error { w.u64(f.Messages); return nil }

// PauseSubscription pauses (or resumes) a subscription's deliveries; answered OK.
type PauseSubscription struct {
	Topic        string `json:"topic"`
	Subscription string `json:"subscription"`
	Paused       bool   `json:"paused"`
}

func (*PauseSubscription) Opcode() Opcode { return OpPauseSubscription }
func (f *PauseSubscription) encode(w *writer) error {
	if err := firstErr(checkName("pause_subscription.topic", f.Topic), checkName("pause_subscription.subscription", f.Subscription)); err != nil {
		return err
	}
	w.str16(f.Topic)
	w.str16(f.Subscription)
	w.boolean(f.Paused)
	return nil
}
func decodePauseSubscription(r *reader) *PauseSubscription {
	f := &PauseSubscription{Topic: r.str16("pause_subscription.topic", 1, NameBytesMax), Subscription: r.str16("pause_subscription.subscription", 1, NameBytesMax)}
	flags := r.u8("pause_subscription.flags")
	if flags&^1 != 0 {
		r.fail(&ProtocolError{Kind: KindInvalidFlags, Field: "pause_subscription.flags", Msg: "unknown bits set"})
	}
	f.Paused = flags&1 != 0
	return f
}

// ListConnections asks for one page of the broker's open connections; answered ConnectionList.
type ListConnections struct {
	// After lists connections with ids above it; 0 is the first page.
	After uint64 `json:"after"`
	// Limit is 1..=1000.
	Limit uint32 `json:"limit"`
}

func (*ListConnections) Opcode() Opcode { return OpListConnections }
func (f *ListConnections) encode(w *writer) error {
	if f.Limit == 0 || f.Limit > ListLimitMax {
		return invalid("list_connections.limit", "%d: must be 1..=%d", f.Limit, ListLimitMax)
	}
	w.u64(f.After)
	w.u32(f.Limit)
	return nil
}
func decodeListConnections(r *reader) *ListConnections {
	f := &ListConnections{After: r.u64("list_connections.after"), Limit: r.u32("list_connections.limit")}
	if r.err == nil && (f.Limit == 0 || f.Limit > ListLimitMax) {
		r.fail(invalid("list_connections.limit", "%d: must be 1..=%d", f.Limit, ListLimitMax))
	}
	return f
}

// Connection is one open connection as the broker lists it.
type Connection struct {
	// ID is never reused while the broker runs.
	ID uint64 `json:"id"`
	// Listener is 0 for the binary protocol, 1 for an HTTP stream.
	Listener uint8  `json:"listener"`
	TLS      bool   `json:"tls"`
	Peer     string `json:"peer"`
	// User is empty for an anonymous connection.
	User string `json:"user"`
	// ClientName is what the client sent in HELLO.
	ClientName    string `json:"client_name"`
	ConnectedMs   uint64 `json:"connected_ms"`
	Subscriptions uint32 `json:"subscriptions"`
	Consumers     uint32 `json:"consumers"`
	MessagesIn    uint64 `json:"messages_in"`
	BytesIn       uint64 `json:"bytes_in"`
	MessagesOut   uint64 `json:"messages_out"`
	BytesOut      uint64 `json:"bytes_out"`
	Credit        uint64 `json:"credit"`
	Unacked       uint64 `json:"unacked"`
}

// ConnectionList answers ListConnections.
type ConnectionList struct {
	// Total is how many connections are open now.
	Total uint64 `json:"total"`
	// NextAfter is the After of the next page; 0 on the last page.
	NextAfter   uint64       `json:"next_after"`
	Connections []Connection `json:"connections"`
}

// connectionEntryFixed is the bytes of one CONNECTION_LIST entry besides its strings' bytes.
const connectionEntryFixed = 8 + 1 + 1 + 3*2 + 8 + 4 + 4 + 6*8

func (*ConnectionList) Opcode() Opcode { return OpConnectionList }
func (f *ConnectionList) encode(w *writer) error {
	for i := range f.Connections {
		c := &f.Connections[i]
		if err := firstErr(checkStr("connection.peer", c.Peer, 0, 65535), checkStr("connection.user", c.User, 0, 65535), checkStr("connection.client_name", c.ClientName, 0, 65535)); err != nil {
			return err
		}
	}
	w.u64(f.Total)
	w.u64(f.NextAfter)
	w.u32(uint32(len(f.Connections)))
	for i := range f.Connections {
		c := &f.Connections[i]
		w.u64(c.ID)
		w.u8(c.Listener)
		w.boolean(c.TLS)
		w.str16(c.Peer)
		w.str16(c.User)
		w.str16(c.ClientName)
		w.u64(c.ConnectedMs)
		w.u32(c.Subscriptions)
		w.u32(c.Consumers)
		for _, v := range [...]uint64{c.MessagesIn, c.BytesIn, c.MessagesOut, c.BytesOut, c.Credit, c.Unacked} {
			w.u64(v)
		}
	}
	return nil
}
func decodeConnectionList(r *reader) *ConnectionList {
	f := &ConnectionList{Total: r.u64("connection_list.total"), NextAfter: r.u64("connection_list.next_after")}
	n := r.count("connection_list.count", math.MaxUint32, connectionEntryFixed)
	f.Connections = make([]Connection, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		c := Connection{ID: r.u64("connection.id"), Listener: r.u8("connection.listener")}
		flags := r.u8("connection.flags")
		if flags&^1 != 0 {
			r.fail(&ProtocolError{Kind: KindInvalidFlags, Field: "connection.flags", Msg: "unknown bits set"})
		}
		c.TLS = flags&1 != 0
		c.Peer = r.str16("connection.peer", 0, 65535)
		c.User = r.str16("connection.user", 0, 65535)
		c.ClientName = r.str16("connection.client_name", 0, 65535)
		c.ConnectedMs = r.u64("connection.connected_ms")
		c.Subscriptions = r.u32("connection.subscriptions")
		c.Consumers = r.u32("connection.consumers")
		c.MessagesIn = r.u64("connection.messages_in")
		c.BytesIn = r.u64("connection.bytes_in")
		c.MessagesOut = r.u64("connection.messages_out")
		c.BytesOut = r.u64("connection.bytes_out")
		c.Credit = r.u64("connection.credit")
		c.Unacked = r.u64("connection.unacked")
		f.Connections = append(f.Connections, c)
	}
	return f
}

// CloseConnection asks the broker to close one connection (admin role); answered OK.
type CloseConnection struct {
	ID uint64 `json:"id"`
}

func (*CloseConnection) Opcode() Opcode           { return OpCloseConnection }
func (f *CloseConnection) encode(w *writer) error { w.u64(f.ID); return nil }

// ---- cluster frames

// ClusterInfoRequest asks a node for the cluster's nodes and leaders; answered ClusterInfoReply.
type ClusterInfoRequest struct{}

func (*ClusterInfoRequest) Opcode() Opcode         { return OpClusterInfo }
func (*ClusterInfoRequest) encode(w *writer) error { return nil }

// ClusterNode is a node of a cluster and the address its clients reach it at (empty while the
// answering node does not know it).
type ClusterNode struct {
	ID   uint64 `json:"id"`
	Addr string `json:"addr"`
}

// PartitionLeader is a replicated partition: its leader (0 while unknown or during an election)
// and the nodes holding its replicas, the preferred leader first.
type PartitionLeader struct {
	Topic     string   `json:"topic"`
	Partition uint32   `json:"partition"`
	Leader    uint64   `json:"leader"`
	Replicas  []uint64 `json:"replicas"`
}

// ClusterInfo is a node's view of its cluster. NodeID 0 is a broker that runs alone: it leads
// everything and the lists are empty.
type ClusterInfo struct {
	// NodeID is the node that answered.
	NodeID uint64 `json:"node_id"`
	// MetadataLeader is the node where topics are created and deleted; 0 while unknown.
	MetadataLeader uint64            `json:"metadata_leader"`
	Nodes          []ClusterNode     `json:"nodes"`
	Partitions     []PartitionLeader `json:"partitions"`
}

// Addr is the client address of node id, empty when unknown.
func (ci *ClusterInfo) Addr(id uint64) string {
	for _, n := range ci.Nodes {
		if n.ID == id {
			return n.Addr
		}
	}
	return ""
}

// Leader is the node leading a partition of a topic; 0 when unknown (or not replicated).
func (ci *ClusterInfo) Leader(topic string, partition uint32) uint64 {
	for _, p := range ci.Partitions {
		if p.Topic == topic && p.Partition == partition {
			return p.Leader
		}
	}
	return 0
}

// ClusterInfoReply answers ClusterInfoRequest.
type ClusterInfoReply struct {
	ClusterInfo
}

func (*ClusterInfoReply) Opcode() Opcode { return OpClusterInfoReply }
func (f *ClusterInfoReply) encode(w *writer) error {
	for _, n := range f.Nodes {
		if err := checkStr("cluster_info_reply.node.addr", n.Addr, 0, 65535); err != nil {
			return err
		}
	}
	for _, p := range f.Partitions {
		if err := checkStr("cluster_info_reply.partition.topic", p.Topic, 0, 65535); err != nil {
			return err
		}
		if len(p.Replicas) > math.MaxUint8 {
			return invalid("cluster_info_reply.partition.replica_count", "%d replicas, at most 255", len(p.Replicas))
		}
	}
	w.u64(f.NodeID)
	w.u64(f.MetadataLeader)
	w.u32(uint32(len(f.Nodes)))
	for _, n := range f.Nodes {
		w.u64(n.ID)
		w.str16(n.Addr)
	}
	w.u32(uint32(len(f.Partitions)))
	for _, p := range f.Partitions {
		w.str16(p.Topic)
		w.u32(p.Partition)
		w.u64(p.Leader)
		w.u8(uint8(len(p.Replicas)))
		for _, r := range p.Replicas {
			w.u64(r)
		}
	}
	return nil
}
func decodeClusterInfoReply(r *reader) *ClusterInfoReply {
	f := &ClusterInfoReply{ClusterInfo{NodeID: r.u64("cluster_info_reply.node_id"), MetadataLeader: r.u64("cluster_info_reply.metadata_leader")}}
	n := r.count("cluster_info_reply.node_count", math.MaxUint32, 8+2)
	f.Nodes = make([]ClusterNode, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		f.Nodes = append(f.Nodes, ClusterNode{ID: r.u64("cluster_info_reply.node.id"), Addr: r.str16("cluster_info_reply.node.addr", 0, 65535)})
	}
	n = r.count("cluster_info_reply.partition_count", math.MaxUint32, 2+4+8+1)
	f.Partitions = make([]PartitionLeader, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		p := PartitionLeader{Topic: r.str16("cluster_info_reply.partition.topic", 0, 65535), Partition: r.u32("cluster_info_reply.partition.partition"), Leader: r.u64("cluster_info_reply.partition.leader")}
		count := int(r.u8("cluster_info_reply.partition.replica_count"))
		if !r.need(8*count, "cluster_info_reply.partition.replicas") {
			break
		}
		p.Replicas = make([]uint64, count)
		for j := range p.Replicas {
			p.Replicas[j] = r.u64("cluster_info_reply.partition.replica")
		}
		f.Partitions = append(f.Partitions, p)
	}
	return f
}
