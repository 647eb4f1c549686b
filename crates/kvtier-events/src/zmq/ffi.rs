//! The part of libzmq's C API (`zmq.h`, 4.3) kvtier calls, declared by hand: a dozen
//! functions and the constants they take. libzmq is built from source with CURVE (see
//! `build.rs`); the numbers below are `zmq.h`'s.

use std::ffi::{c_char, c_int, c_long, c_short, c_void};

// Socket types.
pub const ZMQ_SUB: c_int = 2;
pub const ZMQ_REP: c_int = 4;
pub const ZMQ_ROUTER: c_int = 6;
pub const ZMQ_XPUB: c_int = 9;

// Socket options.
pub const ZMQ_SUBSCRIBE: c_int = 6;
pub const ZMQ_LINGER: c_int = 17;
pub const ZMQ_SNDHWM: c_int = 23;
pub const ZMQ_RCVTIMEO: c_int = 27;
pub const ZMQ_LAST_ENDPOINT: c_int = 32;
pub const ZMQ_ROUTER_MANDATORY: c_int = 33;
pub const ZMQ_XPUB_VERBOSE: c_int = 40;
pub const ZMQ_CURVE_SERVER: c_int = 47;
pub const ZMQ_CURVE_PUBLICKEY: c_int = 48;
pub const ZMQ_CURVE_SECRETKEY: c_int = 49;
pub const ZMQ_CURVE_SERVERKEY: c_int = 50;
pub const ZMQ_ZAP_DOMAIN: c_int = 55;
/// Draft API (libzmq is built with it): a server with a ZAP domain and no ZAP handler
/// refuses every handshake instead of letting it through.
pub const ZMQ_ZAP_ENFORCE_DOMAIN: c_int = 93;

// Send and receive flags.
pub const ZMQ_DONTWAIT: c_int = 1;
pub const ZMQ_SNDMORE: c_int = 2;

// Poll events.
pub const ZMQ_POLLIN: c_short = 1;

// Errors: the platform's where it has them (EAGAIN), libzmq's own above its base.
pub const EAGAIN: c_int = libc::EAGAIN;
const ZMQ_HAUSNUMERO: c_int = 156_384_712;
pub const ETERM: c_int = ZMQ_HAUSNUMERO + 53;

/// `zmq_msg_t`: 64 opaque bytes, pointer-aligned.
#[repr(C, align(8))]
pub struct ZmqMsg {
    _opaque: [u8; 64],
}

impl ZmqMsg {
    /// Storage for `zmq_msg_init` to fill.
    pub fn zeroed() -> Self {
        Self { _opaque: [0; 64] }
    }
}

/// `zmq_pollitem_t`.
#[repr(C)]
pub struct PollItem {
    pub socket: *mut c_void,
    pub fd: c_int,
    pub events: c_short,
    pub revents: c_short,
}

unsafe extern "C" {
    pub fn zmq_errno() -> c_int;
    pub fn zmq_strerror(errnum: c_int) -> *const c_char;
    pub fn zmq_has(capability: *const c_char) -> c_int;

    pub fn zmq_ctx_new() -> *mut c_void;
    pub fn zmq_ctx_term(context: *mut c_void) -> c_int;

    pub fn zmq_socket(context: *mut c_void, kind: c_int) -> *mut c_void;
    pub fn zmq_close(socket: *mut c_void) -> c_int;
    pub fn zmq_setsockopt(
        socket: *mut c_void,
        option: c_int,
        value: *const c_void,
        len: usize,
    ) -> c_int;
    pub fn zmq_getsockopt(
        socket: *mut c_void,
        option: c_int,
        value: *mut c_void,
        len: *mut usize,
    ) -> c_int;
    pub fn zmq_bind(socket: *mut c_void, endpoint: *const c_char) -> c_int;
    pub fn zmq_connect(socket: *mut c_void, endpoint: *const c_char) -> c_int;
    pub fn zmq_send(socket: *mut c_void, buf: *const c_void, len: usize, flags: c_int) -> c_int;
    pub fn zmq_poll(items: *mut PollItem, count: c_int, timeout_ms: c_long) -> c_int;

    pub fn zmq_msg_init(msg: *mut ZmqMsg) -> c_int;
    pub fn zmq_msg_recv(msg: *mut ZmqMsg, socket: *mut c_void, flags: c_int) -> c_int;
    pub fn zmq_msg_close(msg: *mut ZmqMsg) -> c_int;
    pub fn zmq_msg_data(msg: *mut ZmqMsg) -> *mut c_void;
    pub fn zmq_msg_size(msg: *const ZmqMsg) -> usize;
    pub fn zmq_msg_more(msg: *const ZmqMsg) -> c_int;

    pub fn zmq_z85_encode(dest: *mut c_char, data: *const u8, size: usize) -> *mut c_char;
    pub fn zmq_z85_decode(dest: *mut u8, string: *const c_char) -> *mut u8;
    pub fn zmq_curve_keypair(z85_public: *mut c_char, z85_secret: *mut c_char) -> c_int;
    pub fn zmq_curve_public(z85_public: *mut c_char, z85_secret: *const c_char) -> c_int;
}
