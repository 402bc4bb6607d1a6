//! Fencing tokens and told deaths as the harness saw them (D65, D66), and
//! the pure checks over them.
//!
//! wconfd answers only what is durable (a turn's replies wait for its
//! journal write), so every token seen in an answer (a fenced grant, a
//! listing with tokens, a told death, a job's `why` entry) was issued for
//! good, across any kill -9 that comes after. Hence:
//! - a grant's token is above [`Fences::high`] as it was when its request
//!   was sent: the highest token seen in any answer read before, before a
//!   crash of wconfd or after it;
//! - a token belongs to one owner, and, where a lock client knows its
//!   grants, to one grant.
//!
//! A told death (`{"lock", "owner", "token"}`) names a lock the dead owner
//! held, with that holding's token: lower than the token of the grant it
//! is told to (the death came first), and the granted lock itself, its
//! group or one of its members. Each death is kept once, with the moment
//! it was first seen; the final checks hold it against what the harness
//! knows of how that owner ended ([`DeadOwner`] for a lock client's).

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use crate::locks::LockName;

/// What is known of the token a killed owner held a lock with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBound {
    /// The grant's token, if its client knew it.
    pub exact: Option<u64>,
    /// The token is above this: the highest token seen when the request
    /// was sent.
    pub above: u64,
}

impl TokenBound {
    pub fn admits(&self, token: u64) -> bool {
        token > self.above && self.exact.is_none_or(|exact| exact == token)
    }

    /// Either of two ways the lock may have been held.
    pub fn or(self, other: TokenBound) -> TokenBound {
        TokenBound {
            exact: if self.exact == other.exact {
                self.exact
            } else {
                None
            },
            above: self.above.min(other.above),
        }
    }
}

/// A lock client's owner found killed: when, and every lock it may have
/// held then (held, asked for in a request in flight or pending).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeadOwner {
    pub killed_us: u64,
    pub might_hold: BTreeMap<String, TokenBound>,
}

/// A dead previous holder as wconfd tells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Death {
    pub lock: String,
    /// The owner on the wire, `[ident, livelock, pid]`.
    pub owner: Value,
    pub token: u64,
}

impl Death {
    pub fn decode(value: &Value) -> Option<Death> {
        let owner = value.get("owner")?;
        owner.get(2)?.as_u64()?;
        Some(Death {
            lock: value.get("lock")?.as_str()?.to_owned(),
            owner: owner.clone(),
            token: value.get("token")?.as_u64()?,
        })
    }

    /// The dead owner's ident as JSON text (`12` for a job, `"name"`).
    pub fn ident(&self) -> String {
        self.owner[0].to_string()
    }
}

/// Where and when a death was first told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Told {
    pub first_seen_us: u64,
    pub told_to: String,
}

/// Whom a token was issued to.
#[derive(Debug)]
struct Issued {
    ident: String,
    /// The lock client's number of the grant, once known.
    grant: Option<u64>,
}

/// Every token and death the harness saw.
#[derive(Debug, Default)]
pub struct Fences {
    high: u64,
    issued: HashMap<u64, Issued>,
    told: BTreeMap<(String, String, u64), (Death, Told)>,
    /// The lock clients' owners found killed, by their owner on the wire
    /// (as text).
    dead: BTreeMap<String, DeadOwner>,
}

impl Fences {
    /// The highest token seen in any answer so far (0: none): read before
    /// a request is sent.
    pub fn high(&self) -> u64 {
        self.high
    }

    /// A grant acknowledged to `ident` with `token`, the client's grant
    /// number `grant`; `high_before` is [`Fences::high`] as it was when its
    /// request was sent.
    pub fn granted(
        &mut self,
        token: u64,
        ident: &str,
        grant: u64,
        high_before: u64,
    ) -> Result<(), String> {
        if token <= high_before {
            self.high = self.high.max(token);
            return Err(format!(
                "a grant to {ident} has token {token}, yet token {high_before} was seen \
                 before its request was sent: a token was issued again or went back"
            ));
        }
        self.own(token, ident, Some(grant))
    }

    /// A token seen held by `ident` (a listing, a told death, a job's log).
    pub fn seen(&mut self, token: u64, ident: &str) -> Result<(), String> {
        self.own(token, ident, None)
    }

    fn own(&mut self, token: u64, ident: &str, grant: Option<u64>) -> Result<(), String> {
        if token == 0 {
            return Err(format!(
                "{ident} holds a lock with token 0, which is never issued"
            ));
        }
        self.high = self.high.max(token);
        let issued = self.issued.entry(token).or_insert_with(|| Issued {
            ident: ident.to_owned(),
            grant,
        });
        if issued.ident != ident {
            return Err(format!(
                "token {token} was issued to {} and to {ident}",
                issued.ident
            ));
        }
        match (issued.grant, grant) {
            (Some(first), Some(second)) if first != second => Err(format!(
                "token {token} was issued to two grants of {ident} (its grants {first} \
                 and {second})"
            )),
            (None, Some(_)) => {
                issued.grant = grant;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// How many tokens were seen.
    pub fn tokens(&self) -> usize {
        self.issued.len()
    }

    /// A death told to `told_to` (for reports) at `seen_us`. `grant`: the
    /// token of the grant it was told to and the locks it gave (none: not
    /// known).
    pub fn told(
        &mut self,
        death: &Value,
        seen_us: u64,
        told_to: &str,
        grant: (u64, &[String]),
    ) -> Result<(), String> {
        let Some(death) = Death::decode(death) else {
            return Err(format!("{told_to} was told a malformed death {death}"));
        };
        let (grant_token, granted) = grant;
        if death.token >= grant_token {
            return Err(format!(
                "{told_to} (token {grant_token}) was told of a death with token {}, \
                 not below its own: {death:?}",
                death.token
            ));
        }
        if !granted.is_empty() && !granted.iter().any(|lock| related(lock, &death.lock)) {
            return Err(format!(
                "{told_to} was told of a death of {}, neither a lock it was granted \
                 ({granted:?}), their group nor a member",
                death.lock
            ));
        }
        self.seen(death.token, &death.ident())?;
        let key = (death.lock.clone(), death.owner.to_string(), death.token);
        let entry = self.told.entry(key).or_insert_with(|| {
            (
                death.clone(),
                Told {
                    first_seen_us: seen_us,
                    told_to: told_to.to_owned(),
                },
            )
        });
        if seen_us < entry.1.first_seen_us {
            entry.1 = Told {
                first_seen_us: seen_us,
                told_to: told_to.to_owned(),
            };
        }
        Ok(())
    }

    /// Every death told, once each.
    pub fn told_deaths(&self) -> impl Iterator<Item = &(Death, Told)> {
        self.told.values()
    }

    /// A `listAllLocksOwners [{"tokens": true}]` answer read at `seen_us`:
    /// its tokens and deaths. The errors found.
    pub fn observe_table(&mut self, table: &Value, seen_us: u64) -> Vec<String> {
        let mut errors = Vec::new();
        for row in table.as_array().into_iter().flatten() {
            let Some(lock) = row[0].as_str() else {
                errors.push(format!("listAllLocksOwners has a malformed row {row}"));
                continue;
            };
            for holder in row[1].as_array().into_iter().flatten() {
                let grant = &holder[2];
                let Some(token) = grant["token"].as_u64() else {
                    errors.push(format!(
                        "listAllLocksOwners with tokens shows {lock} held without a token: \
                         {holder}"
                    ));
                    continue;
                };
                let owner = &holder[0];
                if let Err(error) = self.seen(token, &owner[0].to_string()) {
                    errors.push(format!("listAllLocksOwners: {error}"));
                }
                let told_to = format!("the holding of {lock} by {owner}");
                let locks = [lock.to_owned()];
                for death in grant["died"].as_array().into_iter().flatten() {
                    if let Err(error) = self.told(death, seen_us, &told_to, (token, &locks)) {
                        errors.push(format!("listAllLocksOwners: {error}"));
                    }
                }
            }
        }
        errors
    }

    /// A lock client's owner was found killed.
    pub fn died(&mut self, owner: &Value, dead: DeadOwner) {
        self.dead.insert(owner.to_string(), dead);
    }

    pub fn dead(&self, owner: &Value) -> Option<&DeadOwner> {
        self.dead.get(&owner.to_string())
    }
}

/// Whether a death of `dead` may be told to a grant of `granted`: the same
/// lock, or a group and one of its members.
fn related(granted: &str, dead: &str) -> bool {
    if granted == dead {
        return true;
    }
    let (Ok(granted), Ok(dead)) = (LockName::parse(granted), LockName::parse(dead)) else {
        return false;
    };
    granted.group().as_ref() == Some(&dead) || dead.group().as_ref() == Some(&granted)
}

/// A death told of a lock client's owner: it was killed before the death
/// was told, holding that lock (not released before), with that token.
pub fn check_against(death: &Death, told: &Told, dead: &DeadOwner) -> Result<(), String> {
    if told.first_seen_us <= dead.killed_us {
        return Err(format!("it was killed only at {} µs", dead.killed_us));
    }
    match dead.might_hold.get(&death.lock) {
        None => Err(format!(
            "it did not hold that lock when it was killed (released before, or never \
             taken): it may have held {:?}",
            dead.might_hold.keys().collect::<Vec<_>>()
        )),
        Some(bound) if !bound.admits(death.token) => {
            Err(format!("it held that lock with another token: {bound:?}"))
        }
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn death(lock: &str, ident: &str, token: u64) -> Value {
        json!({"lock": lock, "owner": [ident, "/l/x", 7], "token": token})
    }

    #[test]
    fn a_grant_is_above_every_token_seen_before_its_request() {
        let mut fences = Fences::default();
        let before = fences.high();
        fences.granted(1, "\"a\"", 1, before).unwrap();
        fences.seen(5, "12").unwrap();
        assert_eq!(fences.high(), 5);
        // Requests in flight together may be answered in any order.
        fences.granted(7, "\"a\"", 2, 5).unwrap();
        fences.granted(6, "\"b\"", 1, 5).unwrap();
        let error = fences.granted(4, "\"c\"", 1, 5).unwrap_err();
        assert!(error.contains("went back"), "{error}");
        assert!(fences.granted(8, "\"c\"", 1, 8).is_err());
        assert!(fences.seen(0, "\"c\"").is_err());
    }

    #[test]
    fn a_token_belongs_to_one_grant_of_one_owner() {
        let mut fences = Fences::default();
        fences.granted(3, "\"a\"", 1, 0).unwrap();
        // Seen again: the same grant in a listing, or learnt.
        fences.seen(3, "\"a\"").unwrap();
        fences.granted(3, "\"a\"", 1, 0).unwrap();
        assert!(fences.seen(3, "12").unwrap_err().contains("issued to"));
        assert!(
            fences
                .granted(3, "\"a\"", 2, 0)
                .unwrap_err()
                .contains("two grants")
        );
        fences.seen(4, "12").unwrap();
        fences.granted(4, "12", 9, 0).unwrap();
        assert!(fences.granted(4, "12", 10, 0).is_err());
    }

    #[test]
    fn a_told_death_comes_before_its_grant_and_concerns_its_locks() {
        let mut fences = Fences::default();
        let granted = ["node/n1".to_owned()];
        fences
            .told(&death("node/n1", "a", 3), 100, "g", (5, &granted))
            .unwrap();
        fences
            .told(&death("node/[lockset]", "b", 4), 90, "g", (5, &granted))
            .unwrap();
        assert!(
            fences
                .told(&death("node/n2", "c", 2), 100, "g", (5, &granted))
                .is_err()
        );
        assert!(
            fences
                .told(&death("node/n1", "c", 5), 100, "g", (5, &granted))
                .is_err()
        );
        let group = ["node/[lockset]".to_owned()];
        fences
            .told(&death("node/n3", "d", 1), 100, "h", (6, &group))
            .unwrap();
        // Unknown locks: only the order is checked.
        fences
            .told(&death("cluster/BGL", "d", 1), 80, "j", (6, &[]))
            .unwrap();
        assert!(
            fences
                .told(&json!({"lock": "x"}), 1, "g", (5, &[]))
                .is_err()
        );
        // A token of a dead owner is its own.
        assert!(fences.seen(3, "12").is_err());
        let told: Vec<(&str, u64)> = fences
            .told_deaths()
            .map(|(death, told)| (death.lock.as_str(), told.first_seen_us))
            .collect();
        assert_eq!(
            told,
            [
                ("cluster/BGL", 80),
                ("node/[lockset]", 90),
                ("node/n1", 100),
                ("node/n3", 100)
            ]
        );
    }

    #[test]
    fn a_listing_yields_tokens_and_deaths() {
        let mut fences = Fences::default();
        let table = json!([
            ["cluster/BGL", [[["a", "/l/a", 1], "shared", {"token": 4}],
                             [[12, "/l/j", 2], "shared"]]],
            ["node/n1", [[["a", "/l/a", 1], "exclusive",
                          {"token": 4, "died": [death("node/n1", "z", 2)]}]]],
            ["node/n2", [[["b", "/l/b", 3], "shared", {"token": 4}]]],
        ]);
        let errors = fences.observe_table(&table, 50);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].contains("without a token"), "{errors:?}");
        assert!(errors[1].contains("issued to"), "{errors:?}");
        assert_eq!(fences.high(), 4);
        assert_eq!(fences.told_deaths().count(), 1);
    }

    #[test]
    fn a_death_of_a_killed_owner_matches_what_it_held() {
        let dead = DeadOwner {
            killed_us: 100,
            might_hold: BTreeMap::from([
                (
                    "cluster/BGL".to_owned(),
                    TokenBound {
                        exact: Some(7),
                        above: 5,
                    },
                ),
                (
                    "node/n1".to_owned(),
                    TokenBound {
                        exact: None,
                        above: 8,
                    },
                ),
            ]),
        };
        let told = |at: u64| Told {
            first_seen_us: at,
            told_to: "g".to_owned(),
        };
        let of = |lock: &str, token: u64| Death::decode(&death(lock, "a", token)).expect("a death");
        check_against(&of("cluster/BGL", 7), &told(101), &dead).unwrap();
        check_against(&of("node/n1", 9), &told(101), &dead).unwrap();
        assert!(check_against(&of("cluster/BGL", 7), &told(100), &dead).is_err());
        assert!(check_against(&of("cluster/BGL", 6), &told(101), &dead).is_err());
        assert!(check_against(&of("node/n1", 8), &told(101), &dead).is_err());
        assert!(check_against(&of("node/n2", 9), &told(101), &dead).is_err());
        let either = TokenBound {
            exact: Some(7),
            above: 5,
        }
        .or(TokenBound {
            exact: None,
            above: 3,
        });
        assert_eq!(
            either,
            TokenBound {
                exact: None,
                above: 3
            }
        );
    }
}
