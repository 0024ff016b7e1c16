package ferrymq

import (
	"encoding/json"
	"fmt"
	"math"
)

// Limits of docs/protocol.md.
const (
	HeaderBytes       = 12
	NameBytesMax      = 255
	KeyBytesMax       = 1024
	HeadersMax        = 64
	HeaderNameMax     = 4096
	HeaderValueMax    = 4096
	PriorityMax       = 9
	DelayMsMax        = 2_592_000_000
	BatchCountMax     = 65_536
	RangesMax         = 65_536
	ReasonBytesMax    = 1024
	ResultBytesMax    = 4096
	PageBytesMax      = 64
	ListLimitMax      = 1000
	PartitionsMax     = 1024
	DeliveriesMax     = 65_536
	BucketsMax        = 272
	BucketIndexMax    = 271
	DedupIDBytesMax   = 256
	ErrorMessageMax   = 1024
	DefaultFrameBytes = 16 << 20
	// DedupHeader carries a message's deduplication id.
	DedupHeader = "x-ferrymq-dedup-id"
)

// Payload is the decoded payload of one frame.
type Payload interface {
	Opcode() Opcode
	encode(w *writer) error
}

// Frame is one decoded frame.
type Frame struct {
	RequestID uint32
	Payload   Payload
}

// sizeHint guesses a frame's encoded size, to allocate once.
func sizeHint(p Payload) int {
	if f, ok := p.(*Publish); ok {
		n := HeaderBytes + 2 + len(f.Topic) + 8
		for i := range f.Messages {
			n += recordSize(&f.Messages[i])
		}
		return n
	}
	return 256
}

// EncodeFrame appends one whole frame, header included, to dst, in the newest layout.
func EncodeFrame(dst []byte, requestID uint32, p Payload) ([]byte, error) {
	return encodeFrameAs(dst, requestID, p, ProtocolVersion)
}

// encodeFrameAs appends one whole frame in the layout of protocol version.
func encodeFrameAs(dst []byte, requestID uint32, p Payload, version uint16) ([]byte, error) {
	start := len(dst)
	w := writer{b: append(dst, make([]byte, HeaderBytes)...), version: version}
	if err := p.encode(&w); err != nil {
		return dst, err
	}
	n := len(w.b) - start - HeaderBytes
	if uint64(n) > math.MaxUint32-HeaderBytes {
		return dst, &ProtocolError{Kind: KindFrameTooLarge, Msg: "payload above 4 GiB"}
	}
	h := w.b[start:]
	putU32(h[0:], uint32(n))
	putU16(h[4:], uint16(p.Opcode()))
	putU16(h[6:], 0)
	putU32(h[8:], requestID)
	return w.b, nil
}

func putU16(b []byte, v uint16) { b[0], b[1] = byte(v), byte(v>>8) }
func putU32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

// header is a decoded 12-byte frame header.
type header struct {
	payloadLen uint32
	opcode     Opcode
	requestID  uint32
}

// decodeHeader checks a header's flags and size against limit (the whole frame's bytes).
func decodeHeader(b []byte, limit uint32) (header, error) {
	h := header{
		payloadLen: uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24,
		opcode:     Opcode(uint16(b[4]) | uint16(b[5])<<8),
		requestID:  uint32(b[8]) | uint32(b[9])<<8 | uint32(b[10])<<16 | uint32(b[11])<<24,
	}
	if flags := uint16(b[6]) | uint16(b[7])<<8; flags != 0 {
		return h, &ProtocolError{Kind: KindInvalidFlags, Msg: fmt.Sprintf("header flags %#x", flags)}
	}
	if uint64(h.payloadLen)+HeaderBytes > uint64(limit) {
		return h, &ProtocolError{Kind: KindFrameTooLarge, Msg: fmt.Sprintf("%d bytes above the limit of %d", uint64(h.payloadLen)+HeaderBytes, limit)}
	}
	if _, ok := decoders[h.opcode]; !ok {
		return h, &ProtocolError{Kind: KindUnknownOpcode, Msg: fmt.Sprintf("opcode %#x", uint16(h.opcode))}
	}
	return h, nil
}

// DecodeFrame decodes the first frame of b. It returns the bytes used, 0 with no error when b
// does not yet hold the whole frame. limit is the largest frame accepted, header included.
func DecodeFrame(b []byte, limit uint32) (Frame, int, error) {
	if len(b) < HeaderBytes {
		return Frame{}, 0, nil
	}
	h, err := decodeHeader(b, limit)
	if err != nil {
		return Frame{RequestID: h.requestID}, 0, err
	}
	total := HeaderBytes + int(h.payloadLen)
	if len(b) < total {
		return Frame{}, 0, nil
	}
	p, err := DecodePayload(h.opcode, b[HeaderBytes:total])
	if err != nil {
		return Frame{RequestID: h.requestID}, 0, err
	}
	return Frame{RequestID: h.requestID, Payload: p}, total, nil
}

// DecodePayload decodes a payload of the given opcode, refusing missing or extra bytes.
func DecodePayload(op Opcode, payload []byte) (Payload, error) {
	return decodePayload(op, payload, false)
}

// decodePayload decodes in the newest layout; with owned, byte fields share payload instead of
// copying it.
func decodePayload(op Opcode, payload []byte, owned bool) (Payload, error) {
	return decodePayloadAs(op, payload, owned, ProtocolVersion)
}

// decodePayloadAs decodes in the layout of protocol version (a frame whose layout a later
// version extended, STATS_REPLY, is read as that version wrote it).
func decodePayloadAs(op Opcode, payload []byte, owned bool, version uint16) (Payload, error) {
	dec, ok := decoders[op]
	if !ok {
		return nil, &ProtocolError{Kind: KindUnknownOpcode, Msg: fmt.Sprintf("opcode %#x", uint16(op))}
	}
	r := &reader{b: payload, owned: owned, version: version}
	p := dec(r)
	if r.err != nil {
		return nil, r.err
	}
	if r.remaining() != 0 {
		return nil, &ProtocolError{Kind: KindTrailingBytes, Msg: fmt.Sprintf("%d bytes after the payload", r.remaining())}
	}
	return p, nil
}

var decoders = map[Opcode]func(r *reader) Payload{
	OpHello:         func(r *reader) Payload { return decodeHello(r) },
	OpPing:          func(r *reader) Payload { return &Ping{} },
	OpPong:          func(r *reader) Payload { return &Pong{} },
	OpCreateTopic:   func(r *reader) Payload { return decodeCreateTopic(r) },
	OpDeleteTopic:   func(r *reader) Payload { return &DeleteTopic{Name: r.str16("delete_topic.name", 1, NameBytesMax)} },
	OpListTopics:    func(r *reader) Payload { return &ListTopics{} },
	OpDescribeTopic: func(r *reader) Payload { return &DescribeTopic{Name: r.str16("describe_topic.name", 1, NameBytesMax)} },
	OpPublish:       func(r *reader) Payload { return decodePublish(r) },
	OpSubscribe:     func(r *reader) Payload { return decodeSubscribe(r) },
	OpUnsubscribe:   func(r *reader) Payload { return &Unsubscribe{ConsumerID: r.u32("unsubscribe.consumer_id")} },
	OpCredit: func(r *reader) Payload {
		return &Credit{ConsumerID: r.u32("credit.consumer_id"), Credit: r.u32("credit.credit")}
	},
	OpAck:                func(r *reader) Payload { return &Ack{ConsumerID: r.u32("ack.consumer_id"), Ranges: readRanges(r)} },
	OpNack:               func(r *reader) Payload { return decodeNack(r) },
	OpDeleteSubscription: func(r *reader) Payload { return decodeDeleteSubscription(r) },
	OpAckResult:          func(r *reader) Payload { return decodeAckResult(r) },
	OpStats:              func(r *reader) Payload { return &Stats{Topic: r.str16("stats.topic", 0, NameBytesMax)} },
	OpMessageStatus:      func(r *reader) Payload { return decodeMessageStatus(r) },
	OpListMessages:       func(r *reader) Payload { return decodeListMessages(r) },
	OpRequeueDead:        func(r *reader) Payload { return decodeRequeueDead(r) },
	OpUserAdd:            func(r *reader) Payload { return decodeUserAdd(r) },
	OpUserRemove:         func(r *reader) Payload { return &UserRemove{User: r.str16("user_remove.user", 0, NameBytesMax)} },
	OpUserPasswd:         func(r *reader) Payload { return decodeUserPasswd(r) },
	OpUserList:           func(r *reader) Payload { return &UserList{} },
	OpGrant:              func(r *reader) Payload { g := decodeGrant(r); return (*Grant)(&g) },
	OpRevoke:             func(r *reader) Payload { g := decodeGrant(r); return (*Revoke)(&g) },
	OpTokenCreate:        func(r *reader) Payload { return decodeTokenCreate(r) },
	OpTokenList:          func(r *reader) Payload { return &TokenList{User: r.str16("token_list.user", 0, NameBytesMax)} },
	OpTokenRevoke:        func(r *reader) Payload { return decodeTokenRevoke(r) },
	OpHelloOK:            func(r *reader) Payload { return decodeHelloOK(r) },
	OpOK:                 func(r *reader) Payload { return &OK{} },
	OpError: func(r *reader) Payload {
		return &ErrorFrame{Code: r.u16("error.code"), Message: r.str16("error.message", 0, 65535)}
	},
	OpPublished:          func(r *reader) Payload { return decodePublished(r) },
	OpTopicList:          func(r *reader) Payload { return decodeTopicList(r) },
	OpTopicInfo:          func(r *reader) Payload { t := readTopicInfo(r); return (*TopicInfoFrame)(&t) },
	OpSubscribed:         func(r *reader) Payload { return decodeSubscribed(r) },
	OpDeliver:            func(r *reader) Payload { return decodeDeliver(r) },
	OpStatsReply:         func(r *reader) Payload { return decodeStatsReply(r) },
	OpMessageStatusReply: func(r *reader) Payload { return decodeMessageStatusReply(r) },
	OpMessageList:        func(r *reader) Payload { return decodeMessageList(r) },
	OpRequeued: func(r *reader) Payload {
		return &Requeued{Requeued: r.u64("requeued.requeued"), Skipped: r.u64("requeued.skipped")}
	},
	OpUserListReply:  func(r *reader) Payload { return decodeUserListReply(r) },
	OpTokenCreated:   func(r *reader) Payload { return decodeTokenCreated(r) },
	OpTokenListReply: func(r *reader) Payload { return decodeTokenListReply(r) },
	// version 3
	OpPurgeTopic:        func(r *reader) Payload { return &PurgeTopic{Name: r.str16("purge_topic.name", 1, NameBytesMax)} },
	OpPurged:            func(r *reader) Payload { return &Purged{Messages: r.u64("purged.messages")} },
	OpPauseSubscription: func(r *reader) Payload { return decodePauseSubscription(r) },
	OpListConnections:   func(r *reader) Payload { return decodeListConnections(r) },
	OpConnectionList:    func(r *reader) Payload { return decodeConnectionList(r) },
	OpCloseConnection:   func(r *reader) Payload { return &CloseConnection{ID: r.u64("close_connection.id")} },
	OpClusterInfo:       func(r *reader) Payload { return &ClusterInfoRequest{} },
	OpClusterInfoReply:  func(r *reader) Payload { return decodeClusterInfoReply(r) },
}

// ---- empty frames

// Ping asks for a Pong.
type Ping struct{}

// Pong answers a Ping.
type Pong struct{}

// ListTopics asks for every topic.
type ListTopics struct{}

// OK is the empty success answer.
type OK struct{}

// UserList asks for every user.
type UserList struct{}

func (*Ping) Opcode() Opcode               { return OpPing }
func (*Pong) Opcode() Opcode               { return OpPong }
func (*ListTopics) Opcode() Opcode         { return OpListTopics }
func (*OK) Opcode() Opcode                 { return OpOK }
func (*UserList) Opcode() Opcode           { return OpUserList }
func (*Ping) encode(w *writer) error       { return nil }
func (*Pong) encode(w *writer) error       { return nil }
func (*ListTopics) encode(w *writer) error { return nil }
func (*OK) encode(w *writer) error         { return nil }
func (*UserList) encode(w *writer) error   { return nil }

// ---- HELLO / HELLO_OK / ERROR

// Hello opens a session.
type Hello struct {
	VersionMin  uint16 `json:"version_min"`
	VersionMax  uint16 `json:"version_max"`
	HeartbeatMs uint32 `json:"heartbeat_ms"`
	ClientName  string `json:"client_name"`
	User        string `json:"user"`
	Password    string `json:"password"`
}

func (*Hello) Opcode() Opcode { return OpHello }
func (f *Hello) encode(w *writer) error {
	if err := firstErr(checkStr("hello.client_name", f.ClientName, 0, 65535), checkStr("hello.user", f.User, 0, 65535), checkStr("hello.password", f.Password, 0, 65535)); err != nil {
		return err
	}
	w.u16(f.VersionMin)
	w.u16(f.VersionMax)
	w.u32(f.HeartbeatMs)
	w.str16(f.ClientName)
	w.str16(f.User)
	w.str16(f.Password)
	return nil
}
func decodeHello(r *reader) *Hello {
	return &Hello{VersionMin: r.u16("hello.version_min"), VersionMax: r.u16("hello.version_max"), HeartbeatMs: r.u32("hello.heartbeat_ms"),
		ClientName: r.str16("hello.client_name", 0, 65535), User: r.str16("hello.user", 0, 65535), Password: r.str16("hello.password", 0, 65535)}
}

// HelloOK accepts a session.
type HelloOK struct {
	Version         uint16 `json:"version"`
	HeartbeatMs     uint32 `json:"heartbeat_ms"`
	FrameBytesMax   uint32 `json:"frame_bytes_max"`
	MessageBytesMax uint32 `json:"message_bytes_max"`
	Server          string `json:"server"`
}

func (*HelloOK) Opcode() Opcode { return OpHelloOK }
func (f *HelloOK) encode(w *writer) error {
	if err := checkStr("hello_ok.server", f.Server, 0, 65535); err != nil {
		return err
	}
	w.u16(f.Version)
	w.u32(f.HeartbeatMs)
	w.u32(f.FrameBytesMax)
	w.u32(f.MessageBytesMax)
	w.str16(f.Server)
	return nil
}
func decodeHelloOK(r *reader) *HelloOK {
	return &HelloOK{Version: r.u16("hello_ok.version"), HeartbeatMs: r.u32("hello_ok.heartbeat_ms"), FrameBytesMax: r.u32("hello_ok.frame_bytes_max"),
		MessageBytesMax: r.u32("hello_ok.message_bytes_max"), Server: r.str16("hello_ok.server", 0, 65535)}
}

// ErrorFrame is the broker's ERROR.
type ErrorFrame struct {
	Code    uint16 `json:"code"`
	Message string `json:"message"`
}

func (*ErrorFrame) Opcode() Opcode { return OpError }
func (f *ErrorFrame) encode(w *writer) error {
	if err := checkStr("error.message", f.Message, 0, 65535); err != nil {
		return err
	}
	w.u16(f.Code)
	w.str16(f.Message)
	return nil
}

// ---- topics

func checkName(field, s string) error { return checkStr(field, s, 1, NameBytesMax) }

func writeConfig(w *writer, c *TopicConfig) error {
	if c.Storage > StorageDisk {
		return invalid("topic.storage", "%d", c.Storage)
	}
	if c.Overflow > OverflowReject {
		return invalid("topic.overflow", "%d", c.Overflow)
	}
	if c.Fsync > FsyncNever {
		return invalid("topic.fsync", "%d", c.Fsync)
	}
	if (c.Fsync == FsyncInterval) != (c.FsyncIntervalMs != 0) {
		return invalid("topic.fsync_interval_ms", "%d with fsync %s", c.FsyncIntervalMs, c.Fsync)
	}
	if c.RetentionPolicy > RetentionWorkQueue {
		return invalid("topic.retention_policy", "%d", c.RetentionPolicy)
	}
	w.u32(c.Partitions)
	w.u8(storageWire[c.Storage])
	w.u8(overflowWire[c.Overflow])
	w.u64(c.MaxMessages)
	w.u64(c.MaxBytes)
	w.u8(uint8(c.Fsync))
	w.u32(c.FsyncIntervalMs)
	w.u64(c.RetentionMs)
	w.u8(uint8(c.RetentionPolicy))
	w.u64(c.DedupWindowMs)
	if w.atLeast(3) {
		w.u8(c.Replicas)
	}
	return nil
}

func readConfig(r *reader) TopicConfig {
	var c TopicConfig
	c.Partitions = r.u32("topic.partitions")
	switch s := r.u8("topic.storage"); s {
	case 0:
		c.Storage = StorageMemory
	case 1:
		c.Storage = StorageDisk
	case 2:
		c.Storage = StorageDefault
	default:
		r.fail(invalid("topic.storage", "unknown storage %d", s))
	}
	switch o := r.u8("topic.overflow"); o {
	case 0:
		c.Overflow = OverflowDropOldest
	case 1:
		c.Overflow = OverflowReject
	case 2:
		c.Overflow = OverflowDefault
	default:
		r.fail(invalid("topic.overflow", "unknown policy %d", o))
	}
	c.MaxMessages = r.u64("topic.max_messages")
	c.MaxBytes = r.u64("topic.max_bytes")
	c.Fsync = Fsync(r.u8("topic.fsync"))
	if c.Fsync > FsyncNever {
		r.fail(invalid("topic.fsync", "%d", c.Fsync))
	}
	c.FsyncIntervalMs = r.u32("topic.fsync_interval_ms")
	if r.err == nil && (c.Fsync == FsyncInterval) != (c.FsyncIntervalMs != 0) {
		r.fail(invalid("topic.fsync_interval_ms", "%d with fsync %s", c.FsyncIntervalMs, c.Fsync))
	}
	c.RetentionMs = r.u64("topic.retention_ms")
	c.RetentionPolicy = RetentionPolicy(r.u8("topic.retention_policy"))
	if c.RetentionPolicy > RetentionWorkQueue {
		r.fail(invalid("topic.retention_policy", "%d", c.RetentionPolicy))
	}
	c.DedupWindowMs = r.u64("topic.dedup_window_ms")
	if r.atLeast(3) {
		c.Replicas = r.u8("topic.replicas")
	}
	return c
}

// CreateTopic creates a topic.
type CreateTopic struct {
	Name        string      `json:"name"`
	Config      TopicConfig `json:"config"`
	IfNotExists bool        `json:"if_not_exists"`
}

func (*CreateTopic) Opcode() Opcode { return OpCreateTopic }
func (f *CreateTopic) encode(w *writer) error {
	if err := checkName("create_topic.name", f.Name); err != nil {
		return err
	}
	w.str16(f.Name)
	if err := writeConfig(w, &f.Config); err != nil {
		return err
	}
	w.boolean(f.IfNotExists)
	return nil
}
func decodeCreateTopic(r *reader) *CreateTopic {
	f := &CreateTopic{Name: r.str16("create_topic.name", 1, NameBytesMax)}
	f.Config = readConfig(r)
	flags := r.u8("create_topic.flags")
	if flags&^1 != 0 {
		r.fail(invalid("create_topic.flags", "%#x", flags))
	}
	f.IfNotExists = flags&1 != 0
	return f
}

// DeleteTopic deletes a topic.
type DeleteTopic struct {
	Name string `json:"name"`
}

// DescribeTopic asks for a TOPIC_INFO.
type DescribeTopic struct {
	Name string `json:"name"`
}

func (*DeleteTopic) Opcode() Opcode   { return OpDeleteTopic }
func (*DescribeTopic) Opcode() Opcode { return OpDescribeTopic }
func (f *DeleteTopic) encode(w *writer) error {
	if err := checkName("delete_topic.name", f.Name); err != nil {
		return err
	}
	w.str16(f.Name)
	return nil
}
func (f *DescribeTopic) encode(w *writer) error {
	if err := checkName("describe_topic.name", f.Name); err != nil {
		return err
	}
	w.str16(f.Name)
	return nil
}

func writeTopicInfo(w *writer, t *TopicInfo) error {
	if err := checkName("topic_info.name", t.Name); err != nil {
		return err
	}
	w.str16(t.Name)
	if err := writeConfig(w, &t.Config); err != nil {
		return err
	}
	w.u64(t.Messages)
	w.u64(t.Bytes)
	w.u32(uint32(len(t.Subscriptions)))
	for _, s := range t.Subscriptions {
		if err := checkStr("topic_info.subscriptions", s, 0, NameBytesMax); err != nil {
			return err
		}
		w.str16(s)
	}
	return nil
}

func readTopicInfo(r *reader) TopicInfo {
	t := TopicInfo{Name: r.str16("topic_info.name", 1, NameBytesMax)}
	t.Config = readConfig(r)
	t.Messages = r.u64("topic_info.messages")
	t.Bytes = r.u64("topic_info.bytes")
	n := r.count("topic_info.subscription_count", math.MaxUint32, 2)
	t.Subscriptions = make([]string, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		t.Subscriptions = append(t.Subscriptions, r.str16("topic_info.subscription", 0, NameBytesMax))
	}
	return t
}

// TopicInfoFrame is the TOPIC_INFO frame.
type TopicInfoFrame TopicInfo

func (*TopicInfoFrame) Opcode() Opcode           { return OpTopicInfo }
func (f *TopicInfoFrame) encode(w *writer) error { return writeTopicInfo(w, (*TopicInfo)(f)) }

// MarshalJSON writes the topic info's fields.
func (f *TopicInfoFrame) MarshalJSON() ([]byte, error) { return json.Marshal((*TopicInfo)(f)) }

// UnmarshalJSON reads the topic info's fields.
func (f *TopicInfoFrame) UnmarshalJSON(b []byte) error { return json.Unmarshal(b, (*TopicInfo)(f)) }

// TopicList lists topics.
type TopicList struct {
	Topics []TopicInfo `json:"topics"`
}

func (*TopicList) Opcode() Opcode { return OpTopicList }
func (f *TopicList) encode(w *writer) error {
	w.u32(uint32(len(f.Topics)))
	for i := range f.Topics {
		if err := writeTopicInfo(w, &f.Topics[i]); err != nil {
			return err
		}
	}
	return nil
}
func decodeTopicList(r *reader) *TopicList {
	n := r.count("topic_list.topic_count", math.MaxUint32, 2+44+20)
	f := &TopicList{Topics: make([]TopicInfo, 0, n)}
	for i := 0; i < n && r.err == nil; i++ {
		f.Topics = append(f.Topics, readTopicInfo(r))
	}
	return f
}

// ---- records

// checkMessage validates one record against the protocol's limits.
func checkMessage(m *Message) error {
	if m.Priority > PriorityMax {
		return invalid("record.priority", "%d is above %d", m.Priority, PriorityMax)
	}
	if len(m.Key) > KeyBytesMax {
		return invalid("record.key_len", "%d bytes above %d", len(m.Key), KeyBytesMax)
	}
	if len(m.Headers) > HeadersMax {
		return invalid("record.header_count", "%d above %d", len(m.Headers), HeadersMax)
	}
	for _, h := range m.Headers {
		if err := checkStr("record.header.name", h.Name, 1, HeaderNameMax); err != nil {
			return err
		}
		if err := checkStr("record.header.value", h.Value, 0, HeaderValueMax); err != nil {
			return err
		}
	}
	if m.DeliverAfterMs != nil && *m.DeliverAfterMs > DelayMsMax {
		return invalid("record.deliver_after_ms", "%d above %d", *m.DeliverAfterMs, DelayMsMax)
	}
	if uint64(len(m.Body)) > math.MaxUint32 {
		return invalid("record.body_len", "body above 4 GiB")
	}
	return nil
}

func recordSize(m *Message) int {
	n := 10 + len(m.Key) + len(m.Body)
	if m.DeliverAfterMs != nil {
		n += 8
	}
	for _, h := range m.Headers {
		n += 4 + len(h.Name) + len(h.Value)
	}
	return n
}

func writeRecord(w *writer, m *Message) error {
	if err := checkMessage(m); err != nil {
		return err
	}
	var flags uint8
	if m.Key != nil {
		flags |= 1
	}
	if m.DeliverAfterMs != nil {
		flags |= 2
	}
	w.u8(m.Priority)
	w.u8(flags)
	w.u16(uint16(len(m.Key)))
	w.u16(uint16(len(m.Headers)))
	w.u32(uint32(len(m.Body)))
	if m.DeliverAfterMs != nil {
		w.u64(*m.DeliverAfterMs)
	}
	w.raw(m.Key)
	for _, h := range m.Headers {
		w.str16(h.Name)
		w.str16(h.Value)
	}
	w.raw(m.Body)
	return nil
}

func readRecord(r *reader) Message {
	var m Message
	m.Priority = r.u8("record.priority")
	if r.err == nil && m.Priority > PriorityMax {
		r.fail(invalid("record.priority", "%d is above %d", m.Priority, PriorityMax))
	}
	flags := r.u8("record.flags")
	if r.err == nil && flags&^3 != 0 {
		r.fail(invalid("record.flags", "%#x", flags))
	}
	keyLen := int(r.u16("record.key_len"))
	if r.err == nil && flags&1 == 0 && keyLen != 0 {
		r.fail(invalid("record.key_len", "%d without the key flag", keyLen))
	}
	if r.err == nil && keyLen > KeyBytesMax {
		r.fail(invalid("record.key_len", "%d above %d", keyLen, KeyBytesMax))
	}
	hc := int(r.u16("record.header_count"))
	if r.err == nil && hc > HeadersMax {
		r.fail(invalid("record.header_count", "%d above %d", hc, HeadersMax))
	}
	bodyLen := int(r.u32("record.body_len"))
	if flags&2 != 0 {
		d := r.u64("record.deliver_after_ms")
		if r.err == nil && d > DelayMsMax {
			r.fail(invalid("record.deliver_after_ms", "%d above %d", d, DelayMsMax))
		}
		m.DeliverAfterMs = &d
	}
	if flags&1 != 0 {
		m.Key = r.take(keyLen, "record.key")
		if m.Key == nil && r.err == nil {
			m.Key = []byte{}
		}
	}
	m.Headers = make([]Header, 0, hc)
	for i := 0; i < hc && r.err == nil; i++ {
		name := r.str16("record.header.name", 1, HeaderNameMax)
		if r.err != nil {
			if r.err.Kind == KindInvalidValue {
				r.err.Field = "record.header.name_len"
			}
			break
		}
		value := r.str16("record.header.value", 0, HeaderValueMax)
		m.Headers = append(m.Headers, Header{name, value})
	}
	m.Body = r.take(bodyLen, "record.body")
	if m.Body == nil {
		m.Body = []byte{}
	}
	return m
}

// Publish publishes a batch of messages.
type Publish struct {
	Topic string `json:"topic"`
	// Partition nil lets the broker choose.
	Partition *uint32   `json:"partition"`
	Messages  []Message `json:"messages"`
}

func (*Publish) Opcode() Opcode { return OpPublish }
func (f *Publish) encode(w *writer) error {
	if err := checkName("publish.topic", f.Topic); err != nil {
		return err
	}
	if len(f.Messages) > BatchCountMax {
		return invalid("batch.count", "%d above %d", len(f.Messages), BatchCountMax)
	}
	w.str16(f.Topic)
	if f.Partition == nil {
		w.u32(AnyPartition)
	} else {
		w.u32(*f.Partition)
	}
	w.u32(uint32(len(f.Messages)))
	for i := range f.Messages {
		if err := writeRecord(w, &f.Messages[i]); err != nil {
			return err
		}
	}
	return nil
}
func decodePublish(r *reader) *Publish {
	f := &Publish{Topic: r.str16("publish.topic", 1, NameBytesMax)}
	p := r.u32("publish.partition")
	if p != AnyPartition {
		f.Partition = &p
	}
	n := int(r.u32("batch.count"))
	if r.err == nil && n > BatchCountMax {
		r.fail(invalid("batch.count", "%d above %d", n, BatchCountMax))
	}
	if r.err == nil && n*10 > r.remaining() {
		n = r.remaining()/10 + 1 // read until the record that is cut short
	}
	f.Messages = make([]Message, 0, min(n, 1024))
	for i := 0; i < n && r.err == nil; i++ {
		f.Messages = append(f.Messages, readRecord(r))
	}
	return f
}

// Published confirms a PUBLISH.
type Published struct {
	Durability Durability `json:"durability"`
	Ranges     []Range    `json:"ranges"`
}

func (*Published) Opcode() Opcode { return OpPublished }
func (f *Published) encode(w *writer) error {
	if f.Durability > DurabilitySynced {
		return invalid("published.durability", "%d", f.Durability)
	}
	w.u8(uint8(f.Durability))
	return writeRanges(w, f.Ranges)
}
func decodePublished(r *reader) *Published {
	d := Durability(r.u8("published.durability"))
	if r.err == nil && d > DurabilitySynced {
		r.fail(invalid("published.durability", "%d", d))
	}
	return &Published{Durability: d, Ranges: readRanges(r)}
}

// Positions expands the ranges in order: message i of the batch is at Positions()[i].
func (f *Published) Positions() []Position {
	var out []Position
	for _, rg := range f.Ranges {
		for i := uint32(0); i < rg.Count; i++ {
			out = append(out, Position{rg.Partition, rg.Offset + uint64(i)})
		}
	}
	return out
}

func writeRanges(w *writer, rs []Range) error {
	if len(rs) > RangesMax {
		return invalid("ranges.count", "%d above %d", len(rs), RangesMax)
	}
	w.u32(uint32(len(rs)))
	for _, rg := range rs {
		if rg.Count > 0 && rg.Offset > math.MaxUint64-uint64(rg.Count) {
			return invalid("range", "offset %d + count %d overflows", rg.Offset, rg.Count)
		}
		w.u32(rg.Partition)
		w.u64(rg.Offset)
		w.u32(rg.Count)
	}
	return nil
}

func readRanges(r *reader) []Range {
	n := r.count("ranges.count", RangesMax, 0)
	if r.err == nil && n*16 > r.remaining() {
		r.fail(&ProtocolError{Kind: KindTruncated, Field: "ranges", Msg: fmt.Sprintf("%d ranges do not fit in %d bytes", n, r.remaining())})
	}
	if r.err != nil {
		return nil
	}
	out := make([]Range, 0, n)
	for i := 0; i < n; i++ {
		rg := Range{Partition: r.u32("ranges"), Offset: r.u64("ranges"), Count: r.u32("ranges")}
		if r.err != nil {
			return nil
		}
		if rg.Offset > math.MaxUint64-uint64(rg.Count) {
			r.fail(invalid("range", "offset %d + count %d overflows", rg.Offset, rg.Count))
			return nil
		}
		out = append(out, rg)
	}
	return out
}

// ---- subscriptions

// Start is where a new subscription starts.
type Start struct {
	Kind StartKind `json:"kind"`
	// Value is the offset (StartOffset) or Unix time in ms (StartTimeMs).
	Value uint64 `json:"value,omitempty"`
}

// Subscribe attaches a consumer.
type Subscribe struct {
	Topic           string           `json:"topic"`
	Subscription    string           `json:"subscription"`
	Start           Start            `json:"start"`
	AckTimeoutMs    uint32           `json:"ack_timeout_ms"`
	MaxAttempts     uint32           `json:"max_attempts"`
	Credit          uint32           `json:"credit"`
	AutoAck         bool             `json:"auto_ack"`
	Ordered         bool             `json:"ordered"`
	Partitions      []PartitionRange `json:"partitions"`
	DeadLetterTopic string           `json:"dead_letter_topic"`
}

func (*Subscribe) Opcode() Opcode { return OpSubscribe }
func (f *Subscribe) encode(w *writer) error {
	if err := firstErr(checkName("subscribe.topic", f.Topic), checkStr("subscribe.subscription", f.Subscription, 0, NameBytesMax),
		checkStr("subscribe.dead_letter_topic", f.DeadLetterTopic, 0, NameBytesMax)); err != nil {
		return err
	}
	if f.Start.Kind > StartTimeMs {
		return invalid("subscribe.start", "kind %d", f.Start.Kind)
	}
	if f.Start.Kind < StartOffset && f.Start.Value != 0 {
		return invalid("subscribe.start_value", "%d with start %s", f.Start.Value, f.Start.Kind)
	}
	if f.AutoAck && f.Ordered {
		return invalid("subscribe.flags", "ordered needs acks: not with auto_ack")
	}
	if len(f.Partitions) > PartitionsMax {
		return invalid("subscribe.partitions", "%d ranges above %d", len(f.Partitions), PartitionsMax)
	}
	for _, p := range f.Partitions {
		if p.Last < p.First {
			return invalid("subscribe.partitions", "range %d-%d backwards", p.First, p.Last)
		}
	}
	w.str16(f.Topic)
	w.str16(f.Subscription)
	w.u8(uint8(f.Start.Kind))
	w.u64(f.Start.Value)
	w.u32(f.AckTimeoutMs)
	w.u32(f.MaxAttempts)
	w.u32(f.Credit)
	var flags uint8
	if f.AutoAck {
		flags |= 1
	}
	if f.Ordered {
		flags |= 2
	}
	w.u8(flags)
	w.u16(uint16(len(f.Partitions)))
	for _, p := range f.Partitions {
		w.u32(p.First)
		w.u32(p.Last)
	}
	w.str16(f.DeadLetterTopic)
	return nil
}
func decodeSubscribe(r *reader) *Subscribe {
	f := &Subscribe{Topic: r.str16("subscribe.topic", 1, NameBytesMax), Subscription: r.str16("subscribe.subscription", 0, NameBytesMax)}
	f.Start.Kind = StartKind(r.u8("subscribe.start"))
	if r.err == nil && f.Start.Kind > StartTimeMs {
		r.fail(invalid("subscribe.start", "kind %d", f.Start.Kind))
	}
	f.Start.Value = r.u64("subscribe.start_value")
	if r.err == nil && f.Start.Kind < StartOffset && f.Start.Value != 0 {
		r.fail(invalid("subscribe.start_value", "%d with start %s", f.Start.Value, f.Start.Kind))
	}
	f.AckTimeoutMs = r.u32("subscribe.ack_timeout_ms")
	f.MaxAttempts = r.u32("subscribe.max_attempts")
	f.Credit = r.u32("subscribe.credit")
	flags := r.u8("subscribe.flags")
	if r.err == nil && (flags&^3 != 0 || flags == 3) {
		r.fail(invalid("subscribe.flags", "%#x", flags))
	}
	f.AutoAck, f.Ordered = flags&1 != 0, flags&2 != 0
	n := int(r.u16("subscribe.ranges"))
	if r.err == nil && n > PartitionsMax {
		r.fail(invalid("subscribe.partitions", "%d ranges above %d", n, PartitionsMax))
	}
	f.Partitions = []PartitionRange{}
	for i := 0; i < n && r.err == nil; i++ {
		p := PartitionRange{First: r.u32("subscribe.partitions"), Last: r.u32("subscribe.partitions")}
		if r.err == nil && p.Last < p.First {
			r.fail(invalid("subscribe.partitions", "range %d-%d backwards", p.First, p.Last))
		}
		f.Partitions = append(f.Partitions, p)
	}
	f.DeadLetterTopic = r.str16("subscribe.dead_letter_topic", 0, NameBytesMax)
	return f
}

// Subscribed answers SUBSCRIBE.
type Subscribed struct {
	ConsumerID   uint32 `json:"consumer_id"`
	Subscription string `json:"subscription"`
	Partitions   uint32 `json:"partitions"`
}

func (*Subscribed) Opcode() Opcode { return OpSubscribed }
func (f *Subscribed) encode(w *writer) error {
	if err := checkStr("subscribed.subscription", f.Subscription, 0, 65535); err != nil {
		return err
	}
	w.u32(f.ConsumerID)
	w.str16(f.Subscription)
	w.u32(f.Partitions)
	return nil
}
func decodeSubscribed(r *reader) *Subscribed {
	return &Subscribed{ConsumerID: r.u32("subscribed.consumer_id"), Subscription: r.str16("subscribed.subscription", 0, 65535), Partitions: r.u32("subscribed.partitions")}
}

// Unsubscribe detaches a consumer.
type Unsubscribe struct {
	ConsumerID uint32 `json:"consumer_id"`
}

func (*Unsubscribe) Opcode() Opcode           { return OpUnsubscribe }
func (f *Unsubscribe) encode(w *writer) error { w.u32(f.ConsumerID); return nil }

// Credit adds to a consumer's credit.
type Credit struct {
	ConsumerID uint32 `json:"consumer_id"`
	Credit     uint32 `json:"credit"`
}

func (*Credit) Opcode() Opcode           { return OpCredit }
func (f *Credit) encode(w *writer) error { w.u32(f.ConsumerID); w.u32(f.Credit); return nil }

// Ack acks ranges of delivered offsets.
type Ack struct {
	ConsumerID uint32  `json:"consumer_id"`
	Ranges     []Range `json:"ranges"`
}

func (*Ack) Opcode() Opcode { return OpAck }
func (f *Ack) encode(w *writer) error {
	w.u32(f.ConsumerID)
	return writeRanges(w, f.Ranges)
}

// Nack gives messages back.
type Nack struct {
	ConsumerID uint32  `json:"consumer_id"`
	DelayMs    uint32  `json:"delay_ms"`
	DeadLetter bool    `json:"dead_letter"`
	Release    bool    `json:"release"`
	Reason     string  `json:"reason"`
	Ranges     []Range `json:"ranges"`
}

func (*Nack) Opcode() Opcode { return OpNack }
func (f *Nack) encode(w *writer) error {
	if f.DeadLetter && f.Release {
		return invalid("nack.flags", "dead_letter and release together")
	}
	if err := checkStr("nack.reason", f.Reason, 0, ReasonBytesMax); err != nil {
		return err
	}
	w.u32(f.ConsumerID)
	w.u32(f.DelayMs)
	var flags uint8
	if f.DeadLetter {
		flags |= 1
	}
	if f.Release {
		flags |= 2
	}
	w.u8(flags)
	w.str16(f.Reason)
	return writeRanges(w, f.Ranges)
}
func decodeNack(r *reader) *Nack {
	f := &Nack{ConsumerID: r.u32("nack.consumer_id"), DelayMs: r.u32("nack.delay_ms")}
	flags := r.u8("nack.flags")
	if r.err == nil && (flags&^3 != 0 || flags == 3) {
		r.fail(invalid("nack.flags", "%#x", flags))
	}
	f.DeadLetter, f.Release = flags&1 != 0, flags&2 != 0
	f.Reason = r.str16("nack.reason", 0, ReasonBytesMax)
	f.Ranges = readRanges(r)
	return f
}

// DeleteSubscription removes a named subscription.
type DeleteSubscription struct {
	Topic        string `json:"topic"`
	Subscription string `json:"subscription"`
}

func (*DeleteSubscription) Opcode() Opcode { return OpDeleteSubscription }
func (f *DeleteSubscription) encode(w *writer) error {
	if err := firstErr(checkName("delete_subscription.topic", f.Topic), checkName("delete_subscription.subscription", f.Subscription)); err != nil {
		return err
	}
	w.str16(f.Topic)
	w.str16(f.Subscription)
	return nil
}
func decodeDeleteSubscription(r *reader) *DeleteSubscription {
	return &DeleteSubscription{Topic: r.str16("delete_subscription.topic", 1, NameBytesMax), Subscription: r.str16("delete_subscription.subscription", 1, NameBytesMax)}
}

// AckResult acks and attaches a result.
type AckResult struct {
	ConsumerID uint32  `json:"consumer_id"`
	Result     []byte  `json:"result"`
	Ranges     []Range `json:"ranges"`
}

func (*AckResult) Opcode() Opcode { return OpAckResult }
func (f *AckResult) encode(w *writer) error {
	if len(f.Result) > ResultBytesMax {
		return invalid("ack_result.result", "%d bytes above %d", len(f.Result), ResultBytesMax)
	}
	w.u32(f.ConsumerID)
	w.bytes16(f.Result)
	return writeRanges(w, f.Ranges)
}
func decodeAckResult(r *reader) *AckResult {
	f := &AckResult{ConsumerID: r.u32("ack_result.consumer_id"), Result: r.bytes16("ack_result.result", ResultBytesMax)}
	f.Ranges = readRanges(r)
	return f
}

// DeliveryRecord is one delivered message.
type DeliveryRecord struct {
	Partition   uint32  `json:"partition"`
	Offset      uint64  `json:"offset"`
	TimestampMs uint64  `json:"timestamp_ms"`
	Attempt     uint16  `json:"attempt"`
	Message     Message `json:"message"`
}

// Deliver pushes deliveries to a consumer.
type Deliver struct {
	ConsumerID uint32           `json:"consumer_id"`
	Deliveries []DeliveryRecord `json:"deliveries"`
}

func (*Deliver) Opcode() Opcode { return OpDeliver }
func (f *Deliver) encode(w *writer) error {
	if len(f.Deliveries) > DeliveriesMax {
		return invalid("deliver.count", "%d above %d", len(f.Deliveries), DeliveriesMax)
	}
	w.u32(f.ConsumerID)
	w.u32(uint32(len(f.Deliveries)))
	for i := range f.Deliveries {
		d := &f.Deliveries[i]
		w.u32(d.Partition)
		w.u64(d.Offset)
		w.u64(d.TimestampMs)
		w.u16(d.Attempt)
		if err := writeRecord(w, &d.Message); err != nil {
			return err
		}
	}
	return nil
}
func decodeDeliver(r *reader) *Deliver {
	f := &Deliver{ConsumerID: r.u32("deliver.consumer_id")}
	n := r.count("deliver.count", DeliveriesMax, 0)
	if r.err == nil && n*32 > r.remaining() {
		n = r.remaining()/32 + 1
	}
	f.Deliveries = make([]DeliveryRecord, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		if !r.need(22, "delivery.prefix") {
			break
		}
		d := DeliveryRecord{Partition: r.u32("delivery.partition"), Offset: r.u64("delivery.offset"), TimestampMs: r.u64("delivery.timestamp_ms"), Attempt: r.u16("delivery.attempt")}
		d.Message = readRecord(r)
		f.Deliveries = append(f.Deliveries, d)
	}
	return f
}

// ---- stats and status

// Stats asks for counters; an empty topic asks for every topic.
type Stats struct {
	Topic string `json:"topic"`
}

func (*Stats) Opcode() Opcode { return OpStats }
func (f *Stats) encode(w *writer) error {
	if err := checkStr("stats.topic", f.Topic, 0, NameBytesMax); err != nil {
		return err
	}
	w.str16(f.Topic)
	return nil
}

// StatsReply answers STATS.
type StatsReply struct {
	Topics []TopicStats `json:"topics"`
}

func (*StatsReply) Opcode() Opcode { return OpStatsReply }
func (f *StatsReply) encode(w *writer) error {
	w.u32(uint32(len(f.Topics)))
	for i := range f.Topics {
		t := &f.Topics[i]
		w.str16(t.Name)
		for _, v := range []uint64{t.MessagesIn, t.BytesIn, t.MessagesOut, t.BytesOut, t.Depth, t.DepthBytes, t.Dropped} {
			w.u64(v)
		}
		w.u32(t.Publishers)
		w.u32(t.Subscribers)
		w.u32(uint32(len(t.Subscriptions)))
		for j := range t.Subscriptions {
			s := &t.Subscriptions[j]
			w.str16(s.Name)
			w.boolean(s.Ephemeral)
			w.u32(s.Consumers)
			for _, v := range []uint64{s.MessagesOut, s.BytesOut, s.Acked, s.Redelivered, s.Backlog, s.InFlight, s.GaveUp} {
				w.u64(v)
			}
			for _, l := range []*Latency{&s.DeliverLatency, &s.AckLatency} {
				if len(l.Buckets) > BucketsMax {
					return invalid("stats.subscription.latency", "%d buckets", len(l.Buckets))
				}
				w.u64(l.SumUs)
				w.u16(uint16(len(l.Buckets)))
				for _, b := range l.Buckets {
					w.u16(b.Index)
					w.u64(b.Count)
				}
			}
			w.boolean(s.Paused)
		}
	}
	return nil
}

func readLatency(r *reader, field string) Latency {
	l := Latency{SumUs: r.u64(field)}
	n := int(r.u16(field))
	if r.err == nil && n > BucketsMax {
		r.fail(invalid(field, "%d buckets above %d", n, BucketsMax))
	}
	if r.err == nil && n*10 > r.remaining() {
		r.fail(&ProtocolError{Kind: KindTruncated, Field: field, Msg: "buckets cut short"})
	}
	if r.err != nil {
		return l
	}
	l.Buckets = make([]Bucket, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		b := Bucket{Index: r.u16(field), Count: r.u64(field)}
		if r.err != nil {
			break
		}
		switch {
		case b.Index > BucketIndexMax:
			r.fail(invalid(field, "bucket %d beyond %d", b.Index, BucketIndexMax))
		case b.Count == 0:
			r.fail(invalid(field, "bucket %d empty", b.Index))
		case i > 0 && b.Index <= l.Buckets[i-1].Index:
			r.fail(invalid(field, "bucket %d not ascending", b.Index))
		}
		l.Buckets = append(l.Buckets, b)
	}
	return l
}

func decodeStatsReply(r *reader) *StatsReply {
	n := r.count("stats.topic_count", math.MaxUint32, 0)
	f := &StatsReply{Topics: make([]TopicStats, 0, min(n, r.remaining()/70+1))}
	for i := 0; i < n && r.err == nil; i++ {
		t := TopicStats{Name: r.str16("stats.name", 0, NameBytesMax)}
		t.MessagesIn, t.BytesIn, t.MessagesOut, t.BytesOut = r.u64("stats.messages_in"), r.u64("stats.bytes_in"), r.u64("stats.messages_out"), r.u64("stats.bytes_out")
		t.Depth, t.DepthBytes, t.Dropped = r.u64("stats.depth"), r.u64("stats.depth_bytes"), r.u64("stats.dropped")
		t.Publishers, t.Subscribers = r.u32("stats.publishers"), r.u32("stats.subscribers")
		m := r.count("stats.subscription_count", math.MaxUint32, 0)
		t.Subscriptions = make([]SubscriptionStats, 0, min(m, r.remaining()/83+1))
		for j := 0; j < m && r.err == nil; j++ {
			s := SubscriptionStats{Name: r.str16("stats.subscription.name", 0, 65535)}
			s.Ephemeral = r.boolean("stats.subscription.ephemeral")
			s.Consumers = r.u32("stats.subscription.consumers")
			s.MessagesOut, s.BytesOut, s.Acked = r.u64("stats.subscription.messages_out"), r.u64("stats.subscription.bytes_out"), r.u64("stats.subscription.acked")
			s.Redelivered, s.Backlog, s.InFlight, s.GaveUp = r.u64("stats.subscription.redelivered"), r.u64("stats.subscription.backlog"), r.u64("stats.subscription.in_flight"), r.u64("stats.subscription.gave_up")
			s.DeliverLatency = readLatency(r, "stats.subscription.deliver_latency")
			s.AckLatency = readLatency(r, "stats.subscription.ack_latency")
			if r.atLeast(3) {
				s.Paused = r.boolean("stats.subscription.paused")
			}
			t.Subscriptions = append(t.Subscriptions, s)
		}
		f.Topics = append(f.Topics, t)
	}
	return f
}

// MessageStatusRequest asks where one message stands.
type MessageStatusRequest struct {
	Topic     string `json:"topic"`
	Partition uint32 `json:"partition"`
	Offset    uint64 `json:"offset"`
}

func (*MessageStatusRequest) Opcode() Opcode { return OpMessageStatus }
func (f *MessageStatusRequest) encode(w *writer) error {
	if err := checkName("message_status.topic", f.Topic); err != nil {
		return err
	}
	w.str16(f.Topic)
	w.u32(f.Partition)
	w.u64(f.Offset)
	return nil
}
func decodeMessageStatus(r *reader) *MessageStatusRequest {
	return &MessageStatusRequest{Topic: r.str16("message_status.topic", 1, NameBytesMax), Partition: r.u32("message_status.partition"), Offset: r.u64("message_status.offset")}
}

func writeEntry(w *writer, e *MessageEntry) error {
	if e.State > StateBeforeStart {
		return invalid("message_entry.state", "%d", e.State)
	}
	if len(e.Result) > ResultBytesMax {
		return invalid("message_entry.result", "%d bytes", len(e.Result))
	}
	if err := checkStr("message_entry.reason", e.Reason, 0, ReasonBytesMax); err != nil {
		return err
	}
	w.u32(e.Partition)
	w.u64(e.Offset)
	w.u8(uint8(e.State))
	w.u16(e.Attempts)
	w.u64(e.PublishedMs)
	w.u64(e.FirstDeliveredMs)
	w.u64(e.SettledMs)
	w.u64(e.DueMs)
	w.bytes16(e.Result)
	w.str16(e.Reason)
	if e.DeadLetter != nil {
		w.u8(1)
		w.u32(e.DeadLetter.Partition)
		w.u64(e.DeadLetter.Offset)
	} else {
		w.u8(0)
		w.u32(0)
		w.u64(0)
	}
	return nil
}

func readEntry(r *reader) MessageEntry {
	e := MessageEntry{Partition: r.u32("message_entry.partition"), Offset: r.u64("message_entry.offset")}
	e.State = MessageState(r.u8("message_entry.state"))
	if r.err == nil && e.State > StateBeforeStart {
		r.fail(invalid("message_entry.state", "%d", e.State))
	}
	e.Attempts = r.u16("message_entry.attempts")
	e.PublishedMs, e.FirstDeliveredMs, e.SettledMs, e.DueMs = r.u64("message_entry.published_ms"), r.u64("message_entry.first_delivered_ms"), r.u64("message_entry.settled_ms"), r.u64("message_entry.due_ms")
	e.Result = r.bytes16("message_entry.result", ResultBytesMax)
	e.Reason = r.str16("message_entry.reason", 0, ReasonBytesMax)
	has := r.boolean("message_entry.dead_letter")
	p := Position{Partition: r.u32("message_entry.dead_letter_partition"), Offset: r.u64("message_entry.dead_letter_offset")}
	if has {
		e.DeadLetter = &p
	} else if r.err == nil && (p.Partition != 0 || p.Offset != 0) {
		r.fail(invalid("message_entry.dead_letter", "a position without the dead_letter flag"))
	}
	return e
}

// MessageStatusReply answers MESSAGE_STATUS.
type MessageStatusReply MessageStatus

func (*MessageStatusReply) Opcode() Opcode { return OpMessageStatusReply }
func (f *MessageStatusReply) encode(w *writer) error {
	if f.Priority > PriorityMax {
		return invalid("message_status.priority", "%d", f.Priority)
	}
	if len(f.Key) > KeyBytesMax {
		return invalid("message_status.key", "%d bytes", len(f.Key))
	}
	w.u32(f.Partition)
	w.u64(f.Offset)
	w.u64(f.PublishedMs)
	w.u8(f.Priority)
	w.boolean(f.Key != nil)
	w.bytes16(f.Key)
	w.u32(f.BodyBytes)
	w.u32(uint32(len(f.Subscriptions)))
	for i := range f.Subscriptions {
		s := &f.Subscriptions[i]
		w.str16(s.Subscription)
		if err := writeEntry(w, &s.Entry); err != nil {
			return err
		}
	}
	return nil
}

// MarshalJSON writes the status's fields.
func (f *MessageStatusReply) MarshalJSON() ([]byte, error) { return json.Marshal((*MessageStatus)(f)) }

// UnmarshalJSON reads the status's fields.
func (f *MessageStatusReply) UnmarshalJSON(b []byte) error {
	return json.Unmarshal(b, (*MessageStatus)(f))
}

func decodeMessageStatusReply(r *reader) *MessageStatusReply {
	f := &MessageStatusReply{Partition: r.u32("message_status.partition"), Offset: r.u64("message_status.offset"), PublishedMs: r.u64("message_status.published_ms")}
	f.Priority = r.u8("message_status.priority")
	if r.err == nil && f.Priority > PriorityMax {
		r.fail(invalid("message_status.priority", "%d", f.Priority))
	}
	has := r.boolean("message_status.has_key")
	key := r.bytes16("message_status.key", KeyBytesMax)
	if has {
		f.Key = key
		if f.Key == nil && r.err == nil {
			f.Key = []byte{}
		}
	} else if r.err == nil && len(key) != 0 {
		r.fail(invalid("message_status.key", "a key without has_key"))
	}
	f.BodyBytes = r.u32("message_status.body_bytes")
	n := r.count("message_status.subscription_count", math.MaxUint32, 66)
	f.Subscriptions = make([]SubscriptionEntry, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		s := SubscriptionEntry{Subscription: r.str16("message_status.subscription", 0, 65535)}
		s.Entry = readEntry(r)
		f.Subscriptions = append(f.Subscriptions, s)
	}
	return f
}

// ListMessages pages through one subscription's messages.
type ListMessages struct {
	Topic        string   `json:"topic"`
	Subscription string   `json:"subscription"`
	Kind         ListKind `json:"kind"`
	Page         []byte   `json:"page"`
	Limit        uint32   `json:"limit"`
}

func (*ListMessages) Opcode() Opcode { return OpListMessages }
func (f *ListMessages) encode(w *writer) error {
	if err := firstErr(checkName("list_messages.topic", f.Topic), checkName("list_messages.subscription", f.Subscription)); err != nil {
		return err
	}
	if f.Kind > ListDeadLettered {
		return invalid("list_messages.kind", "%d", f.Kind)
	}
	if len(f.Page) > PageBytesMax {
		return invalid("list_messages.page", "%d bytes", len(f.Page))
	}
	if f.Limit < 1 || f.Limit > ListLimitMax {
		return invalid("list_messages.limit", "%d outside 1..=%d", f.Limit, ListLimitMax)
	}
	w.str16(f.Topic)
	w.str16(f.Subscription)
	w.u8(uint8(f.Kind))
	w.bytes16(f.Page)
	w.u32(f.Limit)
	return nil
}
func decodeListMessages(r *reader) *ListMessages {
	f := &ListMessages{Topic: r.str16("list_messages.topic", 1, NameBytesMax), Subscription: r.str16("list_messages.subscription", 1, NameBytesMax)}
	f.Kind = ListKind(r.u8("list_messages.kind"))
	if r.err == nil && f.Kind > ListDeadLettered {
		r.fail(invalid("list_messages.kind", "%d", f.Kind))
	}
	f.Page = r.bytes16("list_messages.page", PageBytesMax)
	f.Limit = r.u32("list_messages.limit")
	if r.err == nil && (f.Limit < 1 || f.Limit > ListLimitMax) {
		r.fail(invalid("list_messages.limit", "%d outside 1..=%d", f.Limit, ListLimitMax))
	}
	return f
}

// MessageList answers LIST_MESSAGES.
type MessageList struct {
	Entries  []MessageEntry `json:"entries"`
	NextPage []byte         `json:"next_page"`
}

func (*MessageList) Opcode() Opcode { return OpMessageList }
func (f *MessageList) encode(w *writer) error {
	if len(f.Entries) > ListLimitMax {
		return invalid("message_list.count", "%d", len(f.Entries))
	}
	if len(f.NextPage) > PageBytesMax {
		return invalid("message_list.next_page", "%d bytes", len(f.NextPage))
	}
	w.u32(uint32(len(f.Entries)))
	for i := range f.Entries {
		if err := writeEntry(w, &f.Entries[i]); err != nil {
			return err
		}
	}
	w.bytes16(f.NextPage)
	return nil
}
func decodeMessageList(r *reader) *MessageList {
	n := r.count("message_list.count", ListLimitMax, 64)
	f := &MessageList{Entries: make([]MessageEntry, 0, n)}
	for i := 0; i < n && r.err == nil; i++ {
		f.Entries = append(f.Entries, readEntry(r))
	}
	f.NextPage = r.bytes16("message_list.next_page", PageBytesMax)
	return f
}

// Selection picks dead letters to requeue: All, or one partition's inclusive offset range.
type Selection struct {
	All         bool
	Partition   uint32
	FirstOffset uint64
	LastOffset  uint64
}

// MarshalJSON writes {"kind": "all"} or {"kind": "range", ...}.
func (s Selection) MarshalJSON() ([]byte, error) {
	if s.All {
		return []byte(`{"kind":"all"}`), nil
	}
	return json.Marshal(map[string]any{"kind": "range", "partition": s.Partition, "first_offset": s.FirstOffset, "last_offset": s.LastOffset})
}

// UnmarshalJSON reads the forms MarshalJSON writes.
func (s *Selection) UnmarshalJSON(b []byte) error {
	var v struct {
		Kind        string `json:"kind"`
		Partition   uint32 `json:"partition"`
		FirstOffset uint64 `json:"first_offset"`
		LastOffset  uint64 `json:"last_offset"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*s = Selection{All: v.Kind == "all", Partition: v.Partition, FirstOffset: v.FirstOffset, LastOffset: v.LastOffset}
	return nil
}

// RequeueDead publishes dead letters again.
type RequeueDead struct {
	DeadLetterTopic string    `json:"dead_letter_topic"`
	Selection       Selection `json:"selection"`
}

func (*RequeueDead) Opcode() Opcode { return OpRequeueDead }
func (f *RequeueDead) encode(w *writer) error {
	if err := checkName("requeue_dead.dead_letter_topic", f.DeadLetterTopic); err != nil {
		return err
	}
	s := f.Selection
	if s.All && (s.Partition != 0 || s.FirstOffset != 0 || s.LastOffset != 0) {
		return invalid("requeue_dead.first_offset", "offsets with selection all")
	}
	if !s.All && s.LastOffset < s.FirstOffset {
		return invalid("requeue_dead.last_offset", "%d below %d", s.LastOffset, s.FirstOffset)
	}
	w.str16(f.DeadLetterTopic)
	w.boolean(!s.All)
	w.u32(s.Partition)
	w.u64(s.FirstOffset)
	w.u64(s.LastOffset)
	return nil
}
func decodeRequeueDead(r *reader) *RequeueDead {
	f := &RequeueDead{DeadLetterTopic: r.str16("requeue_dead.dead_letter_topic", 1, NameBytesMax)}
	kind := r.u8("requeue_dead.selection")
	if r.err == nil && kind > 1 {
		r.fail(invalid("requeue_dead.selection", "%d", kind))
	}
	s := Selection{All: kind == 0, Partition: r.u32("requeue_dead.partition"), FirstOffset: r.u64("requeue_dead.first_offset"), LastOffset: r.u64("requeue_dead.last_offset")}
	if r.err == nil {
		if s.All && s.Partition != 0 {
			r.fail(invalid("requeue_dead.partition", "%d with selection all", s.Partition))
		} else if s.All && s.FirstOffset != 0 {
			r.fail(invalid("requeue_dead.first_offset", "%d with selection all", s.FirstOffset))
		} else if s.All && s.LastOffset != 0 {
			r.fail(invalid("requeue_dead.last_offset", "%d with selection all", s.LastOffset))
		} else if !s.All && s.LastOffset < s.FirstOffset {
			r.fail(invalid("requeue_dead.last_offset", "%d below %d", s.LastOffset, s.FirstOffset))
		}
	}
	f.Selection = s
	return f
}

// Requeued answers REQUEUE_DEAD.
type Requeued struct {
	Requeued uint64 `json:"requeued"`
	Skipped  uint64 `json:"skipped"`
}

func (*Requeued) Opcode() Opcode           { return OpRequeued }
func (f *Requeued) encode(w *writer) error { w.u64(f.Requeued); w.u64(f.Skipped); return nil }

// ---- users and tokens

// UserAdd adds a user.
type UserAdd struct {
	User     string `json:"user"`
	Password string `json:"password"`
	Roles    uint8  `json:"roles"`
}

func (*UserAdd) Opcode() Opcode { return OpUserAdd }
func (f *UserAdd) encode(w *writer) error {
	if err := firstErr(checkName("user_add.user", f.User), checkStr("user_add.password", f.Password, 0, 65535)); err != nil {
		return err
	}
	w.str16(f.User)
	w.str16(f.Password)
	w.u8(f.Roles)
	return nil
}
func decodeUserAdd(r *reader) *UserAdd {
	return &UserAdd{User: r.str16("user_add.user", 1, NameBytesMax), Password: r.str16("user_add.password", 0, 65535), Roles: r.u8("user_add.roles")}
}

// UserRemove removes a user.
type UserRemove struct {
	User string `json:"user"`
}

func (*UserRemove) Opcode() Opcode { return OpUserRemove }
func (f *UserRemove) encode(w *writer) error {
	if err := checkStr("user_remove.user", f.User, 0, NameBytesMax); err != nil {
		return err
	}
	w.str16(f.User)
	return nil
}

// UserPasswd sets a password.
type UserPasswd struct {
	User     string `json:"user"`
	Password string `json:"password"`
}

func (*UserPasswd) Opcode() Opcode { return OpUserPasswd }
func (f *UserPasswd) encode(w *writer) error {
	if err := firstErr(checkStr("user_passwd.user", f.User, 0, NameBytesMax), checkStr("user_passwd.password", f.Password, 0, 65535)); err != nil {
		return err
	}
	w.str16(f.User)
	w.str16(f.Password)
	return nil
}
func decodeUserPasswd(r *reader) *UserPasswd {
	return &UserPasswd{User: r.str16("user_passwd.user", 0, NameBytesMax), Password: r.str16("user_passwd.password", 0, 65535)}
}

// GrantChange is the payload of GRANT and REVOKE.
type GrantChange struct {
	User    string `json:"user"`
	Pattern string `json:"pattern"`
	Actions uint8  `json:"actions"`
	Roles   uint8  `json:"roles"`
}

func (f *GrantChange) encode(w *writer) error {
	if err := firstErr(checkName("grant.user", f.User), checkStr("grant.pattern", f.Pattern, 0, NameBytesMax)); err != nil {
		return err
	}
	w.str16(f.User)
	w.str16(f.Pattern)
	w.u8(f.Actions)
	w.u8(f.Roles)
	return nil
}
func decodeGrant(r *reader) GrantChange {
	return GrantChange{User: r.str16("grant.user", 1, NameBytesMax), Pattern: r.str16("grant.pattern", 0, NameBytesMax), Actions: r.u8("grant.actions"), Roles: r.u8("grant.roles")}
}

// Grant adds rights.
type Grant GrantChange

// Revoke takes rights away.
type Revoke GrantChange

func (*Grant) Opcode() Opcode            { return OpGrant }
func (*Revoke) Opcode() Opcode           { return OpRevoke }
func (f *Grant) encode(w *writer) error  { return (*GrantChange)(f).encode(w) }
func (f *Revoke) encode(w *writer) error { return (*GrantChange)(f).encode(w) }

// TokenCreate creates an API token.
type TokenCreate struct {
	User      string `json:"user"`
	Name      string `json:"name"`
	ExpiresMs uint64 `json:"expires_ms"`
}

func (*TokenCreate) Opcode() Opcode { return OpTokenCreate }
func (f *TokenCreate) encode(w *writer) error {
	if err := firstErr(checkStr("token_create.user", f.User, 0, NameBytesMax), checkName("token_create.name", f.Name)); err != nil {
		return err
	}
	w.str16(f.User)
	w.str16(f.Name)
	w.u64(f.ExpiresMs)
	return nil
}
func decodeTokenCreate(r *reader) *TokenCreate {
	return &TokenCreate{User: r.str16("token_create.user", 0, NameBytesMax), Name: r.str16("token_create.name", 1, NameBytesMax), ExpiresMs: r.u64("token_create.expires_ms")}
}

// TokenList lists a user's tokens.
type TokenList struct {
	User string `json:"user"`
}

func (*TokenList) Opcode() Opcode { return OpTokenList }
func (f *TokenList) encode(w *writer) error {
	if err := checkStr("token_list.user", f.User, 0, NameBytesMax); err != nil {
		return err
	}
	w.str16(f.User)
	return nil
}

// TokenRevoke revokes a token.
type TokenRevoke struct {
	User string `json:"user"`
	Name string `json:"name"`
}

func (*TokenRevoke) Opcode() Opcode { return OpTokenRevoke }
func (f *TokenRevoke) encode(w *writer) error {
	if err := firstErr(checkStr("token_revoke.user", f.User, 0, NameBytesMax), checkName("token_revoke.name", f.Name)); err != nil {
		return err
	}
	w.str16(f.User)
	w.str16(f.Name)
	return nil
}
func decodeTokenRevoke(r *reader) *TokenRevoke {
	return &TokenRevoke{User: r.str16("token_revoke.user", 0, NameBytesMax), Name: r.str16("token_revoke.name", 1, NameBytesMax)}
}

// UserListReply lists users.
type UserListReply struct {
	Users []UserInfo `json:"users"`
}

func (*UserListReply) Opcode() Opcode { return OpUserListReply }
func (f *UserListReply) encode(w *writer) error {
	w.u32(uint32(len(f.Users)))
	for _, u := range f.Users {
		w.str16(u.Name)
		w.u8(u.Roles)
		w.u32(u.Tokens)
		w.u16(uint16(len(u.Grants)))
		for _, g := range u.Grants {
			w.str16(g.Pattern)
			w.u8(g.Actions)
		}
	}
	return nil
}
func decodeUserListReply(r *reader) *UserListReply {
	n := r.count("user_list.count", math.MaxUint32, 9)
	f := &UserListReply{Users: make([]UserInfo, 0, n)}
	for i := 0; i < n && r.err == nil; i++ {
		u := UserInfo{Name: r.str16("user_list.name", 0, NameBytesMax), Roles: r.u8("user_list.roles"), Tokens: r.u32("user_list.tokens")}
		m := int(r.u16("user_list.grant_count"))
		u.Grants = make([]GrantInfo, 0, min(m, 64))
		for j := 0; j < m && r.err == nil; j++ {
			u.Grants = append(u.Grants, GrantInfo{Pattern: r.str16("user_list.pattern", 0, NameBytesMax), Actions: r.u8("user_list.actions")})
		}
		f.Users = append(f.Users, u)
	}
	return f
}

// TokenCreated answers TOKEN_CREATE; Token is shown this once.
type TokenCreated struct {
	Name      string `json:"name"`
	Token     string `json:"token"`
	ExpiresMs uint64 `json:"expires_ms"`
}

func (*TokenCreated) Opcode() Opcode { return OpTokenCreated }
func (f *TokenCreated) encode(w *writer) error {
	w.str16(f.Name)
	w.str16(f.Token)
	w.u64(f.ExpiresMs)
	return nil
}
func decodeTokenCreated(r *reader) *TokenCreated {
	return &TokenCreated{Name: r.str16("token_created.name", 0, NameBytesMax), Token: r.str16("token_created.token", 0, 65535), ExpiresMs: r.u64("token_created.expires_ms")}
}

// TokenListReply lists tokens.
type TokenListReply struct {
	Tokens []TokenInfo `json:"tokens"`
}

func (*TokenListReply) Opcode() Opcode { return OpTokenListReply }
func (f *TokenListReply) encode(w *writer) error {
	w.u32(uint32(len(f.Tokens)))
	for _, t := range f.Tokens {
		w.str16(t.Name)
		w.u64(t.CreatedMs)
		w.u64(t.ExpiresMs)
	}
	return nil
}
func decodeTokenListReply(r *reader) *TokenListReply {
	n := r.count("token_list.count", math.MaxUint32, 18)
	f := &TokenListReply{Tokens: make([]TokenInfo, 0, n)}
	for i := 0; i < n && r.err == nil; i++ {
		f.Tokens = append(f.Tokens, TokenInfo{Name: r.str16("token_list.name", 0, NameBytesMax), CreatedMs: r.u64("token_list.created_ms"), ExpiresMs: r.u64("token_list.expires_ms")})
	}
	return f
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
