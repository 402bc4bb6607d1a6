//! What the property and exhaustive tests share: operations on the lock
//! manager as data, applying one to the real [`LockManager`] and to the
//! [`Reference`], and comparing the two.
//!
//! Checks return `Result<(), String>` so that proptest can shrink a failing
//! case (its runner turns the message into a test-case failure) and the
//! exhaustive test can print the sequence that failed.

use std::collections::BTreeSet;
use std::fmt;

use warden::locks::{
    Action, Entry, Level, LockError, LockManager, LockName, Mode, Owner, PendingRequest, Priority,
    SavedState, Update,
};

use crate::reference::{Answer, Reference};

/// Fails the enclosing check with a formatted message.
macro_rules! ensure {
    ($condition:expr, $($message:tt)+) => {
        if !$condition {
            return Err(format!($($message)+));
        }
    };
}
pub(crate) use ensure;

pub fn lock(text: &str) -> LockName {
    LockName::parse(text).expect("test lock names are valid")
}

/// One public mutating operation of the lock manager. Owners are indexes
/// into the universe of the test (`o0`, `o1`, ... in failure output).
#[derive(Clone, PartialEq, Eq)]
pub enum Op {
    TryUpdate {
        owner: usize,
        request: Vec<Entry>,
    },
    UpdateWaiting {
        owner: usize,
        priority: Priority,
        request: Vec<Entry>,
    },
    /// Re-send the owner's pending request (if any; otherwise the empty
    /// request) with this priority. [`resolve`] turns it into an
    /// `UpdateWaiting` before it is applied.
    Resend {
        owner: usize,
        priority: Priority,
    },
    /// Free the owner that the pending request at index `pick` (modulo
    /// their number) is filed under; with no pending request, owner
    /// `pick` (modulo the owners). [`resolve`] turns it into a `FreeLocks`.
    /// It makes the releases that grant waiters frequent.
    FreeBlocker {
        pick: usize,
    },
    /// Climb the [`LADDER`]: wait for the first ladder lock above all the
    /// owner holds (holding nothing, the one at `start`), in `mode`, and
    /// with `hand_off` (release, or shared for a downgrade) applied to the
    /// highest lock it holds. At the top of the ladder: free everything.
    /// A pending owner re-sends its request. [`resolve`] turns it into an
    /// `UpdateWaiting` or a `FreeLocks`. Grants of such requests let the
    /// requests filed under their owner through: cascades.
    Climb {
        owner: usize,
        priority: Priority,
        start: usize,
        mode: Mode,
        hand_off: Option<Action>,
    },
    FreeLocks {
        owner: usize,
    },
    FreeLocksLevel {
        owner: usize,
        level: Level,
    },
    Downgrade {
        owner: usize,
        level: Level,
    },
    Intersect {
        owner: usize,
        keep: Vec<LockName>,
    },
    Union {
        owner: usize,
        wanted: Vec<(LockName, Mode)>,
    },
    Guarded {
        count: usize,
        owner: usize,
        wanted: Vec<(LockName, Mode)>,
    },
}

impl Op {
    pub fn owner(&self) -> usize {
        match self {
            Op::TryUpdate { owner, .. }
            | Op::UpdateWaiting { owner, .. }
            | Op::Resend { owner, .. }
            | Op::Climb { owner, .. }
            | Op::FreeLocks { owner }
            | Op::FreeLocksLevel { owner, .. }
            | Op::Downgrade { owner, .. }
            | Op::Intersect { owner, .. }
            | Op::Union { owner, .. }
            | Op::Guarded { owner, .. } => *owner,
            Op::FreeBlocker { .. } => unreachable!("operations are resolved before they are used"),
        }
    }

    /// The request of a `TryUpdate` or `UpdateWaiting`.
    pub fn request(&self) -> Option<&[Entry]> {
        match self {
            Op::TryUpdate { request, .. } | Op::UpdateWaiting { request, .. } => Some(request),
            _ => None,
        }
    }
}

struct Entries<'a>(&'a [Entry]);

impl fmt::Display for Entries<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (index, entry) in self.0.iter().enumerate() {
            if index > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{} {}", entry.lock, entry.action.as_str())?;
        }
        f.write_str("]")
    }
}

struct Wanted<'a>(&'a [(LockName, Mode)]);

impl fmt::Display for Wanted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (index, (lock, mode)) in self.0.iter().enumerate() {
            if index > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{lock} {mode}")?;
        }
        f.write_str("]")
    }
}

/// Short enough to read a shrunk sequence at a glance.
impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::TryUpdate { owner, request } => write!(f, "try(o{owner}, {})", Entries(request)),
            Op::UpdateWaiting {
                owner,
                priority,
                request,
            } => write!(f, "wait(o{owner}, prio {priority}, {})", Entries(request)),
            Op::Resend { owner, priority } => write!(f, "resend(o{owner}, prio {priority})"),
            Op::FreeBlocker { pick } => write!(f, "free_blocker({pick})"),
            Op::Climb {
                owner,
                priority,
                start,
                mode,
                hand_off,
            } => {
                let hand_off = hand_off.map_or("none", Action::as_str);
                write!(
                    f,
                    "climb(o{owner}, prio {priority}, start {start}, {mode}, hand off {hand_off})"
                )
            }
            Op::FreeLocks { owner } => write!(f, "free(o{owner})"),
            Op::FreeLocksLevel { owner, level } => write!(f, "free_level(o{owner}, {level})"),
            Op::Downgrade { owner, level } => write!(f, "downgrade(o{owner}, {level})"),
            Op::Intersect { owner, keep } => {
                let keep: Vec<String> = keep.iter().map(LockName::to_string).collect();
                write!(f, "intersect(o{owner}, [{}])", keep.join(", "))
            }
            Op::Union { owner, wanted } => write!(f, "union(o{owner}, {})", Wanted(wanted)),
            Op::Guarded {
                count,
                owner,
                wanted,
            } => write!(f, "guarded({count}, o{owner}, {})", Wanted(wanted)),
        }
    }
}

/// What an operation answered, in the reference's terms (owners by value).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `try_update` and `update_waiting`.
    Update(Result<Answer, LockError>),
    /// `free_locks`, `free_locks_level`, `downgrade_locks_level`,
    /// `intersect_locks`: the owners to notify.
    Notify(Vec<Owner>),
    /// The opportunistic unions: the locks acquired.
    Acquired(Vec<LockName>),
}

impl Outcome {
    /// The owners this outcome notifies.
    pub fn notified(&self) -> &[Owner] {
        match self {
            Outcome::Update(Ok(answer)) => &answer.notify,
            Outcome::Notify(notify) => notify,
            Outcome::Update(Err(_)) | Outcome::Acquired(_) => &[],
        }
    }

    pub fn blockers(&self) -> Option<&[Owner]> {
        match self {
            Outcome::Update(Ok(answer)) => Some(&answer.blockers),
            _ => None,
        }
    }
}

/// Turns a `Resend` or `FreeBlocker` into the operation it stands for in
/// the current state of `real`; every other operation is returned as it is.
pub fn resolve(op: &Op, real: &LockManager, owners: &[Owner]) -> Op {
    if let Op::FreeBlocker { pick } = op {
        let pending = real.saved().pending;
        let owner = match pending.get(pick % pending.len().max(1)) {
            Some(waiting) => owners
                .iter()
                .position(|owner| *owner == waiting.filed_under)
                .expect("pending requests are filed under owners of the test"),
            None => pick % owners.len(),
        };
        return Op::FreeLocks { owner };
    }
    let pending_request = |owner: usize| {
        real.list_pending()
            .into_iter()
            .find(|pending| *pending.owner == owners[owner])
            .map(|pending| pending.request)
    };
    match op {
        Op::Resend { owner, priority } => Op::UpdateWaiting {
            owner: *owner,
            priority: *priority,
            request: pending_request(*owner).unwrap_or_default(),
        },
        Op::Climb {
            owner,
            priority,
            start,
            mode,
            hand_off,
        } => {
            if let Some(request) = pending_request(*owner) {
                return Op::UpdateWaiting {
                    owner: *owner,
                    priority: *priority,
                    request,
                };
            }
            let ladder: Vec<LockName> = LADDER.into_iter().map(lock).collect();
            let highest = real.list_locks(&owners[*owner]).pop();
            let next = match &highest {
                None => Some(ladder[start % ladder.len()].clone()),
                Some((held, _)) => ladder.into_iter().find(|rung| rung > held),
            };
            let Some(next) = next else {
                return Op::FreeLocks { owner: *owner };
            };
            let mut request = vec![Entry::new(next, Action::Acquire(*mode))];
            if let (Some(action), Some((held, _))) = (hand_off, highest) {
                request.push(Entry::new(held, *action));
            }
            Op::UpdateWaiting {
                owner: *owner,
                priority: *priority,
                request,
            }
        }
        _ => op.clone(),
    }
}

/// The locks `Op::Climb` climbs, in lock order.
pub const LADDER: [&str; 5] = [
    "cluster/BGL",
    "instance/a",
    "instance/b",
    "node/n1",
    "node/n2",
];

pub fn owned(owners: &[std::sync::Arc<Owner>]) -> Vec<Owner> {
    owners.iter().map(|owner| (**owner).clone()).collect()
}

pub fn answer_of(update: Update) -> Answer {
    Answer {
        blockers: owned(&update.blockers),
        notify: owned(&update.notify),
    }
}

/// Applies a resolved operation to the real lock manager.
pub fn apply_real(real: &mut LockManager, op: &Op, owners: &[Owner]) -> Outcome {
    let who = &owners[op.owner()];
    match op {
        Op::TryUpdate { request, .. } => {
            Outcome::Update(real.try_update(who, request).map(answer_of))
        }
        Op::UpdateWaiting {
            priority, request, ..
        } => Outcome::Update(real.update_waiting(who, *priority, request).map(answer_of)),
        Op::Resend { .. } | Op::FreeBlocker { .. } | Op::Climb { .. } => {
            unreachable!("operations are resolved before they are applied")
        }
        Op::FreeLocks { .. } => Outcome::Notify(owned(&real.free_locks(who))),
        Op::FreeLocksLevel { level, .. } => {
            Outcome::Notify(owned(&real.free_locks_level(who, *level)))
        }
        Op::Downgrade { level, .. } => {
            Outcome::Notify(owned(&real.downgrade_locks_level(who, *level)))
        }
        Op::Intersect { keep, .. } => Outcome::Notify(owned(&real.intersect_locks(who, keep))),
        Op::Union { wanted, .. } => Outcome::Acquired(real.opportunistic_union(who, wanted)),
        Op::Guarded { count, wanted, .. } => {
            Outcome::Acquired(real.guarded_opportunistic_union(*count, who, wanted))
        }
    }
}

/// Applies a resolved operation to the reference model.
pub fn apply_reference(reference: &mut Reference, op: &Op, owners: &[Owner]) -> Outcome {
    let who = &owners[op.owner()];
    match op {
        Op::TryUpdate { request, .. } => Outcome::Update(reference.try_update(who, request)),
        Op::UpdateWaiting {
            priority, request, ..
        } => Outcome::Update(reference.update_waiting(who, *priority, request)),
        Op::Resend { .. } | Op::FreeBlocker { .. } | Op::Climb { .. } => {
            unreachable!("operations are resolved before they are applied")
        }
        Op::FreeLocks { .. } => Outcome::Notify(reference.free_locks(who)),
        Op::FreeLocksLevel { level, .. } => {
            Outcome::Notify(reference.free_locks_level(who, *level))
        }
        Op::Downgrade { level, .. } => {
            Outcome::Notify(reference.downgrade_locks_level(who, *level))
        }
        Op::Intersect { keep, .. } => Outcome::Notify(reference.intersect_locks(who, keep)),
        Op::Union { wanted, .. } => Outcome::Acquired(reference.opportunistic_union(who, wanted)),
        Op::Guarded { count, wanted, .. } => {
            Outcome::Acquired(reference.guarded_opportunistic_union(*count, who, wanted))
        }
    }
}

fn compare_notify(real: &[Owner], reference: &[Owner]) -> Result<(), String> {
    let real_set: BTreeSet<&Owner> = real.iter().collect();
    let reference_set: BTreeSet<&Owner> = reference.iter().collect();
    ensure!(
        real_set.len() == real.len(),
        "the real manager notifies an owner twice: {real:?}"
    );
    ensure!(
        real_set == reference_set,
        "notified owners differ (as sets): real {real:?}, reference {reference:?}"
    );
    ensure!(
        real == reference,
        "notification order differs (same set): real {real:?}, reference (grant order) \
         {reference:?}"
    );
    Ok(())
}

/// The answers of the real manager and the reference to the same operation
/// agree: blockers, errors, notified owners as a set and in grant order,
/// locks acquired.
pub fn compare_outcomes(real: &Outcome, reference: &Outcome) -> Result<(), String> {
    match (real, reference) {
        (Outcome::Update(Ok(real)), Outcome::Update(Ok(reference))) => {
            ensure!(
                real.blockers == reference.blockers,
                "blockers differ: real {:?}, reference {:?}",
                real.blockers,
                reference.blockers
            );
            compare_notify(&real.notify, &reference.notify)
        }
        (Outcome::Notify(real), Outcome::Notify(reference)) => compare_notify(real, reference),
        _ => {
            ensure!(
                real == reference,
                "answers differ: real {real:?}, reference {reference:?}"
            );
            Ok(())
        }
    }
}

pub fn pending_by_value(pending: Vec<PendingRequest>) -> Vec<(Priority, Owner, Vec<Entry>)> {
    pending
        .into_iter()
        .map(|pending| (pending.priority, (*pending.owner).clone(), pending.request))
        .collect()
}

pub type LocksOwners = Vec<(LockName, Vec<(Owner, Mode)>)>;

pub fn all_locks_owners(real: &LockManager) -> LocksOwners {
    real.list_all_locks_owners()
        .into_iter()
        .map(|(lock, holders)| {
            let holders = holders
                .into_iter()
                .map(|(owner, mode)| ((*owner).clone(), mode))
                .collect();
            (lock, holders)
        })
        .collect()
}

/// The real manager and the reference are in the same state: the same four
/// listings, the same pending flags, owners and saved form.
pub fn compare_states(
    real: &LockManager,
    reference: &Reference,
    owners: &[Owner],
) -> Result<(), String> {
    reference.check_consistent();
    for owner in owners {
        let (have, want) = (real.list_locks(owner), reference.list_locks(owner));
        ensure!(
            have == want,
            "list_locks({owner}) differs: real {have:?}, reference {want:?}"
        );
        let (have, want) = (
            real.has_pending_request(owner),
            reference.has_pending_request(owner),
        );
        ensure!(
            have == want,
            "has_pending_request({owner}) differs: real {have}, reference {want}"
        );
    }
    let (have, want) = (real.list_all_locks(), reference.list_all_locks());
    ensure!(
        have == want,
        "list_all_locks differs: real {have:?}, reference {want:?}"
    );
    let (have, want) = (all_locks_owners(real), reference.list_all_locks_owners());
    ensure!(
        have == want,
        "list_all_locks_owners differs: real {have:?}, reference {want:?}"
    );
    let (have, want) = (
        pending_by_value(real.list_pending()),
        reference.list_pending(),
    );
    ensure!(
        have == want,
        "list_pending differs: real {have:?}, reference {want:?}"
    );
    let (have, want) = (owned(&real.owners()), reference.owners());
    ensure!(
        have == want,
        "owners() differs: real {have:?}, reference {want:?}"
    );
    let (have, want) = (real.saved(), reference.saved());
    ensure!(
        have == want,
        "saved() differs: real {have:?}, reference {want:?}"
    );
    Ok(())
}

/// Two real managers are in the same state, as far as any listing shows.
pub fn compare_managers(a: &LockManager, b: &LockManager, owners: &[Owner]) -> Result<(), String> {
    for owner in owners {
        ensure!(
            a.list_locks(owner) == b.list_locks(owner),
            "list_locks({owner}) differs"
        );
        ensure!(
            a.has_pending_request(owner) == b.has_pending_request(owner),
            "has_pending_request({owner}) differs"
        );
    }
    ensure!(
        a.list_all_locks() == b.list_all_locks(),
        "list_all_locks differs"
    );
    ensure!(
        all_locks_owners(a) == all_locks_owners(b),
        "list_all_locks_owners differs"
    );
    ensure!(a.list_pending() == b.list_pending(), "list_pending differs");
    ensure!(a.owners() == b.owners(), "owners() differs");
    let (sa, sb) = (a.saved(), b.saved());
    ensure!(sa == sb, "saved() differs: {sa:?} vs {sb:?}");
    Ok(())
}

/// An independent copy of a manager, through its saved form.
pub fn copy(real: &LockManager) -> LockManager {
    restore(&real.saved())
}

pub fn restore(saved: &SavedState) -> LockManager {
    LockManager::restore(saved).expect("a saved form of a real state restores")
}

/// The level no test ever takes a lock on: freeing it drops an owner's
/// pending request and changes nothing else.
pub const UNUSED_LEVEL: Level = Level::Network;

/// Drops the owner's pending request (through `free_locks_level` on a level
/// where no test holds anything), leaving every lock where it is.
pub fn drop_pending(real: &mut LockManager, owner: &Owner) {
    let notify = real.free_locks_level(owner, UNUSED_LEVEL);
    assert!(
        notify.is_empty(),
        "freeing an empty level notified {notify:?}"
    );
}
