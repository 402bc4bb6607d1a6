//! [`Syncer`]: the sync of an event sequence's file on a thread of its
//! own, so that a daemon's loop never waits for the disk for its events.
//! The loop writes events, hands the file over, and goes on; when the sync
//! is done the thread wakes the loop, which makes the events readable.

use std::fs::File;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;

use mio::Waker;

#[derive(Default)]
struct Shared {
    /// The file to sync, the last event written to it and its length.
    wanted: Option<(File, u64, u64)>,
    /// The last event a finished sync covered, and the file's length then.
    synced: (u64, u64),
    /// Why the last sync failed, once.
    failed: Option<String>,
    stopping: bool,
}

pub struct Syncer {
    shared: Arc<(Mutex<Shared>, Condvar)>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Syncer {
    /// Starts the thread; `waker` wakes the loop after each sync.
    pub fn start(name: &str, waker: Waker) -> std::io::Result<Syncer> {
        let shared = Arc::new((Mutex::new(Shared::default()), Condvar::new()));
        let theirs = Arc::clone(&shared);
        let thread = thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || run(&theirs, &waker))?;
        Ok(Syncer {
            shared,
            thread: Some(thread),
        })
    }

    /// Syncs `file` up to event `seq`, `len` bytes (an
    /// [`EventLog::sync_handle`](super::EventLog::sync_handle)); a later
    /// request replaces one not yet started: one sync covers both.
    pub fn request(&self, (file, seq, len): (File, u64, u64)) {
        let (lock, wake) = &*self.shared;
        let mut shared = lock.lock().expect("the syncer never panics holding it");
        shared.wanted = Some((file, seq, len));
        wake.notify_one();
    }

    /// The last event a finished sync covered with the file's length then,
    /// and why a sync failed (if one did since the last call).
    pub fn synced(&self) -> ((u64, u64), Option<String>) {
        let (lock, _) = &*self.shared;
        let mut shared = lock.lock().expect("the syncer never panics holding it");
        (shared.synced, shared.failed.take())
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        {
            let (lock, wake) = &*self.shared;
            if let Ok(mut shared) = lock.lock() {
                shared.stopping = true;
                wake.notify_one();
            }
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(shared: &(Mutex<Shared>, Condvar), waker: &Waker) {
    let (lock, wake) = shared;
    loop {
        let (file, seq, len) = {
            let mut state = lock.lock().expect("the loop never panics holding it");
            loop {
                if state.stopping {
                    return;
                }
                if let Some(wanted) = state.wanted.take() {
                    break wanted;
                }
                state = wake.wait(state).expect("the loop never panics holding it");
            }
        };
        let result = file.sync_data();
        {
            let mut state = lock.lock().expect("the loop never panics holding it");
            match result {
                Ok(()) if seq > state.synced.0 => state.synced = (seq, len),
                Ok(()) => {}
                Err(error) => state.failed = Some(error.to_string()),
            }
        }
        let _ = waker.wake();
    }
}
