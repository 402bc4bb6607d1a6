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
//!
//! Fencing tokens (D65): most `awaitLocks` ask for the grant's fence, so
//! the client learns its token and the deaths it was told of at once; the
//! token of a grant answered without one is learnt from the next
//! `listAllLocksOwners [{"tokens": true}]`, which the client reads now and
//! then. Each grant remembers [`Fences::high`](super::fences::Fences::high)
//! as it was when its request was sent (the first request, for one that
//! waited), which its token must exceed. While sure of its state the client
//! asks `checkFence` of a lock it holds (true) or has just released
//! (false). An owner found killed leaves what it may have held then, with
//! the tokens, for the checks of the deaths told of it.

use crate::limits::TORTURE_AWAIT_TIMEOUT_MS;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::{Value, json};

use crate::client::{Client, ClientError, Daemon, FencedAnswer};
use crate::locks::{Action, Entry, LockName, Mode};
use crate::protocol::Request;
use crate::protocol::wconfd::WconfdRequest;

use super::fences::{DeadOwner, TokenBound};
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
    /// The client's number of the grant that gave it (one token for all
    /// the locks of a grant).
    pub grant: u64,
    /// The grant's token, once known.
    pub token: Option<u64>,
    /// The highest token seen when the grant's request was sent.
    pub high_before: u64,
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
    /// The highest token seen when it was sent (for a pending request
    /// asked again: when it was first sent).
    pub high_before: u64,
}

/// What one client knows of its current owner.
#[derive(Default)]
pub struct ClientModel {
    pub owner: Option<Arc<OwnerProcess>>,
    pub held: BTreeMap<String, Held>,
    /// An acknowledged pending request (the locks it acquires).
    pub pending: Option<Vec<(String, Mode)>>,
    /// The highest token seen when the pending request was first sent.
    pub pending_high_before: u64,
    /// The locks of an acquire being sent and the highest token seen
    /// before: if the owner is found killed when its answer comes, it may
    /// have held them.
    pub acquiring: Option<(Vec<(String, Mode)>, u64)>,
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

    /// Every lock the owner may hold now, with what is known of its token:
    /// those held, and those of a request pending, in flight or unsure.
    fn might_hold(&self) -> BTreeMap<String, TokenBound> {
        let mut locks: BTreeMap<String, TokenBound> = BTreeMap::new();
        let mut add = |lock: &str, bound: TokenBound| {
            locks
                .entry(lock.to_owned())
                .and_modify(|known| *known = known.or(bound))
                .or_insert(bound);
        };
        for (lock, held) in &self.held {
            add(
                lock,
                TokenBound {
                    exact: held.token,
                    above: held.high_before,
                },
            );
        }
        let asked = [
            self.pending
                .as_ref()
                .map(|pending| (pending, self.pending_high_before)),
            self.unsure
                .as_ref()
                .map(|unsure| (&unsure.acquire, unsure.high_before)),
            self.acquiring
                .as_ref()
                .map(|(acquire, high_before)| (acquire, *high_before)),
        ];
        for (acquire, high_before) in asked.into_iter().flatten() {
            for (lock, _) in acquire {
                add(
                    lock,
                    TokenBound {
                        exact: None,
                        above: high_before,
                    },
                );
            }
        }
        locks
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
        grants_made: 0,
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
    /// Grants acknowledged, numbering them.
    grants_made: u64,
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
        self.shared.fences().died(
            &owner.wire(),
            DeadOwner {
                killed_us: at_us,
                might_hold: model.might_hold(),
            },
        );
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
        model.acquiring = None;
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

    /// The next number of a grant.
    fn next_grant(&mut self) -> u64 {
        self.grants_made += 1;
        self.grants_made
    }

    /// A grant acknowledged: `acquire` is held from `at_us` on, with its
    /// token if it was answered (the grant numbered and its token recorded
    /// by [`LockClient::fenced_grant`]), else learnt later from a listing.
    fn grant(
        &mut self,
        model: &mut ClientModel,
        acquire: &[(String, Mode)],
        at_us: u64,
        fenced: Option<(u64, u64)>,
        high_before: u64,
    ) {
        let (grant, token) = match fenced {
            Some((grant, token)) => (grant, Some(token)),
            None => (self.next_grant(), None),
        };
        for (lock, mode) in acquire {
            model.held.insert(
                lock.clone(),
                Held {
                    mode: *mode,
                    since_us: at_us,
                    grant,
                    token,
                    high_before,
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
        // Now and then: the tokens of the whole table, or a fence of a
        // lock held.
        match self.rng.below(100) {
            0..=2 => {
                self.list_tokens(&mut model);
                return;
            }
            3..=5 => {
                self.check_fence_held(&mut model, &owner);
                return;
            }
            _ => {}
        }
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
                _ => {
                    let high_before = model.pending_high_before;
                    self.send_acquire(&mut model, &owner, pending, Kind::Await, Some(high_before));
                }
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
            self.send_acquire(&mut model, &owner, acquire, kind, None);
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
                self.send_acquire(&mut model, &owner, acquire, kind, None);
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

    /// An acquire of `kind`; `high_before`: for a pending request asked
    /// again, the highest token seen when it was first sent.
    fn send_acquire(
        &mut self,
        model: &mut ClientModel,
        owner: &OwnerProcess,
        acquire: Vec<(String, Mode)>,
        kind: Kind,
        high_before: Option<u64>,
    ) {
        let request: Vec<Entry> = acquire
            .iter()
            .map(|(lock, mode)| Entry::new(lock_name(lock), Action::Acquire(*mode)))
            .collect();
        let owner_now = owner.owner();
        let fence = kind == Kind::Await && self.rng.percent(75);
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
                fence,
                owner: owner_now,
                priority: 0,
                request,
                timeout_ms: TORTURE_AWAIT_TIMEOUT_MS,
            },
        };
        let method = request.method();
        let high_before = high_before.unwrap_or_else(|| self.shared.fences().high());
        let sent_us = now_us();
        model.acquiring = Some((acquire.clone(), high_before));
        let outcome = self.call(request);
        let answered_us = now_us();
        // The blockers, and for a fenced grant its token: a fenced answer
        // is looked at before the owner's fate, its token and deaths are
        // facts whatever became of the owner since.
        let answer = match &outcome {
            Outcome::Answer(value) if fence => match FencedAnswer::decode(value) {
                Some(fenced) => {
                    let granted = if fenced.blockers.is_empty() {
                        self.fenced_grant(owner, &acquire, &fenced, answered_us, high_before)
                    } else {
                        None
                    };
                    Some((fenced.blockers, granted))
                }
                None => None,
            },
            Outcome::Answer(Value::Array(blockers)) => Some((blockers.clone(), None)),
            _ => None,
        };
        if self.owner_gone(model, true) {
            return;
        }
        model.acquiring = None;
        match (outcome, answer) {
            (Outcome::Answer(_), Some((blockers, fenced))) if blockers.is_empty() => {
                self.grant(model, &acquire, answered_us, fenced, high_before);
                model.pending = None;
                self.shared.figures.grants.fetch_add(1, Ordering::Relaxed);
            }
            (Outcome::Answer(_), Some(_)) => {
                if kind != Kind::Try {
                    model.pending = Some(acquire);
                    model.pending_high_before = high_before;
                }
                self.shared.figures.blocked.fetch_add(1, Ordering::Relaxed);
            }
            (Outcome::Answer(other), None) => self.violation(format!(
                "lock client {}: {method} answered {other}",
                self.index
            )),
            (Outcome::Refused(message), _) => self.refused(model, method, &message),
            (Outcome::Lost { sent }, _) => {
                self.shared
                    .figures
                    .lock_answers_lost
                    .fetch_add(1, Ordering::Relaxed);
                if sent {
                    let waiting = kind != Kind::Try || model.pending.is_some();
                    model.unsure = Some(Sent {
                        acquire,
                        release: Vec::new(),
                        waiting,
                        drops_pending: false,
                        sent_us,
                        high_before,
                    });
                }
            }
        }
    }

    /// A fenced grant's answer: it has a token, above `high_before`, which
    /// is recorded, and each death it was told of is recorded (and checked
    /// as far as it can be at once). Answers the grant's number and token.
    fn fenced_grant(
        &mut self,
        owner: &OwnerProcess,
        acquire: &[(String, Mode)],
        fenced: &FencedAnswer,
        answered_us: u64,
        high_before: u64,
    ) -> Option<(u64, u64)> {
        self.shared
            .figures
            .fenced_grants
            .fetch_add(1, Ordering::Relaxed);
        let Some(token) = fenced.token else {
            self.violation(format!(
                "lock client {}: a fenced grant to {} came without a token: {fenced:?}",
                self.index, owner.ident
            ));
            return None;
        };
        let grant = self.next_grant();
        let recorded = self
            .shared
            .fences()
            .granted(token, &ident_of(owner), grant, high_before);
        if let Err(message) = recorded {
            self.violation(format!("lock client {}: {message}", self.index));
        }
        let locks: Vec<String> = acquire.iter().map(|(lock, _)| lock.clone()).collect();
        let told_to = format!("the grant of {locks:?} to {}", owner.ident);
        for death in &fenced.died {
            let recorded = self
                .shared
                .fences()
                .told(death, answered_us, &told_to, (token, &locks));
            if let Err(message) = recorded {
                self.violation(format!("lock client {}: {message}", self.index));
            }
        }
        Some((grant, token))
    }

    /// `listAllLocksOwners` with tokens: the table's tokens and deaths,
    /// and those of this owner's grants.
    fn list_tokens(&mut self, model: &mut ClientModel) {
        let outcome = self.call(WconfdRequest::ListAllLocksOwners { tokens: true });
        let Outcome::Answer(table) = outcome else {
            return self.expect_answer(model, "listAllLocksOwners", outcome);
        };
        self.shared.observe_tokens(&table);
        // The owner's locks cannot change but by its own requests (or be
        // freed by its death): what the table shows of them is checked
        // whatever its fate.
        if let Err(message) = check_tokens(self.shared, model, &table) {
            self.violation(format!("lock client {}: {message}", self.index));
        }
        self.owner_gone(model, false);
    }

    /// `checkFence` of a lock held with a known token: true while the
    /// owner lives.
    fn check_fence_held(&mut self, model: &mut ClientModel, owner: &OwnerProcess) {
        let known: Vec<(String, u64)> = model
            .held
            .iter()
            .filter_map(|(lock, held)| held.token.map(|token| (lock.clone(), token)))
            .collect();
        if known.is_empty() {
            return;
        }
        let (lock, token) = self.rng.pick(&known).clone();
        let outcome = self.call(WconfdRequest::CheckFence {
            owner: owner.owner(),
            lock: lock_name(&lock),
            token,
        });
        match outcome {
            Outcome::Answer(Value::Bool(true)) => {}
            // Freed by its death meanwhile.
            Outcome::Answer(Value::Bool(false)) if owner.fate() != OwnerFate::Alive => {}
            Outcome::Answer(answer) => self.violation(format!(
                "lock client {}: checkFence of {lock} with token {token}, which owner {} \
                 holds it with, answered {answer}",
                self.index, owner.ident
            )),
            other => return self.expect_answer(model, "checkFence", other),
        }
        self.shared
            .figures
            .fence_checks
            .fetch_add(1, Ordering::Relaxed);
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
                let released: Vec<(String, u64)> = release
                    .iter()
                    .filter_map(|lock| Some((lock.clone(), model.held.get(lock)?.token?)))
                    .collect();
                for lock in &release {
                    self.close(model, &owner.ident, lock, sent_us, "release answered");
                }
                if !released.is_empty() && self.rng.percent(20) {
                    self.check_fence_released(model, owner, &released);
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
                        high_before: model.pending_high_before,
                    });
                }
            }
        }
    }

    /// `checkFence` of a lock just released with the token it was held
    /// with: false (unless its group is still held with that token).
    fn check_fence_released(
        &mut self,
        model: &ClientModel,
        owner: &OwnerProcess,
        released: &[(String, u64)],
    ) {
        let (lock, token) = self.rng.pick(released).clone();
        let group_held = lock_name(&lock).group().is_some_and(|group| {
            model
                .held
                .get(&group.to_string())
                .is_some_and(|held| held.token == Some(token))
        });
        if group_held {
            return;
        }
        let outcome = self.call(WconfdRequest::CheckFence {
            owner: owner.owner(),
            lock: lock_name(&lock),
            token,
        });
        match outcome {
            Outcome::Answer(Value::Bool(false)) => {}
            Outcome::Answer(answer) => self.violation(format!(
                "lock client {}: checkFence of {lock} with token {token}, which owner {} \
                 released (acknowledged), answered {answer}",
                self.index, owner.ident
            )),
            other => return self.expect_answer(model, "checkFence", other),
        }
        self.shared
            .figures
            .fence_checks_released
            .fetch_add(1, Ordering::Relaxed);
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
        let (waiting, waiting_high_before) = if unsure.waiting && !unsure.acquire.is_empty() {
            (Some(unsure.acquire.clone()), unsure.high_before)
        } else {
            (model.pending.clone(), model.pending_high_before)
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
            self.grant(
                model,
                &unsure.acquire,
                answered_us,
                None,
                unsure.high_before,
            );
            model.pending = None;
            self.shared
                .figures
                .lost_but_applied
                .fetch_add(1, Ordering::Relaxed);
        } else if listed != before && Some(&listed) == granted_listing.as_ref() {
            // The waiting request was granted; the lost request, if it was
            // another (a `freeLocks` giving up on it), was not applied.
            let granted = waiting.expect("granted_listing is Some");
            self.grant(model, &granted, answered_us, None, waiting_high_before);
            model.pending = None;
            self.shared.figures.grants.fetch_add(1, Ordering::Relaxed);
        } else if listed == before {
            // A release not applied leaves the locks held: their
            // intervals go on.
            if pending {
                match waiting {
                    Some(request) => {
                        model.pending = Some(request);
                        model.pending_high_before = waiting_high_before;
                    }
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
                high_before: model.pending_high_before,
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
        let high_before = model.pending_high_before;
        self.grant(model, &pending, answered_us, None, high_before);
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

/// An owner's ident as JSON text, as [`super::fences`] keys it.
fn ident_of(owner: &OwnerProcess) -> String {
    owner.wire()[0].to_string()
}

/// What `listAllLocksOwners [{"tokens": true}]` shows of a client's
/// locks: every lock of one grant with one token, the one answered if it
/// was (a grant acknowledged before a crash of wconfd keeps it after), and
/// a token not known yet above every token seen before the request was
/// sent; such tokens are learnt. Locks the table does not show (freed by
/// the owner's death) and those of a pending request are left alone; an
/// unsure client is not looked at.
pub fn check_tokens(shared: &Shared, model: &mut ClientModel, table: &Value) -> Result<(), String> {
    let Some(owner) = model.owner.clone() else {
        return Ok(());
    };
    if model.unsure.is_some() {
        return Ok(());
    }
    let wire = owner.wire();
    let mut listed: BTreeMap<&str, u64> = BTreeMap::new();
    for row in table.as_array().into_iter().flatten() {
        let Some(lock) = row[0].as_str() else {
            continue;
        };
        for holder in row[1].as_array().into_iter().flatten() {
            if holder[0] == wire
                && let Some(token) = holder[2]["token"].as_u64()
            {
                listed.insert(lock, token);
            }
        }
    }
    // Each grant's token in the table, with one of its locks.
    let mut grants: BTreeMap<u64, (u64, String)> = BTreeMap::new();
    for (lock, held) in &model.held {
        let Some(&token) = listed.get(lock.as_str()) else {
            continue;
        };
        if let Some(known) = held.token
            && known != token
        {
            return Err(format!(
                "owner {} was granted {lock} with token {known}, but listAllLocksOwners \
                 shows token {token}",
                owner.ident
            ));
        }
        let (first, first_lock) = grants
            .entry(held.grant)
            .or_insert_with(|| (token, lock.clone()));
        if *first != token {
            return Err(format!(
                "owner {} holds {first_lock} and {lock} of one grant with the tokens \
                 {first} and {token}",
                owner.ident
            ));
        }
    }
    let ident = ident_of(&owner);
    for (grant, (token, _)) in grants {
        let unknown: Vec<&mut Held> = model
            .held
            .values_mut()
            .filter(|held| held.grant == grant && held.token.is_none())
            .collect();
        let Some(high_before) = unknown.first().map(|held| held.high_before) else {
            continue;
        };
        for held in unknown {
            held.token = Some(token);
        }
        shared.figures.tokens_learnt.fetch_add(1, Ordering::Relaxed);
        shared
            .fences()
            .granted(token, &ident, grant, high_before)
            .map_err(|message| format!("{message} (learnt from listAllLocksOwners)"))?;
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Try,
    Waiting,
    Await,
}
