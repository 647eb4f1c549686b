//! A small safe face over libzmq: a context, sockets, multipart send and receive, a poll,
//! and CURVE keys. kvtier's own (not the `zmq` crate), because that crate's libzmq is
//! built without CURVE, which private KV events need (docs/adr/0020-trust.md).
//!
//! The one place in kvtier that calls C: every `unsafe` here is a libzmq call with
//! pointers that live across it (a socket or context this module owns, a buffer of the
//! size passed), as `zmq.h` asks.
#![allow(
    unsafe_code,
    reason = "the FFI boundary to libzmq; each call's pointers are owned here and outlive it"
)]

mod ffi;

use std::ffi::{CStr, CString, c_int, c_void};
use std::fmt;
use std::sync::Arc;

/// A SUB socket: receives what a PUB or XPUB sends, for its subscriptions.
pub const SUB: c_int = ffi::ZMQ_SUB;
/// A REP socket: answers requests one at a time.
pub const REP: c_int = ffi::ZMQ_REP;
/// A ROUTER socket: messages carry the peer's routing id first.
pub const ROUTER: c_int = ffi::ZMQ_ROUTER;
/// An XPUB socket: a PUB that hands subscriptions up.
pub const XPUB: c_int = ffi::ZMQ_XPUB;

/// A libzmq error: its errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZmqError(pub c_int);

impl ZmqError {
    fn last() -> Self {
        Self(unsafe { ffi::zmq_errno() })
    }

    /// Nothing to receive (or no room to send) without waiting.
    pub fn would_block(self) -> bool {
        self.0 == ffi::EAGAIN
    }

    /// The context is shutting down.
    pub fn terminated(self) -> bool {
        self.0 == ffi::ETERM
    }
}

impl fmt::Display for ZmqError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // libzmq's messages are static strings.
        let text = unsafe { CStr::from_ptr(ffi::zmq_strerror(self.0)) };
        write!(f, "{} (errno {})", text.to_string_lossy(), self.0)
    }
}

impl std::error::Error for ZmqError {}

/// A result of a libzmq call.
pub type ZmqResult<T> = Result<T, ZmqError>;

fn check(rc: c_int) -> ZmqResult<c_int> {
    if rc < 0 {
        Err(ZmqError::last())
    } else {
        Ok(rc)
    }
}

/// Whether this libzmq has `capability` (`"curve"`, `"draft"`, …).
pub fn has(capability: &str) -> bool {
    let Ok(c) = CString::new(capability) else {
        return false;
    };
    unsafe { ffi::zmq_has(c.as_ptr()) == 1 }
}

struct ContextHandle(*mut c_void);

// libzmq contexts are thread-safe.
unsafe impl Send for ContextHandle {}
unsafe impl Sync for ContextHandle {}

impl Drop for ContextHandle {
    fn drop(&mut self) {
        // Every socket holds the context, so none is open now: this returns at once.
        unsafe { while ffi::zmq_ctx_term(self.0) != 0 && ffi::zmq_errno() == libc::EINTR {} }
    }
}

/// A libzmq context; its sockets keep it alive.
#[derive(Clone)]
pub struct Context(Arc<ContextHandle>);

impl Context {
    /// A new context.
    pub fn new() -> ZmqResult<Self> {
        let ctx = unsafe { ffi::zmq_ctx_new() };
        if ctx.is_null() {
            return Err(ZmqError::last());
        }
        Ok(Self(Arc::new(ContextHandle(ctx))))
    }

    /// A socket of `kind` ([`XPUB`], [`ROUTER`], …). Its linger is 0 unless set.
    pub fn socket(&self, kind: c_int) -> ZmqResult<Socket> {
        let raw = unsafe { ffi::zmq_socket(self.0.0, kind) };
        if raw.is_null() {
            return Err(ZmqError::last());
        }
        let socket = Socket {
            raw,
            _context: self.clone(),
        };
        socket.set_int(ffi::ZMQ_LINGER, 0)?;
        Ok(socket)
    }
}

/// A libzmq socket. Used by one thread at a time (libzmq sockets are not thread-safe; a
/// socket may move between threads).
pub struct Socket {
    raw: *mut c_void,
    // Dropped after the socket is closed (fields drop after `drop` runs).
    _context: Context,
}

unsafe impl Send for Socket {}

impl Drop for Socket {
    fn drop(&mut self) {
        unsafe {
            ffi::zmq_close(self.raw);
        }
    }
}

impl Socket {
    fn set_bytes(&self, option: c_int, value: &[u8]) -> ZmqResult<()> {
        check(unsafe { ffi::zmq_setsockopt(self.raw, option, value.as_ptr().cast(), value.len()) })
            .map(drop)
    }

    fn set_int(&self, option: c_int, value: c_int) -> ZmqResult<()> {
        self.set_bytes(option, &value.to_ne_bytes())
    }

    /// Messages queued per peer before sending drops (PUB) or fails (ROUTER).
    pub fn set_sndhwm(&self, messages: i32) -> ZmqResult<()> {
        self.set_int(ffi::ZMQ_SNDHWM, messages)
    }

    /// How long closing waits to send what is queued, in milliseconds.
    pub fn set_linger(&self, ms: i32) -> ZmqResult<()> {
        self.set_int(ffi::ZMQ_LINGER, ms)
    }

    /// XPUB: hand up every subscription, repeated ones too.
    pub fn set_xpub_verbose(&self, on: bool) -> ZmqResult<()> {
        self.set_int(ffi::ZMQ_XPUB_VERBOSE, c_int::from(on))
    }

    /// ROUTER: a message to a peer that is gone is an error, not a silent drop.
    pub fn set_router_mandatory(&self, on: bool) -> ZmqResult<()> {
        self.set_int(ffi::ZMQ_ROUTER_MANDATORY, c_int::from(on))
    }

    /// How long a blocking receive waits, in milliseconds (-1: forever).
    pub fn set_rcvtimeo(&self, ms: i32) -> ZmqResult<()> {
        self.set_int(ffi::ZMQ_RCVTIMEO, ms)
    }

    /// SUB: receive messages whose topic begins with `prefix`.
    pub fn subscribe(&self, prefix: &[u8]) -> ZmqResult<()> {
        self.set_bytes(ffi::ZMQ_SUBSCRIBE, prefix)
    }

    /// Makes this socket a CURVE server with `secret` (32 bytes), every client
    /// authenticated by the ZAP handler of `zap_domain` — and refused when no handler
    /// answers (set before binding or connecting).
    pub fn set_curve_server(&self, secret: &[u8; 32], zap_domain: &str) -> ZmqResult<()> {
        self.set_int(ffi::ZMQ_CURVE_SERVER, 1)?;
        self.set_bytes(ffi::ZMQ_CURVE_SECRETKEY, secret)?;
        self.set_bytes(ffi::ZMQ_ZAP_DOMAIN, zap_domain.as_bytes())?;
        self.set_int(ffi::ZMQ_ZAP_ENFORCE_DOMAIN, 1)
    }

    /// Makes this socket a CURVE client of the server whose public key is `server`, with
    /// its own key pair (set before connecting).
    pub fn set_curve_client(&self, server: &[u8; 32], keys: &CurveKeyPair) -> ZmqResult<()> {
        self.set_bytes(ffi::ZMQ_CURVE_SERVERKEY, server)?;
        self.set_bytes(ffi::ZMQ_CURVE_PUBLICKEY, &keys.public)?;
        self.set_bytes(ffi::ZMQ_CURVE_SECRETKEY, &keys.secret)
    }

    /// Binds to `endpoint`.
    pub fn bind(&self, endpoint: &str) -> ZmqResult<()> {
        let c = CString::new(endpoint).map_err(|_| ZmqError(libc::EINVAL))?;
        check(unsafe { ffi::zmq_bind(self.raw, c.as_ptr()) }).map(drop)
    }

    /// Connects to `endpoint`.
    pub fn connect(&self, endpoint: &str) -> ZmqResult<()> {
        let c = CString::new(endpoint).map_err(|_| ZmqError(libc::EINVAL))?;
        check(unsafe { ffi::zmq_connect(self.raw, c.as_ptr()) }).map(drop)
    }

    /// Where the socket was last bound, a port of 0 or `*` filled in.
    pub fn last_endpoint(&self) -> ZmqResult<String> {
        let mut buf = [0u8; 512];
        let mut len = buf.len();
        check(unsafe {
            ffi::zmq_getsockopt(
                self.raw,
                ffi::ZMQ_LAST_ENDPOINT,
                buf.as_mut_ptr().cast(),
                &raw mut len,
            )
        })?;
        let text = &buf[..len.min(buf.len())];
        let text = text.split(|b| *b == 0).next().unwrap_or(&[]);
        Ok(String::from_utf8_lossy(text).into_owned())
    }

    /// Sends the frames of one message (`dontwait`: fail with EAGAIN instead of waiting).
    pub fn send_multipart<'a>(
        &self,
        frames: impl IntoIterator<Item = &'a [u8]>,
        dontwait: bool,
    ) -> ZmqResult<()> {
        let mut frames = frames.into_iter().peekable();
        let base = if dontwait { ffi::ZMQ_DONTWAIT } else { 0 };
        while let Some(frame) = frames.next() {
            let more = if frames.peek().is_some() {
                ffi::ZMQ_SNDMORE
            } else {
                0
            };
            check(unsafe {
                ffi::zmq_send(self.raw, frame.as_ptr().cast(), frame.len(), base | more)
            })?;
        }
        Ok(())
    }

    /// Receives the frames of one message (`dontwait`: EAGAIN when none is waiting).
    pub fn recv_multipart(&self, dontwait: bool) -> ZmqResult<Vec<Vec<u8>>> {
        let flags = if dontwait { ffi::ZMQ_DONTWAIT } else { 0 };
        let mut frames = Vec::new();
        loop {
            let mut msg = ffi::ZmqMsg::zeroed();
            check(unsafe { ffi::zmq_msg_init(&raw mut msg) })?;
            let got = check(unsafe { ffi::zmq_msg_recv(&raw mut msg, self.raw, flags) });
            let frame = got.map(|_| unsafe {
                let len = ffi::zmq_msg_size(&raw const msg);
                let data = ffi::zmq_msg_data(&raw mut msg).cast::<u8>();
                let bytes = if len == 0 {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(data, len).to_vec()
                };
                (bytes, ffi::zmq_msg_more(&raw const msg) == 1)
            });
            unsafe {
                ffi::zmq_msg_close(&raw mut msg);
            }
            let (bytes, more) = frame?;
            frames.push(bytes);
            // The rest of a message arrives with its first frame: the next receive of a
            // frame that is `more` never waits.
            if !more {
                return Ok(frames);
            }
        }
    }

    /// Whether a message is waiting, after waiting at most `timeout_ms` (0: not at all).
    pub fn readable(&self, timeout_ms: i64) -> ZmqResult<bool> {
        let mut item = ffi::PollItem {
            socket: self.raw,
            fd: 0,
            events: ffi::ZMQ_POLLIN,
            revents: 0,
        };
        let n = check(unsafe { ffi::zmq_poll(&raw mut item, 1, timeout_ms as _) })?;
        Ok(n > 0 && item.revents & ffi::ZMQ_POLLIN != 0)
    }
}

/// A CURVE key pair (raw 32-byte keys).
#[derive(Clone, PartialEq, Eq)]
pub struct CurveKeyPair {
    /// The public key.
    pub public: [u8; 32],
    /// The secret key.
    pub secret: [u8; 32],
}

impl fmt::Debug for CurveKeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CurveKeyPair")
            .field("public", &z85_encode(&self.public))
            .finish_non_exhaustive()
    }
}

impl CurveKeyPair {
    /// A new random key pair.
    pub fn generate() -> ZmqResult<Self> {
        let mut public = [0 as std::ffi::c_char; 41];
        let mut secret = [0 as std::ffi::c_char; 41];
        check(unsafe { ffi::zmq_curve_keypair(public.as_mut_ptr(), secret.as_mut_ptr()) })?;
        let text = |k: &[std::ffi::c_char; 41]| unsafe { CStr::from_ptr(k.as_ptr()) }.to_owned();
        let (public, secret) = (text(&public), text(&secret));
        match (
            z85_decode_key(&public.to_string_lossy()),
            z85_decode_key(&secret.to_string_lossy()),
        ) {
            (Some(public), Some(secret)) => Ok(Self { public, secret }),
            _ => Err(ZmqError(libc::EINVAL)),
        }
    }

    /// The key pair of a secret key (the public key derived from it).
    pub fn from_secret(secret: [u8; 32]) -> ZmqResult<Self> {
        let z85 = CString::new(z85_encode(&secret)).map_err(|_| ZmqError(libc::EINVAL))?;
        let mut public = [0 as std::ffi::c_char; 41];
        check(unsafe { ffi::zmq_curve_public(public.as_mut_ptr(), z85.as_ptr()) })?;
        let public = unsafe { CStr::from_ptr(public.as_ptr()) }.to_string_lossy();
        let public = z85_decode_key(&public).ok_or(ZmqError(libc::EINVAL))?;
        Ok(Self { public, secret })
    }
}

/// Z85 text of `data` (a multiple of 4 bytes: a key is 32, its text 40 characters).
pub fn z85_encode(data: &[u8]) -> String {
    let mut out = vec![0 as std::ffi::c_char; data.len() / 4 * 5 + 1];
    let done = unsafe { ffi::zmq_z85_encode(out.as_mut_ptr(), data.as_ptr(), data.len()) };
    if done.is_null() {
        return String::new();
    }
    unsafe { CStr::from_ptr(out.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// A 32-byte key from its 40 characters of Z85, or `None`.
pub fn z85_decode_key(text: &str) -> Option<[u8; 32]> {
    if text.len() != 40 {
        return None;
    }
    let c = CString::new(text).ok()?;
    let mut key = [0u8; 32];
    let done = unsafe { ffi::zmq_z85_decode(key.as_mut_ptr(), c.as_ptr()) };
    (!done.is_null()).then_some(key)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    #[test]
    fn this_libzmq_has_curve_and_keys_round_trip_through_z85() {
        assert!(has("curve"), "libzmq was built without CURVE");
        let pair = CurveKeyPair::generate().unwrap();
        let text = z85_encode(&pair.public);
        assert_eq!(text.len(), 40);
        assert_eq!(z85_decode_key(&text), Some(pair.public));
        assert_eq!(CurveKeyPair::from_secret(pair.secret).unwrap(), pair);
        assert_eq!(z85_decode_key("too short"), None);
    }

    #[test]
    fn frames_of_a_message_arrive_together_and_subscriptions_are_handed_up() {
        let ctx = Context::new().unwrap();
        let publisher = ctx.socket(XPUB).unwrap();
        publisher.bind("inproc://frames").unwrap();
        let sub = ctx.socket(SUB).unwrap();
        sub.connect("inproc://frames").unwrap();
        sub.subscribe(b"").unwrap();
        // The subscription reaches the XPUB as one frame: 1, then the (empty) prefix.
        assert!(publisher.readable(5000).unwrap());
        assert_eq!(publisher.recv_multipart(true).unwrap(), vec![vec![1u8]]);
        let frames: [&[u8]; 3] = [b"topic", b"", b"payload"];
        publisher.send_multipart(frames, false).unwrap();
        assert!(sub.readable(5000).unwrap());
        assert_eq!(
            sub.recv_multipart(false).unwrap(),
            vec![b"topic".to_vec(), Vec::new(), b"payload".to_vec()]
        );
        assert!(!sub.readable(0).unwrap());
        assert!(sub.recv_multipart(true).unwrap_err().would_block());
    }
}
