//! wconfd, the lock and configuration daemon: start-up (settings, the
//! instance lock, loading and cleaning the durable state, the socket) and
//! the event loop of [`server`].
//!
//! Start-up order matters: the state is loaded and every owner whose
//! livelock is dead is freed (durably) *before* the socket is bound, so a
//! client that can connect sees a cleaned state ("connect succeeds" means
//! "ready").

mod events;
mod server;
mod workers;

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::settings::Settings;
use crate::store::config::ConfigStore;
use crate::store::lock_state::LockStore;

pub use server::Server;

use crate::paths::{LIVELOCK_DIR, SOCKET_DIR, WCONFD_INSTANCE_LOCK_FILE, WCONFD_SOCKET_PATH};

pub use crate::daemon::DaemonError;
use crate::daemon::io_error;

/// Seconds since the epoch, as Ganeti's timestamps.
pub(crate) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs_f64())
        .unwrap_or(0.0)
}

/// Runs wconfd on `root` until SIGTERM or SIGINT.
pub fn run(root: &Path) -> Result<(), DaemonError> {
    let server = start(root)?;
    server.serve()
}

/// Everything before serving: returns a server whose socket accepts.
pub fn start(root: &Path) -> Result<Server, DaemonError> {
    make_dir(root, 0o750)?;
    // Livelock paths are compared lexically: the root must be absolute and
    // spelled one way.
    let root = &root
        .canonicalize()
        .map_err(io_error("cannot resolve the root", root))?;
    let settings = Settings::load(root)?;
    let socket_dir = root.join(SOCKET_DIR);
    make_dir(&socket_dir, 0o750)?;
    let livelock_dir = root.join(LIVELOCK_DIR);
    make_dir(&livelock_dir, 0o770)?;
    // Members of the socket group reach the socket and create livelocks.
    let group_gid = match &settings.wconfd.socket_group {
        Some(group) => Some(group.gid()?),
        None => None,
    };
    if let Some(gid) = group_gid {
        share_with_group(&socket_dir, gid, 0o750)?;
        share_with_group(&livelock_dir, gid, 0o770)?;
    }
    let instance_lock = take_instance_lock(root)?;
    raise_descriptor_limit(settings.wconfd.connections_max);

    let (store, manager, registry, report) =
        LockStore::open_with(root, true, settings.workers.quarantine_after)?;
    tracing::info!(
        snapshot_seq = report.snapshot_seq,
        replayed = report.replayed,
        torn_bytes = report.torn_bytes,
        owners = manager.owners().len(),
        holdings = manager.holding_count(),
        pending = manager.pending_count(),
        workers = registry.len(),
        worker_holders = registry.holdings().count(),
        worker_waiters = registry.waiters().count(),
        journal = %store.journal_io(),
        "lock state loaded"
    );
    if report.torn_bytes > 0 {
        tracing::warn!(
            bytes = report.torn_bytes,
            "zeroed the unfinished last write of the lock journal (it was never acknowledged)"
        );
    }
    let events = events::WconfdEvents::open(root, &settings, &report.events)?;
    let config = ConfigStore::open(root, unix_now())?;
    let livelock = crate::daemon::daemon_livelock(&livelock_dir, "wconf-daemon").map_err(
        io_error("cannot create the daemon's livelock in", &livelock_dir),
    )?;

    let socket_path = root.join(WCONFD_SOCKET_PATH);
    let mut server = Server::new(
        settings,
        (store, manager, registry),
        events,
        config,
        livelock,
        livelock_dir,
        instance_lock,
    )?;
    // Owners that died while wconfd was down are freed before anyone can
    // connect.
    server.recover()?;
    server.bind(&socket_path)?;
    tracing::info!(socket = %socket_path.display(), "wconfd ready");
    Ok(server)
}

fn make_dir(path: &Path, mode: u32) -> Result<(), DaemonError> {
    crate::daemon::make_dir(path, mode).map_err(io_error("cannot create directory", path))
}

/// One wconfd per root: an exclusive flock on `wconfd.lock`, held for the
/// daemon's life (the kernel drops it when the process dies, however).
fn take_instance_lock(root: &Path) -> Result<File, DaemonError> {
    let path = root.join(WCONFD_INSTANCE_LOCK_FILE);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(io_error("cannot open", &path))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(fs::TryLockError::WouldBlock) => Err(DaemonError::AlreadyRunning {
            daemon: "wconfd",
            root: root.to_owned(),
            lock: path,
        }),
        Err(fs::TryLockError::Error(error)) => Err(io_error("cannot lock", &path)(error)),
    }
}

/// Each connection is a descriptor: make room for the configured maximum
/// plus the daemon's own files and pidfds.
fn raise_descriptor_limit(connections_max: usize) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let wanted = (connections_max as u64).saturating_mul(2) + 256;
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < wanted => {
            let new_soft = wanted.min(hard);
            if let Err(error) = setrlimit(Resource::RLIMIT_NOFILE, new_soft, hard) {
                tracing::warn!(%error, "cannot raise the descriptor limit");
            }
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "cannot read the descriptor limit"),
    }
}

/// Gives a directory (or the socket) to the socket group with `mode`.
pub(crate) fn share_with_group(path: &Path, gid: u32, mode: u32) -> Result<(), DaemonError> {
    crate::daemon::share_with_group(path, gid, mode)
        .map_err(io_error("cannot give the socket group", path))
}
