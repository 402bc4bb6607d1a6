//! What wconfd and luxid share at their edges: their directories, their own
//! livelock, their socket, who may connect, and writing replies out. One
//! way to do each, so the two daemons cannot drift apart.

use std::fs::{self, DirBuilder};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use mio::net::{UnixListener, UnixStream};
use mio::{Interest, Registry, Token};

use crate::limits::{CONNECTION_BUFFER_RETAINED_BYTES_MAX, RELEASE_MEMORY_AFTER_ANSWER_BYTES};
use crate::liveness::{self, Livelock};
use crate::protocol::{WireError, encode_failure};
use crate::sys::{self, PeerCredentials};

/// Why a daemon cannot start or must stop: the one error type of wconfd
/// and luxid (each uses the variants that concern it).
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Settings(#[from] crate::settings::SettingsError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Queue(#[from] crate::queue::QueueError),
    #[error("another {daemon} is running on {root} (it holds {lock})")]
    AlreadyRunning {
        daemon: &'static str,
        root: PathBuf,
        lock: PathBuf,
    },
    #[error("wconfd must run on the same root first: {0}")]
    NoWconfd(crate::client::ClientError),
    /// The event sequence cannot be opened (damaged, or unreadable).
    #[error("the event sequence: {0}")]
    Events(#[from] crate::events::EventsError),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// wconfd's lock state in memory is ahead of the disk (D8): wconfd
    /// stops, and a restart loads everything it ever acknowledged.
    #[error(
        "the lock state could not be made durable in {path}: {source}; wconfd stops (a restart loads every change it acknowledged)"
    )]
    Journal { path: PathBuf, source: io::Error },
}

/// An I/O failure of `what` on `path`, as a [`DaemonError`].
pub fn io_error<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> DaemonError + 'a {
    move |source| DaemonError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}

/// Waits for events of `poll` until `timeout`; a signal's interruption is
/// a wake-up with no events.
pub fn wait_for_events(
    poll: &mut mio::Poll,
    events: &mut mio::Events,
    timeout: Option<std::time::Duration>,
) -> Result<(), DaemonError> {
    match poll.poll(events, timeout) {
        Err(error) if error.kind() == io::ErrorKind::Interrupted => {
            events.clear();
            Ok(())
        }
        result => result.map_err(io_error("cannot poll", Path::new("epoll"))),
    }
}

/// Creates a directory with `mode` unless it exists.
pub fn make_dir(path: &Path, mode: u32) -> io::Result<()> {
    match DirBuilder::new().mode(mode).create(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
        Err(error) => Err(error),
    }
}

/// The daemon's own livelock, `<daemon>_<unix secs>` (LIVENESS.md
/// "Livelock files").
pub fn daemon_livelock(livelock_dir: &Path, daemon: &str) -> io::Result<Livelock> {
    let started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs())
        .unwrap_or(0);
    Livelock::create(
        livelock_dir,
        &liveness::daemon_livelock_name(daemon, started),
    )
}

/// Binds the daemon's socket at `path`, mode 0660. A socket already there
/// is stale (the caller holds the daemon's instance lock) and replaced;
/// anything else there is an error.
pub fn bind_socket(path: &Path) -> io::Result<UnixListener> {
    if let Ok(metadata) = fs::symlink_metadata(path)
        && metadata.file_type().is_socket()
    {
        fs::remove_file(path)?;
    }
    // Created 0660 (the umask decides a new socket's mode), so it is never
    // reachable with a wider mode, not even for an instant.
    let umask = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o117));
    let bound = UnixListener::bind(path);
    nix::sys::stat::umask(umask);
    let listener = bound?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o660))?;
    Ok(listener)
}

/// Gives a directory (or the socket) to the socket group with `mode`.
pub fn share_with_group(path: &Path, gid: u32, mode: u32) -> io::Result<()> {
    std::os::unix::fs::chown(path, None, Some(gid))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

/// Who may connect (PROTOCOL.md "Credentials (SO_PEERCRED)"): root, the
/// daemon's own uid, and members of the socket group (by primary group or
/// membership).
pub struct Admission {
    own_uid: u32,
    group_gid: Option<u32>,
}

impl Admission {
    pub fn new(group_gid: Option<u32>) -> Admission {
        Admission {
            own_uid: nix::unistd::geteuid().as_raw(),
            group_gid,
        }
    }

    /// The peer of a new connection and whether it is privileged (root or
    /// the daemon's uid: it may act as any owner); `None` (logged) if it
    /// may not connect at all.
    pub fn admit(&self, stream: &UnixStream) -> Option<(PeerCredentials, bool)> {
        let peer = match sys::peer_credentials(stream) {
            Ok(peer) => peer,
            Err(error) => {
                tracing::warn!(%error, "cannot read the peer's credentials; closing");
                return None;
            }
        };
        let privileged = peer.uid == 0 || peer.uid == self.own_uid;
        if !privileged && !self.in_socket_group(&peer) {
            tracing::warn!(
                pid = peer.pid,
                uid = peer.uid,
                gid = peer.gid,
                "refused a connection from a user outside the allowed ones"
            );
            return None;
        }
        Some((peer, privileged))
    }

    fn in_socket_group(&self, peer: &PeerCredentials) -> bool {
        let Some(gid) = self.group_gid else {
            return false;
        };
        if peer.gid == gid {
            return true;
        }
        let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(peer.uid));
        let group = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid));
        match (user, group) {
            (Ok(Some(user)), Ok(Some(group))) => group.mem.contains(&user.name),
            _ => false,
        }
    }
}

/// What [`accept`] found on the listener.
pub enum Accepted {
    /// A peer that may talk to the daemon, and whether it is privileged.
    Peer(UnixStream, PeerCredentials, bool),
    /// A connection closed at once (logged): not allowed, or over the
    /// limit of `open` connections.
    Refused,
    /// Nothing more to accept now.
    Done,
}

/// Accepts the next connection waiting on `listener`, admitting it by
/// credentials and against the limit of open connections.
pub fn accept(
    listener: &UnixListener,
    admission: &Admission,
    open: usize,
    limit: usize,
) -> Accepted {
    let stream = loop {
        match listener.accept() {
            Ok((stream, _)) => break stream,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Accepted::Done,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                return Accepted::Done;
            }
        }
    };
    let Some((peer, privileged)) = admission.admit(&stream) else {
        return Accepted::Refused;
    };
    if open >= limit {
        tracing::warn!(
            pid = peer.pid,
            limit,
            "refused a connection: too many connections"
        );
        // Said once before closing, so the client knows why (best effort:
        // a new socket's buffer takes it without blocking).
        let mut refusal = Vec::new();
        encode_failure(
            &WireError::generic(format!(
                "too many connections (the limit is {limit}); try again later"
            )),
            &mut refusal,
        );
        let mut stream = stream;
        let _ = stream.write(&refusal);
        return Accepted::Refused;
    }
    Accepted::Peer(stream, peer, privileged)
}

/// What a signal asks of a daemon (OPERATIONS.md "Daemons": SIGTERM and
/// SIGINT stop it cleanly, SIGUSR2 dumps its state to the log).
pub enum Asked {
    Stop,
    Dump,
}

/// The requests of the signals that arrived; others are logged and
/// ignored.
pub fn asked(signals: &mut signal_hook_mio::v1_0::Signals) -> Vec<Asked> {
    use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR2};
    signals
        .pending()
        .filter_map(|signal| match signal {
            SIGTERM | SIGINT => {
                tracing::info!(signal, "asked to stop");
                Some(Asked::Stop)
            }
            SIGUSR2 => Some(Asked::Dump),
            _ => {
                tracing::debug!(signal, "ignored a signal");
                None
            }
        })
        .collect()
}

/// The exit of a daemon's binary: its error, if any, on stderr and in the
/// log.
pub fn exit_code(
    name: &str,
    outcome: Result<(), impl std::fmt::Display>,
) -> std::process::ExitCode {
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{name}: {error}");
            eprintln!("{name}: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Writes as much of `output` to `stream` as it takes now and drops what
/// was written. `Err`: the connection is broken.
pub fn write_out(stream: &mut UnixStream, output: &mut Vec<u8>) -> io::Result<()> {
    let mut written = 0;
    let result = loop {
        if written == output.len() {
            break Ok(());
        }
        match stream.write(&output[written..]) {
            Ok(0) => break Err(io::ErrorKind::WriteZero.into()),
            Ok(count) => written += count,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => break Ok(()),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => break Err(error),
        }
    };
    output.drain(..written);
    // A large answer does not leave a large buffer behind, nor the memory
    // it was built in.
    if output.is_empty() && output.capacity() > CONNECTION_BUFFER_RETAINED_BYTES_MAX {
        let capacity = output.capacity();
        *output = Vec::new();
        if capacity > RELEASE_MEMORY_AFTER_ANSWER_BYTES {
            sys::release_free_memory();
        }
    }
    result
}

/// Watches a connection for writability exactly while it has output left,
/// so a slow reader never makes the loop spin. `registered` tracks what the
/// poll was told.
pub fn watch_writable(
    registry: &Registry,
    stream: &mut UnixStream,
    token: Token,
    registered: &mut bool,
    want: bool,
) -> io::Result<()> {
    if want == *registered {
        return Ok(());
    }
    let interest = if want {
        Interest::READABLE | Interest::WRITABLE
    } else {
        Interest::READABLE
    };
    registry.reregister(stream, token, interest)?;
    *registered = want;
    Ok(())
}
