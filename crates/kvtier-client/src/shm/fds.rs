//! Frames with file descriptors attached (`SCM_RIGHTS`): how the arena's and the staging
//! memory's files reach a client.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use super::proto::{self, Frame};

/// Descriptors one frame may carry.
const MAX_FDS: usize = 2;

/// Sends `frame` (encoded) with `fds` attached to its first byte.
pub fn send(socket: &mut UnixStream, frame: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if fds.len() > MAX_FDS || !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(std::io::Error::other("too many descriptors for one frame"));
    }
    let sent = rustix::net::sendmsg(
        &*socket,
        &[IoSlice::new(frame)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    socket.write_all(&frame[sent..])
}

/// Receives a frame and the descriptors attached to it (closed on exec). `Ok(None)` at a
/// clean end of the stream.
pub fn recv(socket: &mut UnixStream) -> std::io::Result<Option<(Frame, Vec<OwnedFd>)>> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut first = [0u8; 4096];
    let got = rustix::net::recvmsg(
        &*socket,
        &mut [IoSliceMut::new(&mut first)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    if got.bytes == 0 {
        return Ok(None);
    }
    let mut rest = (&first[..got.bytes]).chain(socket);
    Ok(proto::read(&mut rest)?.map(|f| (f, fds)))
}
