//! Little-endian primitives shared by every frame: a bounds-checked reader over `Bytes` that hands
//! out zero-copy slices, and writers into `BytesMut`.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::ProtocolError;

/// A cursor over one frame's payload. Every read checks bounds first; nothing panics on short input.
///
/// Over `Bytes` it also hands out zero-copy slices; over a borrowed `&[u8]` it only validates and
/// measures, without touching the buffer's reference count (the first clone of a `Bytes` made
/// from a `Vec` allocates).
pub(crate) struct Reader<B = Bytes> {
    buf: B,
    pos: usize,
}

impl<B: AsRef<[u8]>> Reader<B> {
    pub(crate) fn new(buf: B) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.as_ref().len() - self.pos
    }

    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    /// Steps over `n` bytes without slicing them out.
    pub(crate) fn skip(&mut self, n: usize, field: &'static str) -> Result<(), ProtocolError> {
        self.take(n, field).map(|_| ())
    }

    /// Borrows the next `n` bytes.
    pub(crate) fn take(&mut self, n: usize, field: &'static str) -> Result<&[u8], ProtocolError> {
        if self.remaining() < n {
            return Err(ProtocolError::Truncated { field });
        }
        let start = self.pos;
        self.pos += n;
        Ok(&self.buf.as_ref()[start..start + n])
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, ProtocolError> {
        Ok(self.take(1, field)?[0])
    }

    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, ProtocolError> {
        let b = self.take(2, field)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, ProtocolError> {
        let b = self.take(4, field)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, ProtocolError> {
        let b = self.take(8, field)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// A string with a u16 length prefix.
    pub(crate) fn str16(&mut self, field: &'static str) -> Result<String, ProtocolError> {
        let len = self.u16(field)? as usize;
        let raw = self.take(len, field)?;
        std::str::from_utf8(raw)
            .map(str::to_owned)
            .map_err(|_| ProtocolError::InvalidUtf8 { field })
    }

    pub(crate) fn finish(self, opcode: &'static str) -> Result<(), ProtocolError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(ProtocolError::TrailingBytes { opcode, extra }),
        }
    }
}

impl Reader<Bytes> {
    /// A zero-copy slice of the next `n` bytes.
    pub(crate) fn bytes(&mut self, n: usize, field: &'static str) -> Result<Bytes, ProtocolError> {
        if self.remaining() < n {
            return Err(ProtocolError::Truncated { field });
        }
        let out = self.buf.slice(self.pos..self.pos + n);
        self.pos += n;
        Ok(out)
    }

    /// Bytes with a u16 length prefix, zero-copy.
    pub(crate) fn bytes16(&mut self, field: &'static str) -> Result<Bytes, ProtocolError> {
        let len = self.u16(field)? as usize;
        self.bytes(len, field)
    }

    /// Everything not yet read, zero-copy.
    pub(crate) fn rest(&mut self) -> Bytes {
        let out = self.buf.slice(self.pos..);
        self.pos = self.buf.len();
        out
    }
}

/// Writes a string with a u16 length prefix. Callers bound their strings before encoding; a longer
/// string is a bug in the caller, not bad input, hence the assertion.
pub(crate) fn put_str16(buf: &mut BytesMut, s: &str) {
    assert!(
        s.len() <= u16::MAX as usize,
        "string of {} bytes does not fit a u16 length",
        s.len()
    );
    buf.put_u16_le(s.len() as u16);
    buf.put_slice(s.as_bytes());
}

/// Writes bytes with a u16 length prefix. As for [`put_str16`], a longer value is a caller bug.
pub(crate) fn put_bytes16(buf: &mut BytesMut, b: &[u8]) {
    assert!(
        b.len() <= u16::MAX as usize,
        "{} bytes do not fit a u16 length",
        b.len()
    );
    buf.put_u16_le(b.len() as u16);
    buf.put_slice(b);
}
