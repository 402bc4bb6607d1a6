//! luxid, the job queue daemon (JOBS.md): start-up (settings, the queue
//! and its lock, recovery of jobs whose runner died while luxid was down,
//! the socket) and the event loop of [`server`].
//!
//! Start-up order matters: jobs whose runner died are marked `error`
//! *before* the socket is bound, so a client that can connect never sees a
//! dead job as running ("connect succeeds" means "ready").

pub mod core;
mod server;
mod wconfd_link;

use std::io;
use std::path::Path;

use crate::paths::{LIVELOCK_DIR, LUXID_SOCKET_PATH, SOCKET_DIR};
use crate::queue::Queue;
use crate::settings::Settings;

pub use server::Server;

/// The runner's executable name, looked up beside luxid's own.
pub const RUNNER_NAME: &str = "job-runner";

pub use crate::daemon::DaemonError;
use crate::daemon::io_error;

/// Runs luxid on `root` until SIGTERM or SIGINT.
pub fn run(root: &Path) -> Result<(), DaemonError> {
    start(root)?.serve()
}

/// Everything before serving: returns a server whose socket accepts.
pub fn start(root: &Path) -> Result<Server, DaemonError> {
    make_dir(root, 0o750)?;
    let root = &root
        .canonicalize()
        .map_err(io_error("cannot resolve the root", root))?;
    let settings = Settings::load(root)?;
    make_dir(&root.join(SOCKET_DIR), 0o750)?;
    let livelock_dir = root.join(LIVELOCK_DIR);
    make_dir(&livelock_dir, 0o770)?;
    let runner = match &settings.luxid.runner_path {
        Some(path) => path.clone(),
        None => std::env::current_exe()
            .map_err(io_error("cannot find luxid's executable", Path::new("-")))?
            .with_file_name(RUNNER_NAME),
    };
    if !runner.is_file() {
        return Err(DaemonError::Io {
            what: "no job runner at",
            path: runner,
            source: io::Error::from(io::ErrorKind::NotFound),
        });
    }
    // luxid's jobs take their locks from wconfd: without it nothing runs.
    if let Err(error) = crate::client::Client::connect(
        root,
        crate::client::Daemon::Wconfd,
        settings.luxid.frame_bytes_max,
    ) {
        return Err(DaemonError::NoWconfd(error));
    }
    let (queue, loaded) = Queue::open(root)?;
    for skipped in &loaded.skipped {
        tracing::error!(%skipped, "skipped a job file that cannot be read");
    }
    tracing::info!(
        jobs = loaded.jobs.len(),
        serial = queue.serial(),
        "queue loaded"
    );
    let livelock = crate::daemon::daemon_livelock(&livelock_dir, "luxi-daemon").map_err(
        io_error("cannot create the daemon's livelock in", &livelock_dir),
    )?;
    let mut server = Server::new(root, settings, queue, loaded, runner, livelock)?;
    server.recover()?;
    let socket_path = root.join(LUXID_SOCKET_PATH);
    server.bind(&socket_path)?;
    tracing::info!(socket = %socket_path.display(), "luxid ready");
    Ok(server)
}

fn make_dir(path: &Path, mode: u32) -> Result<(), DaemonError> {
    crate::daemon::make_dir(path, mode).map_err(io_error("cannot create directory", path))
}
