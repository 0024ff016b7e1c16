package ferrymq

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"
)

// ProtocolError is a frame this package refuses to encode or decode. Kind is one of the
// ProtocolErrorKind values (named as in docs/protocol.md's test vectors); Field names the field
// at fault when there is one.
type ProtocolError struct {
	Kind  ProtocolErrorKind
	Field string
	Msg   string
}

// ProtocolErrorKind classifies a refused frame.
type ProtocolErrorKind string

// The kinds of refused frames.
const (
	KindTruncated     ProtocolErrorKind = "Truncated"
	KindFrameTooLarge ProtocolErrorKind = "FrameTooLarge"
	KindUnknownOpcode ProtocolErrorKind = "UnknownOpcode"
	KindInvalidFlags  ProtocolErrorKind = "InvalidFlags"
	KindInvalidUTF8   ProtocolErrorKind = "InvalidUtf8"
	KindInvalidValue  ProtocolErrorKind = "InvalidValue"
	KindTrailingBytes ProtocolErrorKind = "TrailingBytes"
)

func (e *ProtocolError) Error() string {
	s := "ferrymq: protocol: " + string(e.Kind)
	if e.Field != "" {
		s += " " + e.Field
	}
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	return s
}

// Is makes errors.Is(err, ErrProtocol) true for every ProtocolError.
func (e *ProtocolError) Is(target error) bool { return target == ErrProtocol }

func invalid(field, format string, args ...any) *ProtocolError {
	return &ProtocolError{Kind: KindInvalidValue, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// writer appends little-endian values to a byte slice.
type writer struct {
	b []byte
	// version: the protocol version whose layout is written (0: ProtocolVersion).
	version uint16
}

// atLeast reports whether the layout of protocol version v or later is written.
func (w *writer) atLeast(v uint16) bool {
	return w.version == 0 || w.version >= v
}

func (w *writer) u8(v uint8)   { w.b = append(w.b, v) }
func (w *writer) u16(v uint16) { w.b = binary.LittleEndian.AppendUint16(w.b, v) }
func (w *writer) u32(v uint32) { w.b = binary.LittleEndian.AppendUint32(w.b, v) }
func (w *writer) u64(v uint64) { w.b = binary.LittleEndian.AppendUint64(w.b, v) }
func (w *writer) boolean(v bool) {
	if v {
		w.u8(1)
	} else {
		w.u8(0)
	}
}
func (w *writer) raw(b []byte) { w.b = append(w.b, b...) }
func (w *writer) str16(s string) {
	w.u16(uint16(len(s)))
	w.b = append(w.b, s...)
}
func (w *writer) bytes16(b []byte) {
	w.u16(uint16(len(b)))
	w.b = append(w.b, b...)
}

// reader takes little-endian values from a payload; the first failure sticks.
type reader struct {
	b   []byte
	pos int
	err *ProtocolError
	// owned: b belongs to the decoded frame, so byte fields may share it instead of copying.
	owned bool
	// version: the protocol version whose layout b is in (0: ProtocolVersion).
	version uint16
}

// atLeast reports whether the payload is in the layout of protocol version v or later.
func (r *reader) atLeast(v uint16) bool {
	return r.version == 0 || r.version >= v
}

func (r *reader) need(n int, field string) bool {
	if r.err != nil {
		return false
	}
	if len(r.b)-r.pos < n {
		r.err = &ProtocolError{Kind: KindTruncated, Field: field, Msg: fmt.Sprintf("needs %d bytes, %d left", n, len(r.b)-r.pos)}
		return false
	}
	return true
}
func (r *reader) remaining() int { return len(r.b) - r.pos }
func (r *reader) fail(e *ProtocolError) {
	if r.err == nil {
		r.err = e
	}
}
func (r *reader) u8(field string) uint8 {
	if !r.need(1, field) {
		return 0
	}
	v := r.b[r.pos]
	r.pos++
	return v
}
func (r *reader) u16(field string) uint16 {
	if !r.need(2, field) {
		return 0
	}
	v := binary.LittleEndian.Uint16(r.b[r.pos:])
	r.pos += 2
	return v
}
func (r *reader) u32(field string) uint32 {
	if !r.need(4, field) {
		return 0
	}
	v := binary.LittleEndian.Uint32(r.b[r.pos:])
	r.pos += 4
	return v
}
func (r *reader) u64(field string) uint64 {
	if !r.need(8, field) {
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b[r.pos:])
	r.pos += 8
	return v
}
func (r *reader) boolean(field string) bool {
	v := r.u8(field)
	if v > 1 {
		r.fail(invalid(field, "%d is not a boolean", v))
	}
	return v == 1
}
func (r *reader) take(n int, field string) []byte {
	if !r.need(n, field) {
		return nil
	}
	var v []byte
	if r.owned {
		v = r.b[r.pos : r.pos+n : r.pos+n]
	} else {
		v = make([]byte, n)
		copy(v, r.b[r.pos:r.pos+n])
	}
	r.pos += n
	return v
}
func (r *reader) str(n int, field string) string {
	if !r.need(n, field) {
		return ""
	}
	b := r.b[r.pos : r.pos+n]
	if !utf8.Valid(b) {
		r.fail(&ProtocolError{Kind: KindInvalidUTF8, Field: field, Msg: "not UTF-8"})
		return ""
	}
	r.pos += n
	return string(b)
}

// str16 reads a str16 of at most max bytes (min is the least).
func (r *reader) str16(field string, min, max int) string {
	n := int(r.u16(field))
	if r.err != nil {
		return ""
	}
	if n < min || n > max {
		r.fail(invalid(field, "length %d outside %d..=%d", n, min, max))
		return ""
	}
	return r.str(n, field)
}
func (r *reader) bytes16(field string, max int) []byte {
	n := int(r.u16(field))
	if r.err != nil {
		return nil
	}
	if n > max {
		r.fail(invalid(field, "length %d above %d", n, max))
		return nil
	}
	return r.take(n, field)
}

// count reads a u32 count and checks it against max and against the bytes left, given the least
// size of one element.
func (r *reader) count(field string, max int, minElem int) int {
	n := r.u32(field)
	if r.err != nil {
		return 0
	}
	if uint64(n) > uint64(max) {
		r.fail(invalid(field, "%d above %d", n, max))
		return 0
	}
	if minElem > 0 && uint64(n)*uint64(minElem) > uint64(r.remaining()) {
		r.fail(&ProtocolError{Kind: KindTruncated, Field: field, Msg: fmt.Sprintf("%d elements do not fit in %d bytes", n, r.remaining())})
		return 0
	}
	return int(n)
}

func checkLen(field string, n, min, max int) error {
	if n < min || n > max {
		return invalid(field, "length %d outside %d..=%d", n, min, max)
	}
	return nil
}

func checkStr(field, s string, min, max int) error {
	if err := checkLen(field, len(s), min, max); err != nil {
		return err
	}
	if !utf8.ValidString(s) {
		return &ProtocolError{Kind: KindInvalidUTF8, Field: field, Msg: "not UTF-8"}
	}
	return nil
}
