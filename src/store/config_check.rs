//! The configuration lock check (`[wconfd] config_lock_check`, D70): which
//! instances, nodes and node groups a configuration write changes whose
//! locks the writer does not hold exclusively.
//!
//! Pure: given the stored configuration, the one being written and the
//! writer's holdings, [`violations`] lists each entity changed without its
//! lock. The locks are Ganeti 3.0's: an instance is locked by its name
//! (`instance/<name>`), a node and a node group by their uuid
//! (`node/<uuid>`, `nodegroup/<uuid>`); `config.data` keeps each kind in a
//! map keyed by uuid (`instances`, `nodes`, `nodegroups`), an entity's
//! name in its `name`.
//!
//! - An entity added, removed or changed in anything counts as changed.
//! - A renamed instance needs the locks of its old and its new name.
//! - A lock is held enough if the writer holds it, its group
//!   (`instance/[lockset]`), `cluster/BGL` or `cluster/[lockset]`
//!   exclusively; shared is never enough.
//! - An entity whose lock cannot be named (an instance without a name, a
//!   key that is no lock name) needs its level's group lock.

use std::collections::BTreeSet;
use std::fmt::{self, Write as _};

use serde_json::{Map, Value};

use crate::limits::CONFIG_VIOLATIONS_NAMED_MAX;
use crate::locks::{LockName, Mode};

/// What wconfd does with a write that changes entities whose locks the
/// writer does not hold exclusively.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigLockCheck {
    /// No check (Ganeti's behaviour).
    Off,
    /// The write proceeds; the violations are logged, told as an event and
    /// counted.
    Log,
    /// The write is refused and nothing changes; the violations are logged,
    /// told and counted as well.
    Refuse,
}

impl ConfigLockCheck {
    pub fn parse(text: &str) -> Option<ConfigLockCheck> {
        match text {
            "off" => Some(ConfigLockCheck::Off),
            "log" => Some(ConfigLockCheck::Log),
            "refuse" => Some(ConfigLockCheck::Refuse),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ConfigLockCheck::Off => "off",
            ConfigLockCheck::Log => "log",
            ConfigLockCheck::Refuse => "refuse",
        }
    }
}

/// The kinds of entity checked, in lock order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EntityKind {
    Instance,
    NodeGroup,
    Node,
}

impl EntityKind {
    pub const ALL: [EntityKind; 3] = [
        EntityKind::Instance,
        EntityKind::NodeGroup,
        EntityKind::Node,
    ];

    /// As events, metrics and messages name it (the lock level's name).
    pub fn as_str(self) -> &'static str {
        match self {
            EntityKind::Instance => "instance",
            EntityKind::NodeGroup => "nodegroup",
            EntityKind::Node => "node",
        }
    }

    /// The section of `config.data` that holds this kind.
    fn section(self) -> &'static str {
        match self {
            EntityKind::Instance => "instances",
            EntityKind::NodeGroup => "nodegroups",
            EntityKind::Node => "nodes",
        }
    }

    /// Its lock for `member` (an instance's name, a uuid), or the level's
    /// group lock if `member` names no lock.
    fn lock(self, member: Option<&str>) -> LockName {
        let group = match self {
            EntityKind::Instance => LockName::InstanceSet,
            EntityKind::NodeGroup => LockName::NodeGroupSet,
            EntityKind::Node => LockName::NodeSet,
        };
        let Some(member) = member else {
            return group;
        };
        match LockName::parse(&format!("{}/{member}", self.as_str())) {
            Ok(lock) if !lock.is_group() => lock,
            _ => group,
        }
    }
}

impl fmt::Display for EntityKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the write changes an entity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    Added,
    Removed,
    Changed,
}

impl Change {
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Added => "added",
            Change::Removed => "removed",
            Change::Changed => "changed",
        }
    }
}

/// An entity the write changes without the writer holding its locks
/// exclusively.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub kind: EntityKind,
    /// Its key in its section of `config.data`.
    pub uuid: String,
    /// Its name in the new configuration (the old one if removed), if it
    /// has one.
    pub name: Option<String>,
    pub change: Change,
    /// The locks it needs that are not held exclusively, in lock order;
    /// never empty.
    pub locks: Vec<LockName>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind)?;
        if let Some(name) = &self.name {
            write!(f, " {name}")?;
        }
        write!(f, " (uuid {}, {}) needs ", self.uuid, self.change.as_str())?;
        for (index, lock) in self.locks.iter().enumerate() {
            if index > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{lock}")?;
        }
        Ok(())
    }
}

/// Every instance, node and node group that `new` adds, removes or changes
/// against `old` whose locks `held` (the writer's mode of each lock it
/// holds directly) does not cover exclusively, ordered by the first lock
/// each needs (then kind and uuid). Both configurations must have passed
/// `verify` (their sections are objects or absent).
pub fn violations<'a>(
    old: &'a Value,
    new: &'a Value,
    held: impl Fn(&LockName) -> Option<Mode>,
) -> Vec<Violation> {
    let exclusive = |lock: &LockName| held(lock) == Some(Mode::Exclusive);
    if exclusive(&LockName::ClusterSet) || exclusive(&LockName::Bgl) {
        return Vec::new();
    }
    let covered =
        |lock: &LockName| exclusive(lock) || lock.group().is_some_and(|group| exclusive(&group));
    let mut found = Vec::new();
    for kind in EntityKind::ALL {
        let section = |config: &'a Value| config.get(kind.section()).and_then(Value::as_object);
        let (before, after) = (section(old), section(new));
        let entities = |section: Option<&'a Map<String, Value>>| section.into_iter().flatten();
        let changed = entities(before)
            .filter_map(
                |(uuid, was)| match after.and_then(|after| after.get(uuid)) {
                    None => Some((uuid, Some(was), None)),
                    Some(is) if is != was => Some((uuid, Some(was), Some(is))),
                    Some(_) => None,
                },
            )
            .chain(
                entities(after)
                    .filter(|(uuid, _)| !before.is_some_and(|before| before.contains_key(*uuid)))
                    .map(|(uuid, is)| (uuid, None, Some(is))),
            );
        for (uuid, was, is) in changed {
            let change = match (was, is) {
                (None, _) => Change::Added,
                (_, None) => Change::Removed,
                _ => Change::Changed,
            };
            let name_of = |entity: Option<&Value>| -> Option<String> {
                entity
                    .and_then(|entity| entity.get("name"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            };
            let names = [name_of(was), name_of(is)];
            let needed: BTreeSet<LockName> = match kind {
                EntityKind::Instance => names
                    .iter()
                    .zip([was, is])
                    .filter(|(_, entity)| entity.is_some())
                    .map(|(name, _)| kind.lock(name.as_deref()))
                    .collect(),
                EntityKind::NodeGroup | EntityKind::Node => BTreeSet::from([kind.lock(Some(uuid))]),
            };
            let locks: Vec<LockName> = needed.into_iter().filter(|lock| !covered(lock)).collect();
            if locks.is_empty() {
                continue;
            }
            let [old_name, new_name] = names;
            found.push(Violation {
                kind,
                uuid: uuid.clone(),
                name: new_name.or(old_name),
                change,
                locks,
            });
        }
    }
    found.sort_by(|a, b| (&a.locks[0], a.kind, &a.uuid).cmp(&(&b.locks[0], b.kind, &b.uuid)));
    found
}

/// How many of `violations` are of each kind, in [`EntityKind::ALL`]'s
/// order.
pub fn counts(violations: &[Violation]) -> [u64; 3] {
    let mut counts = [0; 3];
    for violation in violations {
        let index = EntityKind::ALL
            .iter()
            .position(|kind| *kind == violation.kind)
            .expect("every kind is listed");
        counts[index] += 1;
    }
    counts
}

/// The violations for people: the first [`CONFIG_VIOLATIONS_NAMED_MAX`],
/// `; `-separated, and how many more there are.
pub fn describe(violations: &[Violation]) -> String {
    let mut text = String::new();
    for (index, violation) in violations
        .iter()
        .take(CONFIG_VIOLATIONS_NAMED_MAX)
        .enumerate()
    {
        if index > 0 {
            text.push_str("; ");
        }
        let _ = write!(text, "{violation}");
    }
    if violations.len() > CONFIG_VIOLATIONS_NAMED_MAX {
        let _ = write!(
            text,
            "; and {} more",
            violations.len() - CONFIG_VIOLATIONS_NAMED_MAX
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    fn lock(text: &str) -> LockName {
        LockName::parse(text).expect("a lock name")
    }

    fn holding(entries: &[(&str, Mode)]) -> BTreeMap<LockName, Mode> {
        entries
            .iter()
            .map(|(name, mode)| (lock(name), *mode))
            .collect()
    }

    fn check(old: &Value, new: &Value, entries: &[(&str, Mode)]) -> Vec<Violation> {
        let held = holding(entries);
        violations(old, new, |lock| held.get(lock).copied())
    }

    /// What each violation says: kind, uuid, change and locks.
    fn said(found: &[Violation]) -> Vec<String> {
        found
            .iter()
            .map(|violation| {
                let locks: Vec<String> = violation.locks.iter().map(ToString::to_string).collect();
                format!(
                    "{} {} {} {}",
                    violation.kind,
                    violation.uuid,
                    violation.change.as_str(),
                    locks.join(",")
                )
            })
            .collect()
    }

    fn base() -> Value {
        json!({
            "cluster": {"cluster_name": "c"},
            "instances": {
                "i-uuid-1": {"name": "web1", "primary_node": "n-uuid-1", "admin_state": "up"},
                "i-uuid-2": {"name": "db1", "primary_node": "n-uuid-2", "admin_state": "up"},
            },
            "nodes": {
                "n-uuid-1": {"name": "node1", "group": "g-uuid-1", "offline": false},
                "n-uuid-2": {"name": "node2", "group": "g-uuid-1", "offline": false},
            },
            "nodegroups": {
                "g-uuid-1": {"name": "default", "alloc_policy": "preferred"},
            },
            "serial_no": 3,
        })
    }

    use Mode::{Exclusive, Shared};

    #[test]
    fn the_setting_parses_its_three_words_only() {
        for check in [
            ConfigLockCheck::Off,
            ConfigLockCheck::Log,
            ConfigLockCheck::Refuse,
        ] {
            assert_eq!(ConfigLockCheck::parse(check.as_str()), Some(check));
        }
        for bad in ["", "Off", "warn", "refuse "] {
            assert_eq!(ConfigLockCheck::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn nothing_changed_is_no_violation_even_holding_nothing() {
        assert_eq!(check(&base(), &base(), &[]), []);
        // Nor are changes outside the three kinds.
        let mut new = base();
        new["cluster"]["cluster_name"] = json!("d");
        new["networks"] = json!({"net-1": {"name": "n"}});
        new["serial_no"] = json!(4);
        assert_eq!(check(&base(), &new, &[]), []);
    }

    #[test]
    fn each_kind_changed_needs_its_own_lock() {
        let mut new = base();
        new["instances"]["i-uuid-1"]["admin_state"] = json!("down");
        new["nodes"]["n-uuid-2"]["offline"] = json!(true);
        new["nodegroups"]["g-uuid-1"]["alloc_policy"] = json!("last_resort");
        let found = check(&base(), &new, &[("cluster/BGL", Shared)]);
        assert_eq!(
            said(&found),
            [
                "instance i-uuid-1 changed instance/web1",
                "nodegroup g-uuid-1 changed nodegroup/g-uuid-1",
                "node n-uuid-2 changed node/n-uuid-2",
            ]
        );
        assert_eq!(found[0].name.as_deref(), Some("web1"));
        assert_eq!(found[2].name.as_deref(), Some("node2"));
        // Held exclusively, each is fine.
        let held = [
            ("cluster/BGL", Shared),
            ("instance/web1", Exclusive),
            ("nodegroup/g-uuid-1", Exclusive),
            ("node/n-uuid-2", Exclusive),
        ];
        assert_eq!(check(&base(), &new, &held), []);
        // Nodes by uuid, not by name.
        let by_name = [
            ("instance/web1", Exclusive),
            ("nodegroup/g-uuid-1", Exclusive),
            ("node/node2", Exclusive),
        ];
        assert_eq!(
            said(&check(&base(), &new, &by_name)),
            ["node n-uuid-2 changed node/n-uuid-2"]
        );
    }

    #[test]
    fn added_and_removed_entities_count_as_changed() {
        let mut new = base();
        new["instances"]["i-uuid-3"] = json!({"name": "web2"});
        new["instances"].as_object_mut().unwrap().remove("i-uuid-2");
        new["nodes"]["n-uuid-3"] = json!({"name": "node3"});
        new["nodegroups"]
            .as_object_mut()
            .unwrap()
            .remove("g-uuid-1");
        let found = check(&base(), &new, &[]);
        assert_eq!(
            said(&found),
            [
                "instance i-uuid-2 removed instance/db1",
                "instance i-uuid-3 added instance/web2",
                "nodegroup g-uuid-1 removed nodegroup/g-uuid-1",
                "node n-uuid-3 added node/n-uuid-3",
            ]
        );
        // A removed entity is named as it was.
        assert_eq!(found[0].name.as_deref(), Some("db1"));
        // A whole section gone removes each of its entities.
        let mut gone = base();
        gone.as_object_mut().unwrap().remove("nodes");
        assert_eq!(
            said(&check(&base(), &gone, &[])),
            [
                "node n-uuid-1 removed node/n-uuid-1",
                "node n-uuid-2 removed node/n-uuid-2"
            ]
        );
    }

    #[test]
    fn a_rename_needs_the_old_and_the_new_name() {
        let mut new = base();
        new["instances"]["i-uuid-1"]["name"] = json!("web9");
        assert_eq!(
            said(&check(&base(), &new, &[])),
            ["instance i-uuid-1 changed instance/web1,instance/web9"]
        );
        assert_eq!(
            said(&check(&base(), &new, &[("instance/web1", Exclusive)])),
            ["instance i-uuid-1 changed instance/web9"]
        );
        let found = check(&base(), &new, &[("instance/web9", Exclusive)]);
        assert_eq!(said(&found), ["instance i-uuid-1 changed instance/web1"]);
        assert_eq!(found[0].name.as_deref(), Some("web9"));
        let both = [("instance/web1", Exclusive), ("instance/web9", Exclusive)];
        assert_eq!(check(&base(), &new, &both), []);
    }

    #[test]
    fn the_bgl_or_the_cluster_set_held_exclusively_covers_everything() {
        let mut new = base();
        new["instances"]["i-uuid-1"]["name"] = json!("web9");
        new["nodes"]["n-uuid-3"] = json!({"name": "node3"});
        new["nodegroups"]["g-uuid-2"] = json!({"name": "other"});
        for cover in ["cluster/BGL", "cluster/[lockset]"] {
            assert_eq!(check(&base(), &new, &[(cover, Exclusive)]), [], "{cover}");
            assert_eq!(check(&base(), &new, &[(cover, Shared)]).len(), 3, "{cover}");
        }
    }

    #[test]
    fn a_group_lock_held_exclusively_covers_its_members_only() {
        let mut new = base();
        new["instances"]["i-uuid-1"]["name"] = json!("web9");
        new["instances"]["i-uuid-2"]["admin_state"] = json!("down");
        new["nodes"]["n-uuid-1"]["offline"] = json!(true);
        assert_eq!(
            said(&check(&base(), &new, &[("instance/[lockset]", Exclusive)])),
            ["node n-uuid-1 changed node/n-uuid-1"]
        );
        assert_eq!(
            said(&check(&base(), &new, &[("node/[lockset]", Exclusive)])),
            [
                "instance i-uuid-2 changed instance/db1",
                "instance i-uuid-1 changed instance/web1,instance/web9",
            ]
        );
        // node-res is another level: its group covers no node.
        assert_eq!(
            check(&base(), &new, &[("node-res/[lockset]", Exclusive)]).len(),
            3
        );
    }

    #[test]
    fn shared_is_never_enough() {
        let mut new = base();
        new["instances"]["i-uuid-1"]["admin_state"] = json!("down");
        new["nodes"]["n-uuid-1"]["offline"] = json!(true);
        let shared = [
            ("cluster/[lockset]", Shared),
            ("cluster/BGL", Shared),
            ("instance/[lockset]", Shared),
            ("instance/web1", Shared),
            ("node/[lockset]", Shared),
            ("node/n-uuid-1", Shared),
        ];
        assert_eq!(
            said(&check(&base(), &new, &shared)),
            [
                "instance i-uuid-1 changed instance/web1",
                "node n-uuid-1 changed node/n-uuid-1"
            ]
        );
    }

    #[test]
    fn an_entity_without_a_lock_name_needs_its_group_lock() {
        let mut new = base();
        new["instances"]["i-uuid-1"] = json!({"admin_state": "down"});
        new["instances"]["i-uuid-4"] = json!(7);
        new["instances"]["i-uuid-5"] = json!({"name": ""});
        new["nodes"][""] = json!({"name": "blank"});
        new["nodes"]["x".repeat(2000)] = json!({"name": "long"});
        let found = check(&base(), &new, &[("instance/web1", Exclusive)]);
        assert_eq!(
            said(&found),
            [
                "instance i-uuid-1 changed instance/[lockset]",
                "instance i-uuid-4 added instance/[lockset]",
                "instance i-uuid-5 added instance/[lockset]",
                "node  added node/[lockset]",
                format!("node {} added node/[lockset]", "x".repeat(2000)).as_str(),
            ]
        );
        let held = [
            ("instance/[lockset]", Exclusive),
            ("node/[lockset]", Exclusive),
        ];
        assert_eq!(check(&base(), &new, &held), []);
        // A member named like the group lock is the group lock.
        let mut tricky = base();
        tricky["instances"]["i-uuid-6"] = json!({"name": "[lockset]"});
        assert_eq!(
            said(&check(&base(), &tricky, &[])),
            ["instance i-uuid-6 added instance/[lockset]"]
        );
    }

    #[test]
    fn violations_come_in_lock_order() {
        let mut new = base();
        for name in ["b", "a", "c"] {
            new["nodes"][format!("n-{name}")] = json!({"name": name});
            new["nodegroups"][format!("g-{name}")] = json!({"name": name});
            new["instances"][format!("i-{name}")] = json!({"name": format!("z{name}")});
        }
        let locks: Vec<String> = check(&base(), &new, &[])
            .iter()
            .map(|violation| violation.locks[0].to_string())
            .collect();
        assert_eq!(
            locks,
            [
                "instance/za",
                "instance/zb",
                "instance/zc",
                "nodegroup/g-a",
                "nodegroup/g-b",
                "nodegroup/g-c",
                "node/n-a",
                "node/n-b",
                "node/n-c",
            ]
        );
    }

    #[test]
    fn the_description_names_at_most_ten_and_says_how_many_more() {
        let mut new = base();
        for index in 0..13 {
            new["nodes"][format!("n-{index:02}")] = json!({"name": format!("node-{index}")});
        }
        let found = check(&base(), &new, &[]);
        assert_eq!(found.len(), 13);
        assert_eq!(counts(&found), [0, 0, 13]);
        let text = describe(&found);
        assert_eq!(text.matches(" needs ").count(), CONFIG_VIOLATIONS_NAMED_MAX);
        assert!(
            text.starts_with("node node-0 (uuid n-00, added) needs node/n-00; "),
            "{text}"
        );
        assert!(text.contains("node/n-09"), "{text}");
        assert!(!text.contains("node/n-10"), "{text}");
        assert!(text.ends_with("; and 3 more"), "{text}");
        // Ten exactly: no "more".
        let text = describe(&found[..10]);
        assert!(!text.contains("more"), "{text}");
        let mut renamed = base();
        renamed["instances"]["i-uuid-1"]["name"] = json!("web9");
        let found = check(&base(), &renamed, &[]);
        assert_eq!(counts(&found), [1, 0, 0]);
        assert_eq!(
            describe(&found),
            "instance web9 (uuid i-uuid-1, changed) needs instance/web1, instance/web9"
        );
    }
}
