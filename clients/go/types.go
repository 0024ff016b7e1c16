package ferrymq

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Opcode names a frame.
type Opcode uint16

// The opcodes of docs/protocol.md.
const (
	OpHello              Opcode = 0x01
	OpPing               Opcode = 0x02
	OpPong               Opcode = 0x03
	OpCreateTopic        Opcode = 0x10
	OpDeleteTopic        Opcode = 0x11
	OpListTopics         Opcode = 0x12
	OpDescribeTopic      Opcode = 0x13
	OpPurgeTopic         Opcode = 0x14 // version 3
	OpPublish            Opcode = 0x20
	OpSubscribe          Opcode = 0x30
	OpUnsubscribe        Opcode = 0x31
	OpCredit             Opcode = 0x32
	OpAck                Opcode = 0x33
	OpNack               Opcode = 0x34
	OpDeleteSubscription Opcode = 0x35
	OpAckResult          Opcode = 0x36
	OpPauseSubscription  Opcode = 0x37 // version 3
	OpStats              Opcode = 0x40
	OpMessageStatus      Opcode = 0x41
	OpListMessages       Opcode = 0x42
	OpRequeueDead        Opcode = 0x43
	OpListConnections    Opcode = 0x44 // version 3
	OpCloseConnection    Opcode = 0x45 // version 3
	OpUserAdd            Opcode = 0x50
	OpUserRemove         Opcode = 0x51
	OpUserPasswd         Opcode = 0x52
	OpUserList           Opcode = 0x53
	OpGrant              Opcode = 0x54
	OpRevoke             Opcode = 0x55
	OpTokenCreate        Opcode = 0x56
	OpTokenList          Opcode = 0x57
	OpTokenRevoke        Opcode = 0x58
	OpClusterInfo        Opcode = 0x60 // version 3
	OpHelloOK            Opcode = 0x81
	OpOK                 Opcode = 0x82
	OpError              Opcode = 0x83
	OpPublished          Opcode = 0x84
	OpTopicList          Opcode = 0x85
	OpTopicInfo          Opcode = 0x86
	OpSubscribed         Opcode = 0x87
	OpDeliver            Opcode = 0x88
	OpStatsReply         Opcode = 0x89
	OpMessageStatusReply Opcode = 0x8A
	OpMessageList        Opcode = 0x8B
	OpRequeued           Opcode = 0x8C
	OpUserListReply      Opcode = 0x8D
	OpTokenCreated       Opcode = 0x8E
	OpTokenListReply     Opcode = 0x8F
	OpConnectionList     Opcode = 0x90 // version 3
	OpPurged             Opcode = 0x91 // version 3
	OpClusterInfoReply   Opcode = 0xA0 // version 3
)

// enum is a u8 enum with snake_case names in JSON.
type enumNames []string

func (n enumNames) marshal(v uint8) ([]byte, error) {
	if int(v) >= len(n) {
		return nil, fmt.Errorf("ferrymq: enum value %d has no name", v)
	}
	return json.Marshal(n[v])
}

func (n enumNames) unmarshal(b []byte) (uint8, error) {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return 0, err
	}
	for i, name := range n {
		if name == s {
			return uint8(i), nil
		}
	}
	return 0, fmt.Errorf("ferrymq: unknown enum name %q", s)
}

func (n enumNames) name(v uint8) string {
	if int(v) < len(n) {
		return n[v]
	}
	return fmt.Sprintf("unknown(%d)", v)
}

// Storage is where a topic keeps its messages.
type Storage uint8

// Storage kinds. The zero value, StorageDefault, leaves the choice to the broker (disk when it
// has a data dir, or its --default-storage); the wire values differ (see storageWire).
const (
	StorageDefault Storage = 0
	StorageMemory  Storage = 1
	StorageDisk    Storage = 2
)

var storageNames = enumNames{"default", "memory", "disk"}

// storageWire maps a Storage to its value on the wire: 0 memory, 1 disk, 2 default.
var storageWire = [...]uint8{StorageDefault: 2, StorageMemory: 0, StorageDisk: 1}

func (v Storage) String() string               { return storageNames.name(uint8(v)) }
func (v Storage) MarshalJSON() ([]byte, error) { return storageNames.marshal(uint8(v)) }
func (v *Storage) UnmarshalJSON(b []byte) error {
	x, err := storageNames.unmarshal(b)
	*v = Storage(x)
	return err
}

// Overflow is what a bounded topic does when full.
type Overflow uint8

// Overflow policies. The zero value, OverflowDefault, leaves the choice to the broker; the wire
// values differ (see overflowWire).
const (
	OverflowDefault    Overflow = 0
	OverflowDropOldest Overflow = 1
	OverflowReject     Overflow = 2
)

var overflowNames = enumNames{"default", "drop_oldest", "reject"}

// overflowWire maps an Overflow to its value on the wire: 0 drop_oldest, 1 reject, 2 default.
var overflowWire = [...]uint8{OverflowDefault: 2, OverflowDropOldest: 0, OverflowReject: 1}

func (v Overflow) String() string               { return overflowNames.name(uint8(v)) }
func (v Overflow) MarshalJSON() ([]byte, error) { return overflowNames.marshal(uint8(v)) }
func (v *Overflow) UnmarshalJSON(b []byte) error {
	x, err := overflowNames.unmarshal(b)
	*v = Overflow(x)
	return err
}

// Fsync is a disk topic's sync policy.
type Fsync uint8

// Fsync policies; FsyncDefault lets the broker decide.
const (
	FsyncDefault  Fsync = 0
	FsyncAlways   Fsync = 1
	FsyncInterval Fsync = 2
	FsyncNever    Fsync = 3
)

var fsyncNames = enumNames{"default", "always", "interval", "never"}

func (v Fsync) String() string               { return fsyncNames.name(uint8(v)) }
func (v Fsync) MarshalJSON() ([]byte, error) { return fsyncNames.marshal(uint8(v)) }
func (v *Fsync) UnmarshalJSON(b []byte) error {
	x, err := fsyncNames.unmarshal(b)
	*v = Fsync(x)
	return err
}

// RetentionPolicy says when acked messages go.
type RetentionPolicy uint8

// Retention policies; RetentionDefault lets the broker decide.
const (
	RetentionDefault   RetentionPolicy = 0
	RetentionStream    RetentionPolicy = 1
	RetentionWorkQueue RetentionPolicy = 2
)

var retentionNames = enumNames{"default", "stream", "work_queue"}

func (v RetentionPolicy) String() string               { return retentionNames.name(uint8(v)) }
func (v RetentionPolicy) MarshalJSON() ([]byte, error) { return retentionNames.marshal(uint8(v)) }
func (v *RetentionPolicy) UnmarshalJSON(b []byte) error {
	x, err := retentionNames.unmarshal(b)
	*v = RetentionPolicy(x)
	return err
}

// Durability is what a PUBLISHED confirms.
type Durability uint8

// Durability levels.
const (
	DurabilityMemory         Durability = 0
	DurabilityWritten        Durability = 1
	DurabilitySyncedInterval Durability = 2
	DurabilitySynced         Durability = 3
)

var durabilityNames = enumNames{"memory", "written", "synced_interval", "synced"}

func (v Durability) String() string               { return durabilityNames.name(uint8(v)) }
func (v Durability) MarshalJSON() ([]byte, error) { return durabilityNames.marshal(uint8(v)) }
func (v *Durability) UnmarshalJSON(b []byte) error {
	x, err := durabilityNames.unmarshal(b)
	*v = Durability(x)
	return err
}

// StartKind is where a new subscription starts.
type StartKind uint8

// Start kinds.
const (
	StartLatest   StartKind = 0
	StartEarliest StartKind = 1
	StartOffset   StartKind = 2
	StartTimeMs   StartKind = 3
)

var startNames = enumNames{"latest", "earliest", "offset", "time_ms"}

func (v StartKind) String() string               { return startNames.name(uint8(v)) }
func (v StartKind) MarshalJSON() ([]byte, error) { return startNames.marshal(uint8(v)) }
func (v *StartKind) UnmarshalJSON(b []byte) error {
	x, err := startNames.unmarshal(b)
	*v = StartKind(x)
	return err
}

// MessageState is where a message stands in one subscription.
type MessageState uint8

// Message states.
const (
	StatePending      MessageState = 0
	StateDelayed      MessageState = 1
	StateInFlight     MessageState = 2
	StateAcked        MessageState = 3
	StateDeadLettered MessageState = 4
	StateSettled      MessageState = 5
	StateBeforeStart  MessageState = 6
)

var stateNames = enumNames{"pending", "delayed", "in_flight", "acked", "dead_lettered", "settled", "before_start"}

func (v MessageState) String() string               { return stateNames.name(uint8(v)) }
func (v MessageState) MarshalJSON() ([]byte, error) { return stateNames.marshal(uint8(v)) }
func (v *MessageState) UnmarshalJSON(b []byte) error {
	x, err := stateNames.unmarshal(b)
	*v = MessageState(x)
	return err
}

// ListKind selects a LIST_MESSAGES listing.
type ListKind uint8

// Listing kinds.
const (
	ListPending      ListKind = 0
	ListInFlight     ListKind = 1
	ListAcked        ListKind = 2
	ListDeadLettered ListKind = 3
)

var listNames = enumNames{"pending", "in_flight", "acked", "dead_lettered"}

func (v ListKind) String() string               { return listNames.name(uint8(v)) }
func (v ListKind) MarshalJSON() ([]byte, error) { return listNames.marshal(uint8(v)) }
func (v *ListKind) UnmarshalJSON(b []byte) error {
	x, err := listNames.unmarshal(b)
	*v = ListKind(x)
	return err
}

// Roles of a user (bits).
const (
	RoleAdmin   uint8 = 1
	RoleMonitor uint8 = 2
)

// Actions of a grant (bits).
const (
	ActionPublish uint8 = 1
	ActionConsume uint8 = 2
	ActionInspect uint8 = 4
	ActionManage  uint8 = 8
	// ActionPurge and ActionPause (protocol version 3): purging a topic, pausing and resuming
	// its subscriptions, granted on their own (ActionManage implies both).
	ActionPurge uint8 = 16
	ActionPause uint8 = 32
)

// Header is one message header; headers keep their order and names may repeat.
type Header struct {
	Name  string
	Value string
}

// MarshalJSON writes the header as a [name, value] pair.
func (h Header) MarshalJSON() ([]byte, error) { return json.Marshal([2]string{h.Name, h.Value}) }

// UnmarshalJSON reads a [name, value] pair.
func (h *Header) UnmarshalJSON(b []byte) error {
	var p [2]string
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	h.Name, h.Value = p[0], p[1]
	return nil
}

// Range is a run of consecutive offsets in one partition.
type Range struct {
	Partition uint32 `json:"partition"`
	Offset    uint64 `json:"offset"`
	Count     uint32 `json:"count"`
}

// PartitionRange is an inclusive range of partitions a consumer takes.
type PartitionRange struct {
	First uint32 `json:"first"`
	Last  uint32 `json:"last"`
}

// TopicConfig is a topic's settings; zero values mean "the broker decides".
type TopicConfig struct {
	Partitions      uint32          `json:"partitions"`
	Storage         Storage         `json:"storage"`
	Overflow        Overflow        `json:"overflow"`
	MaxMessages     uint64          `json:"max_messages"`
	MaxBytes        uint64          `json:"max_bytes"`
	Fsync           Fsync           `json:"fsync"`
	FsyncIntervalMs uint32          `json:"fsync_interval_ms"`
	RetentionMs     uint64          `json:"retention_ms"`
	RetentionPolicy RetentionPolicy `json:"retention_policy"`
	DedupWindowMs   uint64          `json:"dedup_window_ms"`
	// Replicas: on how many nodes of a cluster the partitions are kept, 1, 3 or 5 (protocol
	// version 3; a version 2 broker decides alone).
	Replicas uint8 `json:"replicas"`
}

// NoLimit in a u64 limit field means "no limit".
const NoLimit = ^uint64(0)

// AnyPartition lets the broker choose the partition of each published message.
const AnyPartition = ^uint32(0)

// Message is one message record, the same in PUBLISH and DELIVER.
type Message struct {
	// Key picks the partition; nil is no key, an empty non-nil slice is the empty key.
	Key     []byte   `json:"key"`
	Headers []Header `json:"headers"`
	// Priority 0..=9, higher first.
	Priority uint8 `json:"priority"`
	// DeliverAfterMs delays the first delivery; nil is no delay. See DelayMs.
	DeliverAfterMs *uint64 `json:"deliver_after_ms"`
	Body           []byte  `json:"body"`
}

// DelayMs returns a DeliverAfterMs value.
func DelayMs(ms uint64) *uint64 { return &ms }

// Header returns the first value of the named header.
func (m *Message) Header(name string) (string, bool) {
	for _, h := range m.Headers {
		if h.Name == name {
			return h.Value, true
		}
	}
	return "", false
}

// TopicInfo describes a topic, defaults filled in.
type TopicInfo struct {
	Name          string      `json:"name"`
	Config        TopicConfig `json:"config"`
	Messages      uint64      `json:"messages"`
	Bytes         uint64      `json:"bytes"`
	Subscriptions []string    `json:"subscriptions"`
}

// Bucket is one latency histogram bucket.
type Bucket struct {
	Index uint16
	Count uint64
}

// MarshalJSON writes [index, count].
func (b Bucket) MarshalJSON() ([]byte, error) {
	return json.Marshal([2]uint64{uint64(b.Index), b.Count})
}

// UnmarshalJSON reads [index, count].
func (b *Bucket) UnmarshalJSON(d []byte) error {
	var p [2]json.Number
	if err := json.Unmarshal(d, &p); err != nil {
		return err
	}
	var i, c uint64
	if _, err := fmt.Sscan(p[0].String(), &i); err != nil {
		return err
	}
	if _, err := fmt.Sscan(p[1].String(), &c); err != nil {
		return err
	}
	b.Index, b.Count = uint16(i), c
	return nil
}

// Latency is a histogram of microsecond values.
type Latency struct {
	SumUs   uint64   `json:"sum_us"`
	Buckets []Bucket `json:"buckets"`
}

// SubscriptionStats are the counters of one subscription.
type SubscriptionStats struct {
	Name           string  `json:"name"`
	Ephemeral      bool    `json:"ephemeral"`
	Consumers      uint32  `json:"consumers"`
	MessagesOut    uint64  `json:"messages_out"`
	BytesOut       uint64  `json:"bytes_out"`
	Acked          uint64  `json:"acked"`
	Redelivered    uint64  `json:"redelivered"`
	Backlog        uint64  `json:"backlog"`
	InFlight       uint64  `json:"in_flight"`
	GaveUp         uint64  `json:"gave_up"`
	DeliverLatency Latency `json:"deliver_latency"`
	AckLatency     Latency `json:"ack_latency"`
	// Paused: an operator paused its deliveries (brokers of protocol version 3 and later).
	Paused bool `json:"paused"`
}

// TopicStats are the counters of one topic.
type TopicStats struct {
	Name          string              `json:"name"`
	MessagesIn    uint64              `json:"messages_in"`
	BytesIn       uint64              `json:"bytes_in"`
	MessagesOut   uint64              `json:"messages_out"`
	BytesOut      uint64              `json:"bytes_out"`
	Depth         uint64              `json:"depth"`
	DepthBytes    uint64              `json:"depth_bytes"`
	Dropped       uint64              `json:"dropped"`
	Publishers    uint32              `json:"publishers"`
	Subscribers   uint32              `json:"subscribers"`
	Subscriptions []SubscriptionStats `json:"subscriptions"`
}

// Position is a partition and offset.
type Position struct {
	Partition uint32 `json:"partition"`
	Offset    uint64 `json:"offset"`
}

// MessageID is the `<partition>-<offset>` form.
func (p Position) String() string { return fmt.Sprintf("%d-%d", p.Partition, p.Offset) }

// ParseMessageID reads `<partition>-<offset>`.
func ParseMessageID(s string) (Position, error) {
	a, b, ok := strings.Cut(s, "-")
	p, err1 := strconv.ParseUint(a, 10, 32)
	o, err2 := strconv.ParseUint(b, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return Position{}, fmt.Errorf("ferrymq: %q is not a message id <partition>-<offset>", s)
	}
	return Position{uint32(p), o}, nil
}

// MessageEntry is one message as one subscription sees it.
type MessageEntry struct {
	Partition        uint32       `json:"partition"`
	Offset           uint64       `json:"offset"`
	State            MessageState `json:"state"`
	Attempts         uint16       `json:"attempts"`
	PublishedMs      uint64       `json:"published_ms"`
	FirstDeliveredMs uint64       `json:"first_delivered_ms"`
	SettledMs        uint64       `json:"settled_ms"`
	DueMs            uint64       `json:"due_ms"`
	Result           []byte       `json:"result"`
	Reason           string       `json:"reason"`
	DeadLetter       *Position    `json:"dead_letter"`
}

// SubscriptionEntry pairs a subscription with the message's entry in it.
type SubscriptionEntry struct {
	Subscription string       `json:"subscription"`
	Entry        MessageEntry `json:"entry"`
}

// MessageStatus is where one message stands in every subscription of its topic.
type MessageStatus struct {
	Partition   uint32 `json:"partition"`
	Offset      uint64 `json:"offset"`
	PublishedMs uint64 `json:"published_ms"`
	Priority    uint8  `json:"priority"`
	// Key is nil when the message has no key.
	Key           []byte              `json:"key"`
	BodyBytes     uint32              `json:"body_bytes"`
	Subscriptions []SubscriptionEntry `json:"subscriptions"`
}

// GrantInfo is one grant of a user.
type GrantInfo struct {
	Pattern string `json:"pattern"`
	Actions uint8  `json:"actions"`
}

// UserInfo is one user as USER_LIST_REPLY lists it.
type UserInfo struct {
	Name   string      `json:"name"`
	Roles  uint8       `json:"roles"`
	Tokens uint32      `json:"tokens"`
	Grants []GrantInfo `json:"grants"`
}

// TokenInfo is one API token (never the token itself).
type TokenInfo struct {
	Name      string `json:"name"`
	CreatedMs uint64 `json:"created_ms"`
	ExpiresMs uint64 `json:"expires_ms"`
}
