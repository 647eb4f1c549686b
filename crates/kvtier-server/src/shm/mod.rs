//! The shared arena's socket (docs/adr/0019-shared-arena.md): with `shm.enabled`, the RAM
//! tier's arena is a sealed memory file, and local clients reach it through a Unix socket
//! beside the HTTP port. Each client gets the arena (read-only) and a staging memory of its
//! own (read-write) by descriptor passing, leases blocks to read in place, and stores by
//! writing into staging memory and committing: the server copies every committed block
//! into the arena and checks it. Lookups and everything else stay on HTTP.
//!
//! One thread accepts; each client is served on a thread of its own (local engines are
//! few, and every request is a short memory operation or a copy).

mod pages;
mod session;
mod staging;
mod stats;

pub use stats::{SHM, ShmStats};

use std::collections::HashMap;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use kvtier_client::shm::proto;
use kvtier_client::wire::ErrorDetail;
use kvtier_core::{Error, ErrorKind};
use parking_lot::Mutex;

use crate::state::AppState;
use session::{Limits, Session};

#[derive(Default)]
struct Clients {
    /// Each connected client's socket, to shut down when the server stops.
    sockets: HashMap<u32, UnixStream>,
    threads: Vec<JoinHandle<()>>,
}

/// The socket and its clients, until [`ShmService::stop`] (or drop).
pub struct ShmService {
    path: PathBuf,
    stopping: Arc<AtomicBool>,
    clients: Arc<Mutex<Clients>>,
    accept: Option<JoinHandle<()>>,
    page_note: Option<String>,
}

impl ShmService {
    /// Listens on the configured socket when the shared arena is on (`None` when off).
    /// A socket file left by a server that is gone is replaced; one a live server answers
    /// on, or a path that is not a socket, is an error.
    pub fn start(app: Arc<AppState>) -> Result<Option<Self>, Error> {
        let (path, mode, max_clients, limits, page_note) = {
            let s = app.node.settings.read();
            if !s.shm.enabled {
                return Ok(None);
            }
            let limits = Limits {
                staging: s.shm.staging.0,
                reserve_ttl: s.shm.reserve_ttl.0,
                max_leased: s.shm_max_leased(),
                max_tokens: s.max_tokens,
            };
            let note = pages::small_pages_note(s.shm.huge_pages);
            (
                s.shm_socket(),
                s.shm.socket_mode,
                s.shm.max_clients,
                limits,
                note,
            )
        };
        let listener = bind(&path, mode)?;
        let stopping = Arc::new(AtomicBool::new(false));
        let clients = Arc::new(Mutex::new(Clients::default()));
        let accept = {
            let (stopping, clients) = (stopping.clone(), clients.clone());
            std::thread::Builder::new()
                .name("kvtier-shm".into())
                .spawn(move || {
                    accept_loop(&listener, &app, &stopping, &clients, max_clients, limits)
                })
                .map_err(|e| {
                    Error::new(
                        ErrorKind::Unavailable,
                        "cannot start the shared arena's thread",
                    )
                    .with_source(e)
                })?
        };
        tracing::info!(socket = %path.display(), "shared arena: local clients connect here");
        Ok(Some(Self {
            path,
            stopping,
            clients,
            accept: Some(accept),
            page_note,
        }))
    }

    /// A note for the operator when local clients will map the arena in 4 KiB pages (see
    /// `pages.rs`).
    pub fn page_note(&self) -> Option<&str> {
        self.page_note.as_deref()
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops accepting, disconnects every client (their leases and reservations end) and
    /// removes the socket file.
    pub fn stop(mut self) {
        self.shut();
    }

    fn shut(&mut self) {
        let Some(accept) = self.accept.take() else {
            return;
        };
        self.stopping.store(true, Ordering::SeqCst);
        // Wake the accepting thread with a connection of our own.
        let _ = UnixStream::connect(&self.path);
        let _ = accept.join();
        let threads = {
            let mut c = self.clients.lock();
            for s in c.sockets.values() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            std::mem::take(&mut c.threads)
        };
        for t in threads {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for ShmService {
    fn drop(&mut self) {
        self.shut();
    }
}

fn bind(path: &Path, mode: u32) -> Result<UnixListener, Error> {
    let cannot = |what: String| {
        move |e: std::io::Error| Error::new(ErrorKind::Unavailable, what).with_source(e)
    };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(Error::invalid(format!(
                "shm.socket {} exists and is not a socket",
                path.display()
            )));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("another server answers on {} (shm.socket)", path.display()),
            ));
        }
        std::fs::remove_file(path).map_err(cannot(format!(
            "cannot remove the stale socket {}",
            path.display()
        )))?;
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(cannot(format!("cannot create {}", dir.display())))?;
    }
    let listener =
        UnixListener::bind(path).map_err(cannot(format!("cannot listen on {}", path.display())))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(cannot(format!("cannot set the mode of {}", path.display())))?;
    Ok(listener)
}

fn accept_loop(
    listener: &UnixListener,
    app: &Arc<AppState>,
    stopping: &AtomicBool,
    clients: &Arc<Mutex<Clients>>,
    max_clients: usize,
    limits: Limits,
) {
    let mut next_id = 0u32;
    for conn in listener.incoming() {
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut socket) = conn else { continue };
        let mut c = clients.lock();
        c.threads.retain(|t| !t.is_finished());
        if c.sockets.len() >= max_clients {
            let e = ErrorDetail {
                code: "unavailable".into(),
                message: format!("{max_clients} clients are connected (shm.max_clients)"),
            };
            let _ = std::io::Write::write_all(&mut socket, &proto::encode(proto::ERROR, &e, b""));
            continue;
        }
        next_id = next_id.wrapping_add(1);
        let id = next_id;
        let Ok(kept) = socket.try_clone() else {
            continue;
        };
        c.sockets.insert(id, kept);
        let session = Session::new(id, app.clone(), limits);
        let gone = clients.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("kvtier-shm-{id}"))
            .spawn(move || {
                session.run(socket);
                gone.lock().sockets.remove(&id);
            });
        match spawned {
            Ok(t) => c.threads.push(t),
            Err(e) => {
                tracing::warn!(error = %e, "shared arena: no thread for a client");
                c.sockets.remove(&id);
            }
        }
    }
}
