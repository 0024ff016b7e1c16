package ferrymq

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
)

// ErrorCode is a protocol error code carried by ERROR.
type ErrorCode uint16

// The error codes of docs/protocol.md.
const (
	CodeMalformedFrame       ErrorCode = 1
	CodeUnsupportedVersion   ErrorCode = 2
	CodeFrameTooLarge        ErrorCode = 3
	CodeMessageTooLarge      ErrorCode = 4
	CodeUnknownTopic         ErrorCode = 5
	CodeTopicExists          ErrorCode = 6
	CodeTopicFull            ErrorCode = 7
	CodeUnknownConsumer      ErrorCode = 8
	CodeInvalidArgument      ErrorCode = 9
	CodeAuthenticationFailed ErrorCode = 10
	CodeTooManyConnections   ErrorCode = 11
	CodeHandshakeRequired    ErrorCode = 12
	CodeInternal             ErrorCode = 13
	CodeUnknownSubscription  ErrorCode = 14
	CodeUnknownOpcode        ErrorCode = 15
	CodeShuttingDown         ErrorCode = 16
	CodeLimitExceeded        ErrorCode = 17
	CodeStorageUnavailable   ErrorCode = 18
	CodeConflict             ErrorCode = 19
	CodeUnknownMessage       ErrorCode = 20
	CodeForbidden            ErrorCode = 21
	// CodeNotLeader is protocol version 3's; a version 2 connection gets
	// CodeStorageUnavailable instead.
	CodeNotLeader ErrorCode = 22
)

var codeNames = map[ErrorCode]string{
	1: "malformed_frame", 2: "unsupported_version", 3: "frame_too_large", 4: "message_too_large",
	5: "unknown_topic", 6: "topic_exists", 7: "topic_full", 8: "unknown_consumer", 9: "invalid_argument",
	10: "authentication_failed", 11: "too_many_connections", 12: "handshake_required", 13: "internal",
	14: "unknown_subscription", 15: "unknown_opcode", 16: "shutting_down", 17: "limit_exceeded",
	18: "storage_unavailable", 19: "conflict", 20: "unknown_message", 21: "forbidden",
	22: "not_leader",
}

// String is the code's snake_case name; an unknown code reads unknown(<n>).
func (c ErrorCode) String() string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return fmt.Sprintf("unknown(%d)", uint16(c))
}

// Known reports whether this package knows the code; an unknown code counts as internal.
func (c ErrorCode) Known() bool { _, ok := codeNames[c]; return ok }

// Closes reports whether the broker closes the connection after this error.
func (c ErrorCode) Closes() bool {
	switch c {
	case CodeMalformedFrame, CodeUnsupportedVersion, CodeFrameTooLarge, CodeAuthenticationFailed,
		CodeTooManyConnections, CodeHandshakeRequired, CodeUnknownOpcode, CodeShuttingDown:
		return true
	}
	return false
}

// Error is an ERROR frame from the broker. errors.Is matches it against the sentinel of its
// code (ErrUnknownTopic, ErrForbidden...); an unknown code also matches ErrInternal.
type Error struct {
	Code    ErrorCode
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "ferrymq: " + e.Code.String()
	}
	return "ferrymq: " + e.Code.String() + ": " + e.Message
}

// Is matches sentinels by code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok || t.Message != "" {
		return false
	}
	return t.Code == e.Code || (t.Code == CodeInternal && !e.Code.Known())
}

// Sentinels, one per error code: errors.Is(err, ferrymq.ErrUnknownTopic).
var (
	ErrMalformedFrame       = &Error{Code: CodeMalformedFrame}
	ErrUnsupportedVersion   = &Error{Code: CodeUnsupportedVersion}
	ErrFrameTooLarge        = &Error{Code: CodeFrameTooLarge}
	ErrMessageTooLarge      = &Error{Code: CodeMessageTooLarge}
	ErrUnknownTopic         = &Error{Code: CodeUnknownTopic}
	ErrTopicExists          = &Error{Code: CodeTopicExists}
	ErrTopicFull            = &Error{Code: CodeTopicFull}
	ErrUnknownConsumer      = &Error{Code: CodeUnknownConsumer}
	ErrInvalidArgument      = &Error{Code: CodeInvalidArgument}
	ErrAuthenticationFailed = &Error{Code: CodeAuthenticationFailed}
	ErrTooManyConnections   = &Error{Code: CodeTooManyConnections}
	ErrHandshakeRequired    = &Error{Code: CodeHandshakeRequired}
	ErrInternal             = &Error{Code: CodeInternal}
	ErrUnknownSubscription  = &Error{Code: CodeUnknownSubscription}
	ErrUnknownOpcode        = &Error{Code: CodeUnknownOpcode}
	ErrShuttingDown         = &Error{Code: CodeShuttingDown}
	ErrLimitExceeded        = &Error{Code: CodeLimitExceeded}
	ErrStorageUnavailable   = &Error{Code: CodeStorageUnavailable}
	ErrConflict             = &Error{Code: CodeConflict}
	ErrUnknownMessage       = &Error{Code: CodeUnknownMessage}
	ErrForbidden            = &Error{Code: CodeForbidden}
	// ErrNotLeader: a cluster node does not lead what the request needs; nothing was done.
	// The error is a *NotLeaderError naming the leader when the node knows it.
	ErrNotLeader = &Error{Code: CodeNotLeader}
)

// NotLeaderError is the broker's not_leader: the node that answered does not lead the
// partition (or the cluster metadata) the request needs, and nothing was done. It matches
// ErrNotLeader and unwraps to the broker's *Error. The Client follows leaders by itself (see
// Options.LeaderTimeout); this error reaches the caller when no leader answered in time.
type NotLeaderError struct {
	// Err is the ERROR frame as the broker sent it.
	Err *Error
	// Node is the node that answered, Leader the one it names (0: unknown, an election is under
	// way) and LeaderAddr that node's client address (empty when unknown).
	Node, Leader uint64
	LeaderAddr   string
	// Topic and Partition say what the request needed; Topic is empty for the cluster
	// metadata (creating or deleting a topic), Partition -1 when the message does not say.
	Topic     string
	Partition int64
}

func (e *NotLeaderError) Error() string { return e.Err.Error() }

// Unwrap gives the broker's *Error, which matches ErrNotLeader.
func (e *NotLeaderError) Unwrap() error { return e.Err }

// The broker's not_leader messages: "node 1 does not lead partition 0 of 'orders': node 2 at
// 10.0.0.2:7070 does", "... : node 2 does" (address unknown), and "partition 0 of 'orders' has
// no leader at the moment (an election is under way); retry".
var (
	notLeaderNamed  = regexp.MustCompile(`^node (\d+) does not lead (.*): node (\d+)(?: at (\S+))? does$`)
	notLeaderNone   = regexp.MustCompile(`^(.*) has no leader at the moment`)
	notLeaderPartOf = regexp.MustCompile(`^partition (\d+) of '(.*)'$`)
)

// parseNotLeader reads what a not_leader message says; fields it does not find stay zero.
func parseNotLeader(e *Error) *NotLeaderError {
	nl := &NotLeaderError{Err: e, Partition: -1}
	what := ""
	if m := notLeaderNamed.FindStringSubmatch(e.Message); m != nil {
		nl.Node, _ = strconv.ParseUint(m[1], 10, 64)
		nl.Leader, _ = strconv.ParseUint(m[3], 10, 64)
		nl.LeaderAddr = m[4]
		what = m[2]
	} else if m := notLeaderNone.FindStringSubmatch(e.Message); m != nil {
		what = m[1]
	}
	if m := notLeaderPartOf.FindStringSubmatch(what); m != nil {
		if p, err := strconv.ParseUint(m[1], 10, 32); err == nil {
			nl.Partition = int64(p)
		}
		nl.Topic = m[2]
	}
	return nl
}

// brokerError is the error of an ERROR frame answering a request.
func brokerError(code uint16, msg string) error {
	e := &Error{Code: ErrorCode(code), Message: msg}
	if e.Code == CodeNotLeader {
		return parseNotLeader(e)
	}
	return e
}

// VersionError is a request the connection's protocol version does not have (a version 3
// request to a broker that speaks version 2); it was not sent. It matches ErrUnknownOpcode,
// what the broker would have answered.
type VersionError struct {
	Request string
	Need    uint16
	Have    uint16
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("ferrymq: %s needs protocol version %d; the broker speaks %d", e.Request, e.Need, e.Have)
}

// Is matches ErrUnknownOpcode.
func (e *VersionError) Is(target error) bool { return target == ErrUnknownOpcode }

// Client-side errors.
var (
	// ErrProtocol matches every *ProtocolError: a frame this package refused.
	ErrProtocol = errors.New("ferrymq: protocol error")
	// ErrClosed is returned by calls on a closed Client or Subscription.
	ErrClosed = errors.New("ferrymq: closed")
	// ErrConnectionLost matches every *ConnectionLostError.
	ErrConnectionLost = errors.New("ferrymq: connection lost")
	// ErrOutcomeUnknown matches a request that was sent but whose answer never came: the broker
	// may or may not have carried it out (a publish may be stored).
	ErrOutcomeUnknown = errors.New("ferrymq: outcome unknown")
	// ErrTooLarge is a message or batch over the broker's limits, refused before sending.
	ErrTooLarge = errors.New("ferrymq: over the broker's limit")
	// ErrUnknownSerializer is a bus serializer name this package does not know.
	ErrUnknownSerializer = errors.New("ferrymq: unknown serializer")
)

// ConnectionLostError fails requests still waiting when the connection goes.
type ConnectionLostError struct {
	// Sent is true when the request left the client: its outcome is unknown.
	Sent bool
	Err  error
}

// isConnectionError reports whether err is a lost connection.
func isConnectionError(err error) bool {
	var lost *ConnectionLostError
	return errors.As(err, &lost)
}

func (e *ConnectionLostError) Error() string {
	s := "ferrymq: connection lost"
	if e.Sent {
		s += ", outcome unknown"
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is matches ErrConnectionLost, and ErrOutcomeUnknown when the request was sent.
func (e *ConnectionLostError) Is(target error) bool {
	return target == ErrConnectionLost || (e.Sent && target == ErrOutcomeUnknown)
}

// Unwrap gives the cause.
func (e *ConnectionLostError) Unwrap() error { return e.Err }

// CancelledError is a request whose context ended before its answer came.
type CancelledError struct {
	// Sent is true when the request left the client: the broker may still carry it out.
	Sent bool
	Err  error
}

func (e *CancelledError) Error() string {
	if e.Sent {
		return "ferrymq: request sent, answer not awaited (outcome unknown): " + e.Err.Error()
	}
	return "ferrymq: request not sent: " + e.Err.Error()
}

// Is matches ErrOutcomeUnknown when the request was sent.
func (e *CancelledError) Is(target error) bool { return e.Sent && target == ErrOutcomeUnknown }

// Unwrap gives the context's error, so errors.Is(err, context.Canceled) works.
func (e *CancelledError) Unwrap() error { return e.Err }

// The broker ends a consumer with "consumer <id> ends: <reason>" or "topic '<name>' was
// deleted; consumer <id> ends"; other messages naming a consumer ("unknown consumer 3") are not
// about one that ends.
var consumerInMessage = regexp.MustCompile(`consumer (\d+) ends`)

// consumerOf finds the consumer id an ERROR with request id 0 names, if any.
func consumerOf(msg string) (uint32, bool) {
	m := consumerInMessage.FindStringSubmatch(msg)
	if m == nil {
		return 0, false
	}
	n, err := strconv.ParseUint(m[1], 10, 32)
	return uint32(n), err == nil
}
