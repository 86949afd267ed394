//! `Transfer-Encoding: chunked` request bodies (RFC 9112 section 7.1),
//! decoded by a resumable state machine, so a body dribbled in byte by byte
//! costs linear time.
//!
//! Two caps bound what the framing around the data may cost. A chunk-size
//! line (the size, its extensions and the line ending) is at most
//! [`MAX_CHUNK_LINE`] bytes: a size needs at most 16 hex digits, and no
//! client this server serves sends extensions (RFC 9112 section 7.1.1 lets a
//! server ignore them); even AWS's signed chunks (`;chunk-signature=` and 64
//! hex digits) stay under 100 bytes. And all the framing of one body (size
//! lines, the CRLF after each chunk's data, the trailer section) is at most
//! the body cap plus [`FRAMING_ALLOWANCE`]: a client writing the body in
//! small pieces spends a few bytes of framing per chunk, so only chunks of
//! a handful of bytes each, filling the body cap, come near it. Without
//! that cap, 1 KiB size lines over one-byte chunks let a client stream
//! about a thousand bytes of framing per body byte, a gigabyte for a
//! 1 MiB body, for as long as the request timeout allows. With it, a
//! chunked request costs at most about twice what a `Content-Length`
//! request of the body cap costs.

use crate::error::ApiError;

use super::MAX_HEAD_BYTES;

/// Longest chunk-size line, extensions and line ending included.
pub const MAX_CHUNK_LINE: usize = 256;
/// Framing allowed per chunked body on top of the body cap.
pub const FRAMING_ALLOWANCE: usize = 64 * 1024;

/// Where a chunked body decoder is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChunkState {
    /// Reading a `size[;ext]\r\n` line.
    Size,
    /// Reading `n` more data bytes.
    Data(usize),
    /// Expecting the CRLF after a chunk's data.
    DataEnd,
    /// After the last chunk: reading trailer lines until an empty one.
    Trailer,
    Done,
}

/// A resumable `Transfer-Encoding: chunked` decoder with a body cap.
#[derive(Debug)]
pub struct ChunkedDecoder {
    state: ChunkState,
    body: Vec<u8>,
    max_body: usize,
    /// Bytes of trailer section seen, capped like a head.
    trailer_bytes: usize,
    /// The cap on the trailer section: the reader's cap on a head.
    max_trailers: usize,
    /// Bytes of framing (size lines, data CRLFs, trailers) consumed.
    framing_bytes: usize,
}

fn malformed(why: &'static str) -> ApiError {
    ApiError::bad_request("Malformed chunked body").with_details(why)
}

/// What one step of the decoder did.
enum Advance {
    /// Consumed this many bytes; keep going.
    Used(usize),
    /// The rest of the buffer is not enough for this step.
    Wait,
}

impl ChunkedDecoder {
    /// A decoder that refuses bodies above `max_body` bytes with 413, and
    /// trailers above the server's head cap with 431.
    pub fn new(max_body: usize) -> ChunkedDecoder {
        ChunkedDecoder {
            state: ChunkState::Size,
            body: Vec::new(),
            max_body,
            trailer_bytes: 0,
            max_trailers: MAX_HEAD_BYTES,
            framing_bytes: 0,
        }
    }

    /// The same decoder with the trailer section capped at `max` bytes:
    /// a reader whose own heads may be larger (the CLI reading a response)
    /// caps the trailers as it caps a head.
    pub fn with_trailer_cap(mut self, max: usize) -> ChunkedDecoder {
        self.max_trailers = max;
        self
    }

    /// Consumes what it can of `buf`; returns the bytes consumed. Once
    /// [`is_done`](Self::is_done), the body is in [`take_body`](Self::take_body).
    pub fn feed(&mut self, buf: &[u8]) -> Result<usize, ApiError> {
        let mut pos = 0;
        while self.state != ChunkState::Done {
            let rest = &buf[pos..];
            let step = match self.state {
                ChunkState::Size => self.size_line(rest)?,
                ChunkState::Data(n) => self.data(rest, n),
                ChunkState::DataEnd => self.data_end(rest)?,
                ChunkState::Trailer => self.trailer_line(rest)?,
                ChunkState::Done => Advance::Wait,
            };
            match step {
                Advance::Used(n) => pos += n,
                Advance::Wait => break,
            }
        }
        Ok(pos)
    }

    /// Counts `n` bytes of framing against the body's allowance.
    fn framing(&mut self, n: usize) -> Result<(), ApiError> {
        self.framing_bytes += n;
        if self.framing_bytes > self.max_body.saturating_add(FRAMING_ALLOWANCE) {
            return Err(ApiError::body_too_large()
                .with_details("chunked framing far above the body it carries"));
        }
        Ok(())
    }

    /// A `size[;ext]` line: the next chunk's length, or 0 for the last.
    fn size_line(&mut self, rest: &[u8]) -> Result<Advance, ApiError> {
        let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
            if rest.len() >= MAX_CHUNK_LINE {
                return Err(malformed("chunk size line above 256 bytes"));
            }
            return Ok(Advance::Wait);
        };
        if nl + 1 > MAX_CHUNK_LINE {
            return Err(malformed("chunk size line above 256 bytes"));
        }
        // chunk-size = 1*HEXDIG (RFC 9112 section 7.1); httparse reads an
        // empty line as size 0, which would end the body.
        if !rest[0].is_ascii_hexdigit() {
            return Err(malformed("chunk size is not hex digits"));
        }
        let size = match httparse::parse_chunk_size(&rest[..=nl]) {
            Ok(httparse::Status::Complete((_, size))) => size,
            _ => return Err(malformed("invalid chunk size line")),
        };
        self.framing(nl + 1)?;
        if size == 0 {
            self.state = ChunkState::Trailer;
        } else {
            let size = usize::try_from(size).map_err(|_| ApiError::body_too_large())?;
            if self.body.len().saturating_add(size) > self.max_body {
                return Err(ApiError::body_too_large());
            }
            self.state = ChunkState::Data(size);
        }
        Ok(Advance::Used(nl + 1))
    }

    /// Up to `n` more bytes of a chunk's data.
    fn data(&mut self, rest: &[u8], n: usize) -> Advance {
        if rest.is_empty() {
            return Advance::Wait;
        }
        let take = n.min(rest.len());
        self.body.extend_from_slice(&rest[..take]);
        self.state = if take == n {
            ChunkState::DataEnd
        } else {
            ChunkState::Data(n - take)
        };
        Advance::Used(take)
    }

    /// The CRLF (or bare LF) after a chunk's data.
    fn data_end(&mut self, rest: &[u8]) -> Result<Advance, ApiError> {
        let used = if rest.starts_with(b"\r\n") {
            2
        } else if rest.starts_with(b"\n") {
            1
        } else if rest.is_empty() || rest == b"\r" {
            return Ok(Advance::Wait);
        } else {
            return Err(malformed("no CRLF after chunk data"));
        };
        self.framing(used)?;
        self.state = ChunkState::Size;
        Ok(Advance::Used(used))
    }

    /// One trailer line; an empty one ends the body. Trailers are read and
    /// dropped, their section capped like a head (431).
    fn trailer_line(&mut self, rest: &[u8]) -> Result<Advance, ApiError> {
        let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
            if self.trailer_bytes + rest.len() > self.max_trailers {
                return Err(ApiError::head_too_large());
            }
            return Ok(Advance::Wait);
        };
        self.trailer_bytes += nl + 1;
        if self.trailer_bytes > self.max_trailers {
            return Err(ApiError::head_too_large());
        }
        self.framing(nl + 1)?;
        let line = &rest[..nl];
        if line.is_empty() || line == b"\r" {
            self.state = ChunkState::Done;
        }
        Ok(Advance::Used(nl + 1))
    }

    /// Whether the terminating chunk and trailers have been read.
    pub fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// The decoded body.
    pub fn take_body(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.body)
    }
}
