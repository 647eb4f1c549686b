//! Reading a load stream (docs/API.md, "Load stream") from the socket straight into
//! where its blocks go: owned buffers, or the caller's memory.

use bytes::{Bytes, BytesMut};

use crate::ClientError;
use crate::conn::{Pool, Response};
use crate::wire::frame::{self, EndStatus, Frame, HEADER_LEN};

/// Largest block a client accepts in a load stream (a corrupt or hostile length must not
/// make it allocate without bound).
const MAX_BLOCK_BYTES: u64 = 1 << 32;

type Result<T> = std::result::Result<T, ClientError>;

/// Where block bytes go.
pub trait BlockSink: Send {
    /// The buffer block `index` of `len` bytes is read into.
    fn buffer(&mut self, index: u32, len: u64) -> Result<&mut [u8]>;
    /// The block read into the last buffer is complete.
    fn finish_block(&mut self);
}

/// Each block in a buffer of its own.
#[derive(Debug, Default)]
pub struct OwnedBlocks {
    current: BytesMut,
    /// The completed blocks.
    pub blocks: Vec<Bytes>,
}

impl BlockSink for OwnedBlocks {
    fn buffer(&mut self, _index: u32, len: u64) -> Result<&mut [u8]> {
        self.current = BytesMut::zeroed(len as usize);
        Ok(&mut self.current)
    }
    fn finish_block(&mut self) {
        self.blocks.push(std::mem::take(&mut self.current).freeze());
    }
}

/// Blocks one after another in the caller's memory.
#[derive(Debug)]
pub struct IntoSlice<'a> {
    dst: &'a mut [u8],
    at: usize,
    next: usize,
    /// Blocks completed.
    pub blocks: usize,
}

impl<'a> IntoSlice<'a> {
    /// Fills `dst` from its start.
    pub fn new(dst: &'a mut [u8]) -> Self {
        Self {
            dst,
            at: 0,
            next: 0,
            blocks: 0,
        }
    }
}

impl BlockSink for IntoSlice<'_> {
    fn buffer(&mut self, index: u32, len: u64) -> Result<&mut [u8]> {
        let room = (self.dst.len() - self.at) as u64;
        if len > room {
            return Err(ClientError::Protocol(format!(
                "block {index} of {len} bytes does not fit in the {room} bytes left of the destination"
            )));
        }
        let start = self.at;
        self.next = start + len as usize;
        Ok(&mut self.dst[start..self.next])
    }
    fn finish_block(&mut self) {
        self.at = self.next;
        self.blocks += 1;
    }
}

fn io(e: std::io::Error) -> ClientError {
    ClientError::Protocol(format!("load stream: {e}"))
}

/// Reads a whole load stream from `r` into `sink`; returns how it ended.
pub async fn read_stream(
    pool: &Pool,
    mut r: Response,
    sink: &mut dyn BlockSink,
) -> Result<EndStatus> {
    let mut h = [0u8; HEADER_LEN];
    let cut = |done: u32| {
        ClientError::Protocol(format!(
            "load stream cut off after {done} blocks, without its end frame"
        ))
    };
    Pool::read_exact(&mut r, &mut h).await.map_err(|_| cut(0))?;
    frame::parse_stream_header(&h).map_err(ClientError::Protocol)?;
    let mut done = 0u32;
    loop {
        Pool::read_exact(&mut r, &mut h)
            .await
            .map_err(|_| cut(done))?;
        match frame::parse_frame(&h).map_err(ClientError::Protocol)? {
            Frame::Block { index, len, .. } => {
                if index != done {
                    return Err(ClientError::Protocol(format!(
                        "block frame {index} where {done} was due"
                    )));
                }
                if len > MAX_BLOCK_BYTES {
                    return Err(ClientError::Protocol(format!("block of {len} bytes")));
                }
                let buf = sink.buffer(index, len)?;
                Pool::read_exact(&mut r, buf).await.map_err(|_| cut(done))?;
                sink.finish_block();
                done += 1;
            }
            Frame::End { sent, status } => {
                if sent != done {
                    return Err(ClientError::Protocol(format!(
                        "end frame counts {sent} blocks, {done} arrived"
                    )));
                }
                pool.done(r).await.map_err(io)?;
                return Ok(status);
            }
        }
    }
}
