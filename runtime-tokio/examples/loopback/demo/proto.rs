//! The wire protocol: length-prefixed frames over TCP.
//!
//! ```text
//! frame    = len:u32be body[len]
//! request  = req_id:u64 kind:u8 payload
//!   WRITE    bucket:u32 n:u32 n × (write_id:u64 len:u32 value[len])
//!   READ     shard:u32 n:u32 n × key:u64
//!   ADMIN    op_id:u64
//!   METADATA (empty)                       -> OK leader_port:u16
//! response = req_id:u64 status:u8 payload
//!   OK       WRITE: pressure_ppm:u32 | READ: n × value:u64 | ADMIN: - | METADATA: port:u16
//! ```
//!
//! Requests are pipelined on a connection and matched to responses by `req_id`.

use std::io;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest frame either side accepts (a bogus length never allocates more).
pub const MAX_FRAME: usize = 8 << 20;
/// Bytes before a request's kind: length prefix and request id.
pub const HEADER: usize = 4 + 8;

pub const WRITE: u8 = 1;
pub const READ: u8 = 2;
pub const ADMIN: u8 = 3;
pub const METADATA: u8 = 4;

/// Response statuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// The tablet server's disk protection refused the write before executing it.
    DiskWriteLocked,
    /// L0 reached the slowdown trigger; refused before executing.
    StorageBackpressure,
    /// This coordinator is not the leader; refused before executing.
    NotLeader,
    BadRequest,
}

impl Status {
    fn code(self) -> u8 {
        match self {
            Status::Ok => 0,
            Status::DiskWriteLocked => 1,
            Status::StorageBackpressure => 2,
            Status::NotLeader => 3,
            Status::BadRequest => 4,
        }
    }
    fn from_code(c: u8) -> Option<Status> {
        Some(match c {
            0 => Status::Ok,
            1 => Status::DiskWriteLocked,
            2 => Status::StorageBackpressure,
            3 => Status::NotLeader,
            4 => Status::BadRequest,
            _ => return None,
        })
    }
}

/// Reads one frame body; `Ok(None)` on a clean end of stream.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "frame too large",
        ));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    Ok(Some(body))
}

/// Writes a frame built with a [`HEADER`]-byte prefix reserved (see [`Request::new`]).
pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, frame: &[u8]) -> io::Result<()> {
    w.write_all(frame).await
}

/// A request being encoded; the length prefix and id are filled in by [`Request::finish`].
#[derive(Debug)]
pub struct Request(Vec<u8>);

impl Request {
    pub fn new(kind: u8, capacity: usize) -> Self {
        let mut v = Vec::with_capacity(HEADER + 1 + capacity);
        v.extend_from_slice(&[0u8; HEADER]);
        v.push(kind);
        Request(v)
    }
    /// The request's payload: what follows the length prefix, request id and kind.
    pub fn payload(&self) -> &[u8] {
        self.0.get(HEADER + 1..).unwrap_or(&[])
    }
    pub fn write(bucket: u32, writes: &[(u64, u32)]) -> Self {
        let payload: usize = writes.iter().map(|&(_, len)| 12 + len as usize).sum();
        let mut r = Request::new(WRITE, 8 + payload);
        r.u32(bucket).u32(writes.len() as u32);
        for &(id, len) in writes {
            r.u64(id).u32(len);
            r.0.resize(r.0.len() + len as usize, 0xAB);
        }
        r
    }
    pub fn read(shard: u32, keys: &[u64]) -> Self {
        let mut r = Request::new(READ, 8 + 8 * keys.len());
        r.u32(shard).u32(keys.len() as u32);
        for &k in keys {
            r.u64(k);
        }
        r
    }
    pub fn admin(op_id: u64) -> Self {
        let mut r = Request::new(ADMIN, 8);
        r.u64(op_id);
        r
    }
    pub fn metadata() -> Self {
        Request::new(METADATA, 0)
    }
    fn u32(&mut self, x: u32) -> &mut Self {
        self.0.extend_from_slice(&x.to_be_bytes());
        self
    }
    fn u64(&mut self, x: u64) -> &mut Self {
        self.0.extend_from_slice(&x.to_be_bytes());
        self
    }
    /// The complete frame with `req_id`.
    pub fn finish(mut self, req_id: u64) -> Vec<u8> {
        let len = (self.0.len() - 4) as u32;
        self.0[..4].copy_from_slice(&len.to_be_bytes());
        self.0[4..12].copy_from_slice(&req_id.to_be_bytes());
        self.0
    }
}

/// A bounds-checked reader over a frame body: every getter is `None` past the end.
#[derive(Debug)]
pub struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8]) -> Self {
        Reader(b)
    }
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }
    pub fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    pub fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    pub fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub fn u64(&mut self) -> Option<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Some(u64::from_be_bytes(a))
    }
}

/// A response frame (with its length prefix) for `req_id`.
pub fn response(req_id: u64, status: Status, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + 9 + payload.len());
    v.extend_from_slice(&((9 + payload.len()) as u32).to_be_bytes());
    v.extend_from_slice(&req_id.to_be_bytes());
    v.push(status.code());
    v.extend_from_slice(payload);
    v
}

/// Splits a response body into its id, status and payload.
pub fn parse_response(body: &[u8]) -> Option<(u64, Status, &[u8])> {
    let mut r = Reader::new(body);
    let id = r.u64()?;
    let status = Status::from_code(r.u8()?)?;
    Some((id, status, r.0))
}
