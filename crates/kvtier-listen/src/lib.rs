//! The HTTP edge of kvtier's two front ends — `kvtier serve` (crates/kvtier-server) and
//! `kvtier gateway` (crates/kvtier-gateway) — written once:
//!
//! - [`http`]: the listener both serve through (connection cap, header, body and idle
//!   timeouts, lingering close), with one [`http::ListenSettings`] and a [`http::Handler`]
//!   each front end implements;
//! - [`refusals`]: refused requests and connections logged rate-limited and counted by
//!   kind;
//! - [`fds`]: at start, the soft open-file limit is raised to the hard one and the
//!   connection cap is clamped to what the limit leaves, so idle sockets meet the cap
//!   (which closes the longest-idle connection) before they meet `EMFILE` (which would
//!   stall every accept, legitimate clients' included);
//! - [`accept`]: what an accept loop does when `accept` fails;
//! - [`linger`]: closing a connection after an answer without the kernel turning the
//!   close into a reset that destroys the answer;
//! - [`signals`]: SIGTERM and SIGINT watched from the start, so either is a clean stop;
//! - [`MAX_HEAD`]: the largest request head either front end reads.

pub mod accept;
pub mod fds;
pub mod http;
pub mod linger;
pub mod refusals;
pub mod signals;

/// The largest request head (request line and headers) read, in bytes: a longer one is
/// answered 431 (Request Header Fields Too Large) by the HTTP layer and the connection
/// closed. kvtier's clients send a few hundred bytes of head; S3 SDKs a few KiB (S3 itself
/// refuses heads over 8 KiB); the longest legitimate head is a `/v1/store/raw` query
/// carrying a prompt's tokens, about 6 bytes a token. Without this bound the head is
/// bounded only by hyper's read buffer (about 400 KiB), and a head below that is read
/// and served whatever its size.
pub const MAX_HEAD: usize = 64 << 10;
