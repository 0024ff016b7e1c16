package ferrymq

import (
	"runtime"
	"testing"
)

// A body announcing a huge string, bin, array, map or ext is refused without setting much memory
// aside (the library reads a long string in chunks of about 1 MiB).
func TestMsgpackAnnouncedLengthsAreNotTrusted(t *testing.T) {
	s, _ := SchemaOf(reflectTypeOfOrderPlaced())
	for _, b := range [][]byte{{0x81, 0xdb, 0xff, 0xff, 0xff, 0xf0}, {0x81, 0xa1, 'x', 0xdb, 0xff, 0xff, 0xff, 0xf0}, {0x81, 0xa1, 'x', 0xc6, 0xff, 0xff, 0xff, 0xf0}, {0x81, 0xa1, 'x', 0xdd, 0xff, 0xff, 0xff, 0xf0}, {0x81, 0xa1, 'x', 0xdf, 0xff, 0xff, 0xff, 0xf0}, {0x81, 0xc6, 0xff, 0xff, 0xff, 0xf0}, {0x81, 0xa1, 'x', 0xc9, 0xff, 0xff, 0xff, 0xf0, 1}} {
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		_, err := MsgpackSerializer{}.Unmarshal(s, b)
		runtime.ReadMemStats(&m1)
		if err == nil || m1.TotalAlloc-m0.TotalAlloc > 4<<20 {
			t.Errorf("%x: %v, allocated %d bytes", b, err, m1.TotalAlloc-m0.TotalAlloc)
		}
	}
}
