//! Fencing tokens and death marks *(extension)*: the token counter and
//! the deaths. Each holding's token sits in the allocation's holdings,
//! beside its mode, so that a grant updates one index; the deaths are
//! rare and kept here, apart.
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

use std::collections::BTreeMap;
use std::ops::Bound;

use super::allocation::{Holdings, OwnerRef, RaisedAndReleased};
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

/// The saved form of [`Grants`] with the holdings' tokens.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SavedGrants {
    pub last_token: Token,
    /// Every holding's grant, by owner and lock.
    pub grants: Vec<(Owner, LockName, Grant)>,
    pub marks: Vec<Death>,
}

/// The token counter and the deaths. Each holding's token is kept in the
/// allocation's holdings: a grant touches one index. Deaths are rare, so
/// they are kept apart, and an update with none to tell and none told
/// does no work here beyond drawing its token.
#[derive(Debug, Default)]
pub struct Grants {
    last_token: Token,
    /// Per holder and lock, the deaths its grant was told of, while it
    /// holds the lock (never an empty map or list).
    told: BTreeMap<OwnerRef, BTreeMap<LockName, Vec<Death>>>,
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

    /// The token the next grant gets: the open one of a union, else the
    /// next of the counter. Drawn only by [`Grants::issued`].
    pub fn next_token(&self) -> Token {
        self.open.unwrap_or(self.last_token + 1)
    }

    /// Records that a grant used `token` (from [`Grants::next_token`]).
    pub fn issued(&mut self, token: Token) {
        self.last_token = token;
        if self.in_one_grant {
            self.open = Some(token);
        }
    }

    /// Whether an update must tell [`Grants::changed`] what it raised and
    /// released: there are marks to tell or told deaths to forget.
    pub fn follows_updates(&self) -> bool {
        !self.marks.is_empty() || !self.told.is_empty()
    }

    /// Records one update of `owner` in which the allocation gave the locks
    /// it raised `token`: the grant is told of the marks it covers, and
    /// the deaths told to holdings it let go or raised anew are forgotten.
    /// Sorts `noted.raised`: a group told before its members takes their
    /// marks, as a request in lock order would.
    pub fn changed(&mut self, owner: &OwnerRef, token: Token, noted: &mut RaisedAndReleased) {
        if let Some(told) = self.told.get_mut(owner) {
            for lock in &noted.released {
                told.remove(lock);
            }
            for (lock, before) in &noted.raised {
                // A union that raises a lock it gave moments ago is still
                // one grant: the deaths it was told of stay told.
                if *before != Some(token) {
                    told.remove(lock);
                }
            }
            if told.is_empty() {
                self.told.remove(owner);
            }
        }
        if self.marks.is_empty() {
            return;
        }
        noted.raised.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        noted.raised.dedup_by(|a, b| a.0 == b.0);
        for (lock, _) in &noted.raised {
            let died = tell(&mut self.marks, lock);
            if !died.is_empty() {
                self.told
                    .entry(OwnerRef::clone(owner))
                    .or_default()
                    .entry(lock.clone())
                    .or_default()
                    .extend(died);
            }
        }
    }

    /// Marks every lock `owner` holds (its `holdings`) as held by a dead
    /// owner, before its locks are freed. At most `marks_max` marks are
    /// kept: the oldest (lowest token) go first.
    pub fn died(&mut self, owner: &Owner, holdings: &Holdings, marks_max: usize) {
        for (lock, holding) in holdings {
            // Another owner that shared the lock may have died before:
            // both are told.
            self.marks.entry(lock.clone()).or_default().push(Death {
                lock: lock.clone(),
                owner: owner.clone(),
                token: holding.token,
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

    /// The deaths the grant `owner` holds `lock` with was told of.
    pub fn told(&self, owner: &Owner, lock: &LockName) -> &[Death] {
        self.told
            .get(owner)
            .and_then(|told| told.get(lock))
            .map_or(&[], Vec::as_slice)
    }

    pub fn marks(&self) -> impl Iterator<Item = &Death> {
        self.marks.values().flatten()
    }

    /// The saved form, with the tokens of `holdings` (every owner's).
    pub fn saved<'a>(
        &self,
        holdings: impl Iterator<Item = (&'a OwnerRef, &'a Holdings)>,
    ) -> SavedGrants {
        let mut grants: Vec<(Owner, LockName, Grant)> = holdings
            .flat_map(|(owner, held)| {
                held.iter().map(|(lock, holding)| {
                    let grant = Grant {
                        token: holding.token,
                        died: self.told(owner, lock).to_vec(),
                    };
                    (Owner::clone(owner), lock.clone(), grant)
                })
            })
            .collect();
        grants.sort_unstable_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        SavedGrants {
            last_token: self.last_token,
            grants,
            marks: self.marks.values().flatten().cloned().collect(),
        }
    }

    /// Rebuilds from the saved form. `hold_with` gives the holding of a
    /// saved grant its token and answers the shared handle of its holder,
    /// `None` if the owner does not hold the lock (an impossible grant).
    /// A holding without a saved grant keeps the token it has (0, never
    /// issued).
    pub fn restore(
        saved: &SavedGrants,
        mut hold_with: impl FnMut(&Owner, &LockName, Token) -> Option<OwnerRef>,
    ) -> Result<Grants, String> {
        let mut grants = Grants {
            last_token: saved.last_token,
            ..Grants::default()
        };
        for (owner, lock, grant) in &saved.grants {
            let Some(owner_ref) = hold_with(owner, lock, grant.token) else {
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
            // A grant saved twice: the last one counts, as for its token.
            let told = grants.told.entry(owner_ref).or_default();
            if grant.died.is_empty() {
                told.remove(lock);
            } else {
                told.insert(lock.clone(), grant.died.clone());
            }
        }
        grants.told.retain(|_, told| !told.is_empty());
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

    /// Panics unless every holding's token was issued, every told death
    /// belongs to a lock its owner holds, and every mark is filed under
    /// its lock with an issued token.
    pub fn check_invariants<'a>(
        &self,
        holdings: impl Iterator<Item = (&'a OwnerRef, &'a Holdings)>,
    ) {
        let mut held_owners: BTreeMap<&OwnerRef, &Holdings> = BTreeMap::new();
        for (owner, held) in holdings {
            for (lock, holding) in held {
                assert!(
                    holding.token <= self.last_token,
                    "{owner} holds {lock} with the unissued token {}",
                    holding.token
                );
            }
            held_owners.insert(owner, held);
        }
        for (owner, told) in &self.told {
            assert!(!told.is_empty(), "an empty list of told deaths of {owner}");
            let held = held_owners
                .get(owner)
                .unwrap_or_else(|| panic!("told deaths of {owner}, who holds nothing"));
            for (lock, deaths) in told {
                assert!(!deaths.is_empty(), "an empty list of told deaths of {lock}");
                assert!(
                    held.contains_key(lock),
                    "told deaths of {lock}, which {owner} does not hold"
                );
            }
        }
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

#[cfg(test)]
mod tests {
    use super::super::allocation::Holding;
    use super::super::manager::LockManager;
    use super::super::owner::{Entry, Mode};
    use super::*;

    fn lock(text: &str) -> LockName {
        LockName::parse(text).expect("a lock name")
    }

    fn owner(job: u64) -> Owner {
        Owner::job(job, format!("/livelock/{job}"), 100 + job as u32)
    }

    /// Grants `names` exclusively to `owner` in one update.
    fn take(locks: &mut LockManager, owner: &Owner, names: &[&str]) {
        let request: Vec<Entry> = names
            .iter()
            .map(|name| Entry::exclusive(lock(name)))
            .collect();
        let update = locks.try_update(owner, &request).expect("no error");
        assert!(update.blockers.is_empty(), "blocked: {update:?}");
        locks.check_invariants();
    }

    fn told(locks: &LockManager, owner: &Owner, name: &str) -> Vec<(String, Token)> {
        let grant = locks.grant(owner, &lock(name)).expect("a grant");
        grant
            .died
            .iter()
            .map(|death| (death.lock.to_string(), death.token))
            .collect()
    }

    fn mark_count(locks: &LockManager) -> usize {
        locks.saved_extensions().grants.marks.len()
    }

    #[test]
    fn a_group_grant_is_told_of_every_marked_member_and_the_group() {
        let mut locks = LockManager::new();
        let dead = owner(1);
        take(&mut locks, &dead, &["node/[lockset]"]);
        take(&mut locks, &dead, &["node/n1", "node/n2"]);
        locks.free_dead(&dead);
        locks.check_invariants();

        let next = owner(2);
        take(&mut locks, &next, &["node/[lockset]"]);
        assert_eq!(
            told(&locks, &next, "node/[lockset]"),
            [
                ("node/[lockset]".to_string(), 1),
                ("node/n1".to_string(), 2),
                ("node/n2".to_string(), 2)
            ]
        );
        assert_eq!(mark_count(&locks), 0, "every mark was told");
    }

    #[test]
    fn a_union_raising_a_lock_it_gave_keeps_the_death_it_was_told_of() {
        let mut locks = LockManager::new();
        let dead = owner(1);
        take(&mut locks, &dead, &["instance/i1"]);
        locks.free_dead(&dead);

        let next = owner(2);
        let acquired = locks.opportunistic_union(
            &next,
            &[
                (lock("instance/i1"), Mode::Shared),
                (lock("instance/i1"), Mode::Exclusive),
            ],
        );
        locks.check_invariants();
        assert_eq!(acquired, [lock("instance/i1"), lock("instance/i1")]);
        assert_eq!(
            locks.mode_held(&next, &lock("instance/i1")),
            Some(Mode::Exclusive)
        );
        assert_eq!(
            told(&locks, &next, "instance/i1"),
            [("instance/i1".to_string(), 1)]
        );
        assert_eq!(locks.grant(&next, &lock("instance/i1")).unwrap().token, 2);
    }

    #[test]
    fn a_release_or_a_new_grant_forgets_the_deaths_told() {
        let mut locks = LockManager::new();
        let dead = owner(1);
        take(&mut locks, &dead, &["instance/i1", "instance/i2"]);
        locks.free_dead(&dead);
        let next = owner(2);
        let shared = [
            Entry::shared(lock("instance/i1")),
            Entry::shared(lock("instance/i2")),
        ];
        locks.try_update(&next, &shared).expect("no error");
        locks.check_invariants();
        assert_eq!(told(&locks, &next, "instance/i1").len(), 1);
        assert_eq!(told(&locks, &next, "instance/i2").len(), 1);
        // Raised to exclusive: a new grant, told of nothing.
        take(&mut locks, &next, &["instance/i2"]);
        assert_eq!(told(&locks, &next, "instance/i2"), []);
        assert_eq!(locks.grant(&next, &lock("instance/i2")).unwrap().token, 3);
        // Let go: nothing told is kept for it.
        locks
            .try_update(&next, &[Entry::release(lock("instance/i1"))])
            .expect("no error");
        locks.check_invariants();
        let saved = locks.saved_extensions().grants.grants;
        assert_eq!(saved.len(), 1);
        assert!(saved[0].2.died.is_empty());
    }

    #[test]
    fn owners_sharing_a_lock_that_all_died_are_all_told() {
        let mut locks = LockManager::new();
        let (first, second) = (owner(1), owner(2));
        let shared = [Entry::shared(lock("cluster/BGL"))];
        for sharer in [&first, &second] {
            locks.try_update(sharer, &shared).expect("no error");
        }
        for dead in [&first, &second] {
            locks.free_dead(dead);
            locks.check_invariants();
        }
        let next = owner(3);
        take(&mut locks, &next, &["cluster/BGL"]);
        assert_eq!(
            told(&locks, &next, "cluster/BGL"),
            [
                ("cluster/BGL".to_string(), 1),
                ("cluster/BGL".to_string(), 2)
            ]
        );
        assert_eq!(mark_count(&locks), 0);
    }

    #[test]
    fn the_bound_forgets_the_oldest_deaths_of_a_shared_lock_too() {
        let mut grants = Grants::default();
        let held = |token| {
            Holdings::from([(
                lock("cluster/BGL"),
                Holding {
                    mode: Mode::Shared,
                    token,
                },
            )])
        };
        grants.issued(1);
        grants.issued(2);
        grants.died(&owner(1), &held(1), 1);
        grants.died(&owner(2), &held(2), 1);
        let kept: Vec<Token> = grants.marks().map(|death| death.token).collect();
        assert_eq!(kept, [2]);
    }

    #[test]
    fn a_member_grant_is_told_of_its_group_and_leaves_the_mark() {
        let mut locks = LockManager::new();
        let dead = owner(1);
        take(&mut locks, &dead, &["node/[lockset]"]);
        locks.free_dead(&dead);
        let next = owner(2);
        take(&mut locks, &next, &["node/n1"]);
        assert_eq!(
            told(&locks, &next, "node/n1"),
            [("node/[lockset]".to_string(), 1)]
        );
        assert_eq!(mark_count(&locks), 1);
    }
}
