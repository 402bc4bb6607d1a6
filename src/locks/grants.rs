//! Fencing tokens and death marks *(extension)*: what each holding was
//! granted with, beside the allocation (which knows only modes).
//!
//! - Every grant (a direct update, a waiting request granted later, an
//!   opportunistic union) draws the next token from one counter, for the
//!   whole set of locks it gave; a lock already held keeps its token, a
//!   downgrade is not a grant. The counter only moves up, and it is part
//!   of the saved state, so tokens increase across restarts.
//! - When a dead owner's locks are freed, each lock it held is marked with
//!   that owner and its token (a lock shared by owners that all died has
//!   a mark for each). The next grant covering a marked lock (the lock
//!   itself or its group) is told, and takes the marks away; a grant of a
//!   member of a marked group is told too but leaves the group's marks,
//!   since the group's other members may still need repair.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Bound;

use super::allocation::OwnerRef;
use super::name::LockName;
use super::owner::Owner;

/// A fencing token: the number of a grant.
pub type Token = u64;

/// A lock that was held by an owner found dead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Death {
    /// The lock the dead owner held (the granted lock, its group or one of
    /// its members).
    pub lock: LockName,
    pub owner: Owner,
    /// The token it held `lock` with.
    pub token: Token,
}

/// What one holding was granted with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grant {
    pub token: Token,
    /// The dead previous holders its grant was told of.
    pub died: Vec<Death>,
}

/// The saved form of [`Grants`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SavedGrants {
    pub last_token: Token,
    /// Every holding's grant, by owner and lock.
    pub grants: Vec<(Owner, LockName, Grant)>,
    pub marks: Vec<Death>,
}

#[derive(Debug, Default)]
pub struct Grants {
    last_token: Token,
    held: HashMap<OwnerRef, BTreeMap<LockName, Grant>, BuildHasherDefault<OwnerHasher>>,
    /// Per lock, the dead owners that held it, not yet told to a grantee
    /// (never an empty list).
    marks: BTreeMap<LockName, Vec<Death>>,
    /// Set between [`Grants::begin_grant`] and [`Grants::end_grant`]: a
    /// union grants its locks one by one, as one grant.
    in_one_grant: bool,
    /// The token of that grant, once drawn.
    open: Option<Token>,
}

impl Grants {
    /// The last token issued (0: none yet).
    pub fn last_token(&self) -> Token {
        self.last_token
    }

    /// Makes the grants until [`Grants::end_grant`] one grant.
    pub fn begin_grant(&mut self) {
        self.in_one_grant = true;
        self.open = None;
    }

    pub fn end_grant(&mut self) {
        self.in_one_grant = false;
        self.open = None;
    }

    /// Records one update of `owner`: it let `released` go and was granted
    /// `raised` (each newly held or raised to exclusive), with one token
    /// for them all.
    pub fn changed(&mut self, owner: &OwnerRef, released: &[LockName], raised: &[LockName]) {
        if raised.is_empty() {
            self.released(owner, released);
            return;
        }
        let token = match self.open {
            Some(token) => token,
            None => {
                self.last_token += 1;
                self.last_token
            }
        };
        if self.in_one_grant {
            self.open = Some(token);
        }
        let held = self.held.entry(OwnerRef::clone(owner)).or_default();
        for lock in released {
            held.remove(lock);
        }
        for lock in raised {
            let died = if self.marks.is_empty() {
                Vec::new()
            } else {
                tell(&mut self.marks, lock)
            };
            match held.get_mut(lock) {
                // A union that raises a lock it gave moments ago is still
                // one grant: the deaths it was told of stay told.
                Some(grant) if grant.token == token => grant.died.extend(died),
                _ => {
                    held.insert(lock.clone(), Grant { token, died });
                }
            }
        }
    }

    /// Records that `owner` was granted `locks` (each newly held or
    /// raised to exclusive): one token for them all.
    pub fn granted(&mut self, owner: &OwnerRef, locks: &[LockName]) {
        self.changed(owner, &[], locks);
    }

    /// Forgets the grants of locks `owner` no longer holds.
    pub fn released(&mut self, owner: &Owner, locks: &[LockName]) {
        let Some(held) = self.held.get_mut(owner) else {
            return;
        };
        for lock in locks {
            held.remove(lock);
        }
        if held.is_empty() {
            self.held.remove(owner);
        }
    }

    /// Marks every lock `owner` holds as held by a dead owner, before its
    /// locks are freed. At most `marks_max` marks are kept: the oldest
    /// (lowest token) go first.
    pub fn died(&mut self, owner: &Owner, marks_max: usize) {
        let Some(held) = self.held.get(owner) else {
            return;
        };
        for (lock, grant) in held {
            // Another owner that shared the lock may have died before:
            // both are told.
            self.marks.entry(lock.clone()).or_default().push(Death {
                lock: lock.clone(),
                owner: owner.clone(),
                token: grant.token,
            });
        }
        let count: usize = self.marks.values().map(Vec::len).sum();
        if count > marks_max {
            let mut all: Vec<Death> = std::mem::take(&mut self.marks)
                .into_values()
                .flatten()
                .collect();
            // Stable: among equal tokens the first in lock order goes.
            all.sort_by_key(|death| death.token);
            for death in all.into_iter().skip(count - marks_max) {
                self.marks
                    .entry(death.lock.clone())
                    .or_default()
                    .push(death);
            }
        }
    }

    /// A holding restored from a state saved without its grant.
    pub fn restored_without_token(&mut self, owner: &OwnerRef, lock: &LockName) {
        self.held
            .entry(OwnerRef::clone(owner))
            .or_default()
            .insert(lock.clone(), Grant::default());
    }

    pub fn grant(&self, owner: &Owner, lock: &LockName) -> Option<&Grant> {
        self.held.get(owner)?.get(lock)
    }

    /// The grants of `owner`, in lock order.
    pub fn of(&self, owner: &Owner) -> Option<&BTreeMap<LockName, Grant>> {
        self.held.get(owner)
    }

    pub fn marks(&self) -> impl Iterator<Item = &Death> {
        self.marks.values().flatten()
    }

    pub fn saved(&self) -> SavedGrants {
        let mut grants: Vec<(Owner, LockName, Grant)> = self
            .held
            .iter()
            .flat_map(|(owner, held)| {
                held.iter()
                    .map(|(lock, grant)| (Owner::clone(owner), lock.clone(), grant.clone()))
            })
            .collect();
        grants.sort_unstable_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        SavedGrants {
            last_token: self.last_token,
            grants,
            marks: self.marks.values().flatten().cloned().collect(),
        }
    }

    /// Rebuilds from the saved form: `owner_ref` gives the shared handle of
    /// a holder, `None` for an owner that holds nothing (an impossible
    /// grant).
    pub fn restore(
        saved: &SavedGrants,
        owner_ref: impl Fn(&Owner, &LockName) -> Option<OwnerRef>,
    ) -> Result<Grants, String> {
        let mut grants = Grants {
            last_token: saved.last_token,
            ..Grants::default()
        };
        for (owner, lock, grant) in &saved.grants {
            let Some(owner_ref) = owner_ref(owner, lock) else {
                return Err(format!(
                    "a grant of {lock} to {owner}, who does not hold it"
                ));
            };
            if grant.token > saved.last_token {
                return Err(format!(
                    "the grant of {lock} to {owner} has token {} above the last issued {}",
                    grant.token, saved.last_token
                ));
            }
            grants
                .held
                .entry(owner_ref)
                .or_default()
                .insert(lock.clone(), grant.clone());
        }
        for death in &saved.marks {
            if death.token > saved.last_token {
                return Err(format!(
                    "the mark of {} has token {} above the last issued {}",
                    death.lock, death.token, saved.last_token
                ));
            }
            grants
                .marks
                .entry(death.lock.clone())
                .or_default()
                .push(death.clone());
        }
        Ok(grants)
    }

    /// Panics unless every holding has exactly one grant, with a token
    /// that was issued.
    pub fn check_invariants<'a>(
        &self,
        holdings: impl Iterator<Item = (&'a OwnerRef, &'a BTreeMap<LockName, super::owner::Mode>)>,
    ) {
        let mut count = 0;
        for (owner, held) in holdings {
            let grants = self.held.get(owner);
            for lock in held.keys() {
                let grant = grants
                    .and_then(|grants| grants.get(lock))
                    .unwrap_or_else(|| panic!("{owner} holds {lock} with no grant"));
                assert!(
                    grant.token <= self.last_token,
                    "{owner} holds {lock} with the unissued token {}",
                    grant.token
                );
            }
            count += held.len();
        }
        let granted: usize = self.held.values().map(BTreeMap::len).sum();
        assert_eq!(granted, count, "grants of locks nobody holds");
        for (lock, deaths) in &self.marks {
            assert!(!deaths.is_empty(), "an empty list of marks of {lock}");
            for death in deaths {
                assert_eq!(*lock, death.lock, "a mark filed under another lock");
                assert!(
                    death.token <= self.last_token,
                    "a mark with an unissued token"
                );
            }
        }
    }
}

/// The marks a grant of `lock` is told of, taking away those it covers.
fn tell(marks: &mut BTreeMap<LockName, Vec<Death>>, lock: &LockName) -> Vec<Death> {
    let mut died = Vec::new();
    if let Some(group) = lock.group()
        && let Some(deaths) = marks.get(&group)
    {
        died.extend(deaths.iter().cloned());
    }
    if let Some(deaths) = marks.remove(lock) {
        died.extend(deaths);
    }
    if lock.is_group() {
        // The members sort right after their group; the group's own mark
        // is gone already, so the range starts past it, not at it.
        let members: Vec<LockName> = marks
            .range((Bound::Excluded(lock.clone()), Bound::Unbounded))
            .take_while(|(member, _)| member.group().as_ref() == Some(lock))
            .map(|(member, _)| member.clone())
            .collect();
        for member in members {
            died.extend(marks.remove(&member).into_iter().flatten());
        }
    }
    died
}

/// A multiply-rotate hash (Firefox's, as rustc uses it) for the grants'
/// owner index: every lock update looks its owner up here, and SipHash
/// over the livelock path was most of what tokens cost. Owners are
/// authenticated local peers, the allocation keeps SipHash, and a
/// flood of colliding owners costs only this index's speed.
#[derive(Default)]
pub struct OwnerHasher(u64);

impl OwnerHasher {
    const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(Self::SEED);
    }
}

impl Hasher for OwnerHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.add(u64::from_le_bytes(chunk.try_into().expect("eight bytes")));
        }
        let mut last = [0u8; 8];
        let rest = chunks.remainder();
        last[..rest.len()].copy_from_slice(rest);
        self.add(u64::from_le_bytes(last) ^ rest.len() as u64);
    }

    fn write_u8(&mut self, value: u8) {
        self.add(u64::from(value));
    }

    fn write_u32(&mut self, value: u32) {
        self.add(u64::from(value));
    }

    fn write_u64(&mut self, value: u64) {
        self.add(value);
    }

    fn write_usize(&mut self, value: usize) {
        self.add(value as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn lock(text: &str) -> LockName {
        LockName::parse(text).expect("a lock name")
    }

    fn owner(job: u64) -> OwnerRef {
        Arc::new(Owner::job(
            job,
            format!("/livelock/{job}"),
            100 + job as u32,
        ))
    }

    fn told(grants: &Grants, owner: &Owner, name: &str) -> Vec<(String, Token)> {
        let grant = grants.grant(owner, &lock(name)).expect("a grant");
        grant
            .died
            .iter()
            .map(|death| (death.lock.to_string(), death.token))
            .collect()
    }

    #[test]
    fn a_group_grant_is_told_of_every_marked_member_and_the_group() {
        let mut grants = Grants::default();
        let dead = owner(1);
        grants.granted(&dead, &[lock("node/[lockset]")]);
        grants.granted(&dead, &[lock("node/n1"), lock("node/n2")]);
        grants.died(&dead, 100);
        grants.released(
            &dead,
            &[lock("node/[lockset]"), lock("node/n1"), lock("node/n2")],
        );

        let next = owner(2);
        grants.granted(&next, &[lock("node/[lockset]")]);
        assert_eq!(
            told(&grants, &next, "node/[lockset]"),
            [
                ("node/[lockset]".to_string(), 1),
                ("node/n1".to_string(), 2),
                ("node/n2".to_string(), 2)
            ]
        );
        assert_eq!(grants.marks().count(), 0, "every mark was told");
    }

    #[test]
    fn a_union_raising_a_lock_it_gave_keeps_the_death_it_was_told_of() {
        let mut grants = Grants::default();
        let dead = owner(1);
        grants.granted(&dead, &[lock("instance/i1")]);
        grants.died(&dead, 100);
        grants.released(&dead, &[lock("instance/i1")]);

        let next = owner(2);
        grants.begin_grant();
        grants.granted(&next, &[lock("instance/i1")]);
        grants.granted(&next, &[lock("instance/i1")]);
        grants.end_grant();
        assert_eq!(
            told(&grants, &next, "instance/i1"),
            [("instance/i1".to_string(), 1)]
        );
        assert_eq!(grants.grant(&next, &lock("instance/i1")).unwrap().token, 2);
    }

    #[test]
    fn owners_sharing_a_lock_that_all_died_are_all_told() {
        let mut grants = Grants::default();
        let (first, second) = (owner(1), owner(2));
        grants.granted(&first, &[lock("cluster/BGL")]);
        grants.granted(&second, &[lock("cluster/BGL")]);
        for dead in [&first, &second] {
            grants.died(dead, 100);
            grants.released(dead, &[lock("cluster/BGL")]);
        }
        let next = owner(3);
        grants.granted(&next, &[lock("cluster/BGL")]);
        assert_eq!(
            told(&grants, &next, "cluster/BGL"),
            [
                ("cluster/BGL".to_string(), 1),
                ("cluster/BGL".to_string(), 2)
            ]
        );
        assert_eq!(grants.marks().count(), 0);
    }

    #[test]
    fn the_bound_forgets_the_oldest_deaths_of_a_shared_lock_too() {
        let mut grants = Grants::default();
        let (first, second) = (owner(1), owner(2));
        grants.granted(&first, &[lock("cluster/BGL")]);
        grants.granted(&second, &[lock("cluster/BGL")]);
        grants.died(&first, 1);
        grants.died(&second, 1);
        let kept: Vec<Token> = grants.marks().map(|death| death.token).collect();
        assert_eq!(kept, [2]);
    }

    #[test]
    fn a_member_grant_is_told_of_its_group_and_leaves_the_mark() {
        let mut grants = Grants::default();
        let dead = owner(1);
        grants.granted(&dead, &[lock("node/[lockset]")]);
        grants.died(&dead, 100);
        grants.released(&dead, &[lock("node/[lockset]")]);
        let next = owner(2);
        grants.granted(&next, &[lock("node/n1")]);
        assert_eq!(
            told(&grants, &next, "node/n1"),
            [("node/[lockset]".to_string(), 1)]
        );
        assert_eq!(grants.marks().count(), 1);
    }
}
