//! Lock clients: threads that churn locks directly on wconfd, each through
//! a series of owners (a `sleep` process holding the owner's livelock),
//! with `tryUpdateLocks`, `updateLocksWaiting`, `awaitLocks`,
//! `hasPendingRequest` and `freeLocks`. Each keeps a model of what wconfd
//! acknowledged to it and records the intervals it held each lock.
//!
//! A request whose answer is lost (wconfd killed) leaves the client
//! *unsure*: on its next connection it asks `listLocks` and
//! `hasPendingRequest`, which must show the state before the request or
//! after it, never anything else (updates are all-or-nothing and durable
//! before they are answered).

use crate::limits::TORTURE_AWAIT_TIMEOUT_MS;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::{Value, json};

use crate::client::{Client, ClientError, Daemon};
use crate::locks::{Action, Entry, LockName, Mode};
use crate::protocol::Request;
use crate::protocol::wconfd::WconfdRequest;

use super::history::{Interval, now_us};
use super::processes::{OwnerFate, OwnerProcess};
use super::rng::Rng;
use super::{Backoff, Shared};

/// The node locks lock clients and jobs contend for.
pub const NODES: [&str; 4] = ["n0", "n1", "n2", "n3"];

/// A lock name of the harness's lock universe (all valid by
/// construction).
fn lock_name(text: &str) -> LockName {
    LockName::parse(text).expect("the harness names only valid locks")
}

fn parse_mode(name: &str) -> Option<Mode> {
    match name {
        "shared" => Some(Mode::Shared),
        "exclusive" => Some(Mode::Exclusive),
        _ => None,
    }
}

/// Lock order of two wire names (both valid).
fn lock_key(name: &str) -> LockName {
    LockName::parse(name).expect("the harness names valid locks only")
}

/// A lock held, as acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub mode: Mode,
    pub since_us: u64,
}

/// A request sent whose outcome is not known yet.
#[derive(Clone, Debug)]
pub struct Sent {
    /// Locks to acquire.
    pub acquire: Vec<(String, Mode)>,
    /// Locks to release (all of them for `freeLocks`).
    pub release: Vec<String>,
    /// Whether it may leave a pending request (waiting kinds).
    pub waiting: bool,
    /// Whether it drops a pending request (`freeLocks`).
    pub drops_pending: bool,
    pub sent_us: u64,
}

/// What one client knows of its current owner.
#[derive(Default)]
pub struct ClientModel {
    pub owner: Option<Arc<OwnerProcess>>,
    pub held: BTreeMap<String, Held>,
    /// An acknowledged pending request (the locks it acquires).
    pub pending: Option<Vec<(String, Mode)>>,
    /// A request whose answer was lost.
    pub unsure: Option<Sent>,
    /// The locks of a release being sent, and when it was sent: if the
    /// owner is found killed when its answer comes, they end then.
    pub releasing: Option<(Vec<String>, u64)>,
}

impl ClientModel {
    /// The holdings as `listLocks` would answer them (sorted by name, for
    /// comparison).
    fn listing(held: &BTreeMap<String, Mode>) -> Vec<(String, Mode)> {
        held.iter()
            .map(|(lock, mode)| (lock.clone(), *mode))
            .collect()
    }

    fn held_modes(&self) -> BTreeMap<String, Mode> {
        self.held
            .iter()
            .map(|(lock, held)| (lock.clone(), held.mode))
            .collect()
    }

    /// Whether wconfd knows this owner for sure (it holds or waits), so
    /// that its death must free it and remove its livelock.
    pub fn known_to_wconfd(&self) -> bool {
        self.unsure.is_none() && (!self.held.is_empty() || self.pending.is_some())
    }

    pub fn expected_listing(&self) -> Vec<(String, Mode)> {
        ClientModel::listing(&self.held_modes())
    }

    /// The listing once `pending` is granted too.
    pub fn listing_with_pending(&self) -> Option<Vec<(String, Mode)>> {
        let pending = self.pending.as_ref()?;
        let mut held = self.held_modes();
        for (lock, mode) in pending {
            held.insert(lock.clone(), *mode);
        }
        Some(ClientModel::listing(&held))
    }
}

/// A `listLocks` answer as sorted (lock, mode) pairs; None if malformed.
pub fn parse_listing(value: &Value) -> Option<Vec<(String, Mode)>> {
    let mut listing = Vec::new();
    for entry in value.as_array()? {
        let lock = entry.get(0)?.as_str()?.to_owned();
        let mode = parse_mode(entry.get(1)?.as_str()?)?;
        listing.push((lock, mode));
    }
    listing.sort();
    Some(listing)
}

/// The client's thread: churn until told to stop, then free everything and
/// end the owner.
pub fn run(shared: &Shared, index: usize, model: &Mutex<ClientModel>) {
    let mut client = LockClient {
        shared,
        index,
        model,
        rng: Rng::stream(shared.seed, 1000 + index as u64),
        connection: None,
        owners_made: 0,
        backoff: Backoff::new(),
        trace: std::collections::VecDeque::new(),
    };
    while !shared.stopping() {
        client.step();
        let pause = client.rng.below(8);
        std::thread::sleep(Duration::from_millis(pause));
    }
    client.finish();
}

struct LockClient<'a> {
    shared: &'a Shared,
    index: usize,
    model: &'a Mutex<ClientModel>,
    rng: Rng,
    connection: Option<Client>,
    owners_made: u64,
    backoff: Backoff,
    /// The client's last calls and their outcomes, reported with a
    /// violation.
    trace: std::collections::VecDeque<String>,
}

/// Calls a lock client remembers for its reports.
const TRACE_CALLS_MAX: usize = 24;

/// What a call came to.
enum Outcome {
    Answer(Value),
    /// The daemon refused (its class and message).
    Refused(String),
    /// No answer: the connection failed before or after sending.
    Lost {
        sent: bool,
    },
}

impl LockClient<'_> {
    /// The model, locked (borrowing the mutex, not the client).
    fn model<'m>(mutex: &'m Mutex<ClientModel>) -> std::sync::MutexGuard<'m, ClientModel> {
        mutex.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn connect(&mut self) -> bool {
        if self.connection.is_some() {
            return true;
        }
        match Client::connect(&self.shared.root, Daemon::Wconfd, 1 << 24) {
            Ok(client) => {
                self.connection = Some(client);
                self.backoff.reset();
                true
            }
            Err(_) => {
                self.backoff.wait(&self.shared.stop_clients);
                false
            }
        }
    }

    fn call(&mut self, request: WconfdRequest) -> Outcome {
        let request = request.encode();
        let outcome = self.call_untraced(&request);
        if self.trace.len() == TRACE_CALLS_MAX {
            self.trace.pop_front();
        }
        let shown = match &outcome {
            Outcome::Answer(value) => value.to_string(),
            Outcome::Refused(message) => format!("refused: {message}"),
            Outcome::Lost { sent } => format!("lost (sent: {sent})"),
        };
        self.trace.push_back(format!(
            "{} {} {} -> {shown}",
            now_us(),
            request.method,
            Value::Array(request.args)
        ));
        outcome
    }

    /// A violation of this client, with its last calls.
    fn violation(&self, message: String) {
        let trace: Vec<&str> = self.trace.iter().map(String::as_str).collect();
        self.shared.violation(format!(
            "{message}\n    last calls of lock client {}:\n      {}",
            self.index,
            trace.join("\n      ")
        ));
    }

    fn call_untraced(&mut self, request: &Request) -> Outcome {
        let Some(client) = self.connection.as_mut() else {
            return Outcome::Lost { sent: false };
        };
        if let Err(_error) = client.send_request(request) {
            self.connection = None;
            // The request may have been written in part or whole.
            return Outcome::Lost { sent: true };
        }
        match client.receive() {
            Ok(value) => Outcome::Answer(value),
            Err(ClientError::Failed { class, args, .. }) => {
                Outcome::Refused(format!("{class}: {}", Value::Array(args)))
            }
            Err(_) => {
                self.connection = None;
                Outcome::Lost { sent: true }
            }
        }
    }

    /// Ends the model's owner if it was killed: its intervals end when it
    /// was killed. Answers whether the owner is gone.
    ///
    /// `in_flight`: a request of the owner was sent and answered around its
    /// death, so whether wconfd still knew the owner when it noticed the
    /// death is unknown (a `freeLocks` may have been applied first).
    fn owner_gone(&self, model: &mut ClientModel, in_flight: bool) -> bool {
        let Some(owner) = model.owner.clone() else {
            return true;
        };
        let OwnerFate::Killed { at_us } = owner.fate() else {
            return false;
        };
        self.shared
            .owners_killed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((Arc::clone(&owner), !in_flight && model.known_to_wconfd()));
        // A release sent before the death may have been applied any time
        // after it was sent: those locks end then.
        if let Some(unsure) = model.unsure.take() {
            for lock in &unsure.release {
                let end_us = unsure.sent_us.min(at_us);
                self.close(model, &owner.ident, lock, end_us, "released, then killed");
            }
        }
        if let Some((release, sent_us)) = model.releasing.take() {
            for lock in &release {
                let end_us = sent_us.min(at_us);
                self.close(model, &owner.ident, lock, end_us, "released, then killed");
            }
        }
        self.close_all(model, &owner.ident, at_us, "owner killed");
        model.owner = None;
        model.pending = None;
        model.unsure = None;
        true
    }

    fn close_all(&self, model: &mut ClientModel, owner: &str, end_us: u64, ended: &'static str) {
        let held = std::mem::take(&mut model.held);
        let mut intervals = self.shared.intervals();
        for (lock, held) in held {
            intervals.push(Interval {
                owner: owner.to_owned(),
                lock,
                mode: held.mode,
                start_us: held.since_us,
                end_us: end_us.max(held.since_us),
                ended,
            });
        }
    }

    fn close(
        &self,
        model: &mut ClientModel,
        owner: &str,
        lock: &str,
        end_us: u64,
        ended: &'static str,
    ) {
        if let Some(held) = model.held.remove(lock) {
            self.shared.intervals().push(Interval {
                owner: owner.to_owned(),
                lock: lock.to_owned(),
                mode: held.mode,
                start_us: held.since_us,
                end_us: end_us.max(held.since_us),
                ended,
            });
        }
    }

    fn grant(model: &mut ClientModel, acquire: &[(String, Mode)], at_us: u64) {
        for (lock, mode) in acquire {
            model.held.insert(
                lock.clone(),
                Held {
                    mode: *mode,
                    since_us: at_us,
                },
            );
        }
    }

    fn step(&mut self) {
        if !self.connect() {
            return;
        }
        let shared = self.shared;
        let gate = shared.gate.read().unwrap_or_else(PoisonError::into_inner);
        let mut model = Self::model(self.model);
        if self.owner_gone(&mut model, false) {
            drop(model);
            drop(gate);
            self.new_owner();
            return;
        }
        if model.unsure.is_some() {
            self.resync(&mut model);
            return;
        }
        let owner = model.owner.clone().expect("checked by owner_gone");
        if let Some(pending) = model.pending.clone() {
            // Wait for it, look, or give up.
            match self.rng.below(4) {
                0 => self.send_update(&mut model, &owner, "free", Vec::new()),
                1 => {
                    let outcome = self.call(WconfdRequest::HasPendingRequest {
                        owner: owner.owner(),
                    });
                    if let Outcome::Answer(Value::Bool(false)) = outcome {
                        // Granted (confirm with the listing).
                        self.resync_after(&mut model, pending);
                    } else {
                        self.expect_answer(&model, "hasPendingRequest", outcome);
                    }
                }
                _ => self.send_acquire(&mut model, &owner, pending, Kind::Await),
            }
            return;
        }
        let highest = model.held.keys().map(|lock| lock_key(lock)).max();
        let holds_group = model.held.contains_key("node/[lockset]");
        if model.held.is_empty() {
            let mut acquire = vec![(
                "cluster/BGL".to_owned(),
                if self.rng.percent(3) {
                    Mode::Exclusive
                } else {
                    Mode::Shared
                },
            )];
            if self.rng.percent(8) {
                acquire.push(("node/[lockset]".to_owned(), self.mode()));
            } else {
                let node = self.rng.pick(&NODES);
                acquire.push((format!("node/{node}"), self.mode()));
            }
            let kind = self.kind();
            self.send_acquire(&mut model, &owner, acquire, kind);
            return;
        }
        let above: Vec<&str> = NODES
            .iter()
            .copied()
            .filter(|node| {
                let lock = format!("node/{node}");
                highest
                    .as_ref()
                    .is_none_or(|highest| lock_key(&lock) > *highest)
            })
            .collect();
        match self.rng.below(10) {
            0..=2 if !above.is_empty() && !holds_group => {
                let node = self.rng.pick(&above);
                let acquire = vec![(format!("node/{node}"), self.mode())];
                let kind = self.kind();
                self.send_acquire(&mut model, &owner, acquire, kind);
            }
            3..=5 => self.send_update(&mut model, &owner, "free", Vec::new()),
            6 | 7 => {
                // Release some: a release never violates the order.
                let locks: Vec<String> = model.held.keys().cloned().collect();
                let count = self.rng.between(1, locks.len() as u64) as usize;
                let release = locks[locks.len() - count..].to_vec();
                self.send_update(&mut model, &owner, "release", release);
            }
            8 => {
                // A clean end of this owner.
                self.send_update(&mut model, &owner, "free", Vec::new());
                if model.held.is_empty() && model.unsure.is_none() && model.pending.is_none() {
                    match owner.exit() {
                        OwnerFate::Alive => {
                            model.owner = None;
                        }
                        _ => {
                            self.owner_gone(&mut model, true);
                        }
                    }
                }
            }
            _ => {
                // Hold a little longer: nothing.
            }
        }
    }

    fn mode(&mut self) -> Mode {
        if self.rng.percent(50) {
            Mode::Exclusive
        } else {
            Mode::Shared
        }
    }

    fn kind(&mut self) -> Kind {
        match self.rng.below(3) {
            0 => Kind::Try,
            1 => Kind::Waiting,
            _ => Kind::Await,
        }
    }

    fn new_owner(&mut self) {
        self.owners_made += 1;
        let ident = format!("torture-{}-{}", self.index, self.owners_made);
        match OwnerProcess::spawn(&self.shared.livelock_dir, &ident) {
            Ok(owner) => {
                let owner = Arc::new(owner);
                self.shared
                    .owners
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(Arc::clone(&owner));
                self.shared.figures.owners.fetch_add(1, Ordering::Relaxed);
                let mut model = Self::model(self.model);
                model.owner = Some(owner);
            }
            Err(error) => self
                .shared
                .violation(format!("lock client {}: {error}", self.index)),
        }
    }

    /// An answer that must be a plain success of `method`.
    fn expect_answer(&mut self, model: &ClientModel, method: &str, outcome: Outcome) {
        match outcome {
            Outcome::Answer(_) | Outcome::Lost { .. } => {}
            Outcome::Refused(message) => self.refused(model, method, &message),
        }
    }

    fn refused(&mut self, model: &ClientModel, method: &str, message: &str) {
        // A request of an owner killed meanwhile may be refused (its
        // pending request dropped by the death).
        if model
            .owner
            .as_ref()
            .is_some_and(|owner| owner.fate() != OwnerFate::Alive)
        {
            return;
        }
        let owner = model.owner.as_ref().map_or_else(
            || "none".to_owned(),
            |owner| format!("{} {}", owner.ident, owner.describe()),
        );
        self.violation(format!(
            "lock client {}: wconfd refused a valid {method}: {message} (owner {owner})",
            self.index
        ));
    }

    fn send_acquire(
        &mut self,
        model: &mut ClientModel,
        owner: &OwnerProcess,
        acquire: Vec<(String, Mode)>,
        kind: Kind,
    ) {
        let request: Vec<Entry> = acquire
            .iter()
            .map(|(lock, mode)| Entry::new(lock_name(lock), Action::Acquire(*mode)))
            .collect();
        let owner_now = owner.owner();
        let request = match kind {
            Kind::Try => WconfdRequest::TryUpdateLocks {
                owner: owner_now,
                request,
            },
            Kind::Waiting => WconfdRequest::UpdateLocksWaiting {
                owner: owner_now,
                priority: 0,
                request,
            },
            Kind::Await => WconfdRequest::AwaitLocks {
                fence: false,
                owner: owner_now,
                priority: 0,
                request,
                timeout_ms: TORTURE_AWAIT_TIMEOUT_MS,
            },
        };
        let method = request.method();
        let sent_us = now_us();
        let outcome = self.call(request);
        let answered_us = now_us();
        if self.owner_gone(model, true) {
            return;
        }
        match outcome {
            Outcome::Answer(Value::Array(blockers)) if blockers.is_empty() => {
                Self::grant(model, &acquire, answered_us);
                model.pending = None;
                self.shared.figures.grants.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Answer(Value::Array(_)) => {
                if kind != Kind::Try {
                    model.pending = Some(acquire);
                }
                self.shared.figures.blocked.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Answer(other) => self.violation(format!(
                "lock client {}: {method} answered {other}",
                self.index
            )),
            Outcome::Refused(message) => self.refused(model, method, &message),
            Outcome::Lost { sent } => {
                self.shared
                    .figures
                    .lock_answers_lost
                    .fetch_add(1, Ordering::Relaxed);
                if sent {
                    model.unsure = Some(Sent {
                        acquire,
                        release: Vec::new(),
                        waiting: kind != Kind::Try || model.pending.is_some(),
                        drops_pending: false,
                        sent_us,
                    });
                }
            }
        }
    }

    /// `freeLocks` (`how` = "free") or a release of `release` by
    /// `tryUpdateLocks`.
    fn send_update(
        &mut self,
        model: &mut ClientModel,
        owner: &OwnerProcess,
        how: &str,
        release: Vec<String>,
    ) {
        let (request, release) = if how == "free" {
            let all: Vec<String> = model.held.keys().cloned().collect();
            (
                WconfdRequest::FreeLocks {
                    owner: owner.owner(),
                },
                all,
            )
        } else {
            let entries: Vec<Entry> = release
                .iter()
                .map(|lock| Entry::release(lock_name(lock)))
                .collect();
            (
                WconfdRequest::TryUpdateLocks {
                    owner: owner.owner(),
                    request: entries,
                },
                release,
            )
        };
        let method = request.method();
        let sent_us = now_us();
        model.releasing = Some((release.clone(), sent_us));
        let outcome = self.call(request);
        if self.owner_gone(model, true) {
            return;
        }
        model.releasing = None;
        match outcome {
            Outcome::Answer(answer) if answer == json!([]) => {
                for lock in &release {
                    self.close(model, &owner.ident, lock, sent_us, "release answered");
                }
                if how == "free" {
                    model.pending = None;
                }
                self.shared.figures.releases.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Answer(other) => self.violation(format!(
                "lock client {}: a pure release ({method}) answered {other}",
                self.index
            )),
            Outcome::Refused(message) => self.refused(model, method, &message),
            Outcome::Lost { sent } => {
                self.shared
                    .figures
                    .lock_answers_lost
                    .fetch_add(1, Ordering::Relaxed);
                if sent {
                    model.unsure = Some(Sent {
                        acquire: Vec::new(),
                        release,
                        waiting: model.pending.is_some() && how != "free",
                        drops_pending: how == "free",
                        sent_us,
                    });
                }
            }
        }
    }

    /// After a lost answer: learn from wconfd whether the request took
    /// effect, which must be all or nothing. `hasPendingRequest` is asked
    /// first: once it answers false, only the owner's own requests can
    /// change what it holds, so the listing that follows is settled; if it
    /// answers true, a grant may still come before the listing.
    fn resync(&mut self, model: &mut ClientModel) {
        let unsure = model.unsure.clone().expect("called when unsure");
        let owner = model.owner.clone().expect("an owner");
        let pending = self.call(WconfdRequest::HasPendingRequest {
            owner: owner.owner(),
        });
        let listed = self.call(WconfdRequest::ListLocks {
            owner: owner.owner(),
        });
        let answered_us = now_us();
        if self.owner_gone(model, true) {
            return;
        }
        let (Outcome::Answer(Value::Bool(pending)), Outcome::Answer(listed)) = (pending, listed)
        else {
            // Try again on the next connection.
            return;
        };
        let Some(listed) = parse_listing(&listed) else {
            self.violation(format!("listLocks answered a malformed listing: {listed}"));
            return;
        };
        let before = model.expected_listing();
        let mut after_modes = model.held_modes();
        for lock in &unsure.release {
            after_modes.remove(lock);
        }
        for (lock, mode) in &unsure.acquire {
            after_modes.insert(lock.clone(), *mode);
        }
        let after = ClientModel::listing(&after_modes);
        // The request that may wait: the lost one if it was a waiting
        // kind, else the acknowledged pending one.
        let waiting = if unsure.waiting && !unsure.acquire.is_empty() {
            Some(unsure.acquire.clone())
        } else {
            model.pending.clone()
        };
        let granted_listing = waiting.as_ref().map(|request| {
            let mut modes = model.held_modes();
            for (lock, mode) in request {
                modes.insert(lock.clone(), *mode);
            }
            ClientModel::listing(&modes)
        });
        model.unsure = None;
        self.shared.figures.resyncs.fetch_add(1, Ordering::Relaxed);
        if listed == after && after != before {
            if pending && unsure.drops_pending {
                self.violation(format!(
                    "lock client {}: owner {} still has a pending request after its \
                     freeLocks was applied",
                    self.index, owner.ident
                ));
                return;
            }
            for lock in &unsure.release {
                self.close(
                    model,
                    &owner.ident,
                    lock,
                    unsure.sent_us,
                    "release found applied",
                );
            }
            Self::grant(model, &unsure.acquire, answered_us);
            model.pending = None;
            self.shared
                .figures
                .lost_but_applied
                .fetch_add(1, Ordering::Relaxed);
        } else if listed != before && Some(&listed) == granted_listing.as_ref() {
            // The waiting request was granted; the lost request, if it was
            // another (a `freeLocks` giving up on it), was not applied.
            let granted = waiting.expect("granted_listing is Some");
            Self::grant(model, &granted, answered_us);
            model.pending = None;
            self.shared.figures.grants.fetch_add(1, Ordering::Relaxed);
        } else if listed == before {
            // A release not applied leaves the locks held: their
            // intervals go on.
            if pending {
                match waiting {
                    Some(request) => model.pending = Some(request),
                    None => self.violation(format!(
                        "lock client {}: owner {} has a pending request it never made",
                        self.index, owner.ident
                    )),
                }
            } else {
                if model.pending.is_some() && !unsure.drops_pending {
                    self.violation(format!(
                        "lock client {}: owner {}'s acknowledged pending request is gone, \
                         yet it holds nothing more",
                        self.index, owner.ident
                    ));
                }
                model.pending = None;
            }
        } else {
            self.violation(format!(
                "lock client {}: owner {} holds {listed:?} after a lost request, \
                 neither {before:?} (not applied) nor {after:?} (applied)",
                self.index, owner.ident
            ));
        }
    }

    /// `hasPendingRequest` said false for an acknowledged pending request:
    /// it was granted; the listing confirms.
    fn resync_after(&mut self, model: &mut ClientModel, pending: Vec<(String, Mode)>) {
        let owner = model.owner.clone().expect("an owner");
        let outcome = self.call(WconfdRequest::ListLocks {
            owner: owner.owner(),
        });
        let answered_us = now_us();
        if self.owner_gone(model, true) {
            return;
        }
        let Outcome::Answer(listed) = outcome else {
            // Lost: look again after reconnecting.
            model.unsure = Some(Sent {
                acquire: pending,
                release: Vec::new(),
                waiting: true,
                drops_pending: false,
                sent_us: answered_us,
            });
            return;
        };
        let listed = parse_listing(&listed);
        if listed != model.listing_with_pending() {
            self.violation(format!(
                "lock client {}: owner {}'s pending request is gone but it holds {listed:?}, \
                 not what it asked for (owner: {})",
                self.index,
                owner.ident,
                owner.describe()
            ));
            return;
        }
        Self::grant(model, &pending, answered_us);
        model.pending = None;
        self.shared.figures.grants.fetch_add(1, Ordering::Relaxed);
    }

    /// At the end of the run: free everything and end the owner.
    fn finish(&mut self) {
        for _attempt in 0..2000 {
            if !self.connect() {
                continue;
            }
            let mut model = Self::model(self.model);
            if self.owner_gone(&mut model, false) {
                return;
            }
            if model.unsure.is_some() {
                self.resync(&mut model);
                continue;
            }
            let owner = model.owner.clone().expect("checked by owner_gone");
            self.send_update(&mut model, &owner, "free", Vec::new());
            if model.unsure.is_none() && model.held.is_empty() {
                model.pending = None;
                if owner.exit() != OwnerFate::Alive {
                    self.owner_gone(&mut model, true);
                }
                model.owner = None;
                return;
            }
        }
        self.violation(format!(
            "lock client {} could not free its locks at the end",
            self.index
        ));
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Try,
    Waiting,
    Await,
}
