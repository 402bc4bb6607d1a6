//! Lock names, levels and the lock order (LOCKS.md, "Lock names, levels
//! and the lock order").

use std::fmt;
use std::sync::Arc;

use crate::limits::LOCK_NAME_BYTES_MAX;
use crate::text::shortened;

/// A lock level, as `freeLocksLevel` and `downGradeLocksLevel` name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    Cluster,
    Instance,
    NodeGroup,
    Node,
    NodeRes,
    Network,
    /// warden's own services (extension, D55): `service/reporter`, the
    /// lock whose holder is the elected reporter.
    Service,
    /// `cluster/config` alone: freeing level `cluster` does not free it.
    Config,
}

impl Level {
    pub const ALL: [Level; 8] = [
        Level::Cluster,
        Level::Instance,
        Level::NodeGroup,
        Level::Node,
        Level::NodeRes,
        Level::Network,
        Level::Service,
        Level::Config,
    ];

    /// The wire form of the level (`"node-res"`, `"config"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Cluster => "cluster",
            Level::Instance => "instance",
            Level::NodeGroup => "nodegroup",
            Level::Node => "node",
            Level::NodeRes => "node-res",
            Level::Network => "network",
            Level::Service => "service",
            Level::Config => "config",
        }
    }

    pub fn parse(text: &str) -> Result<Level, NameError> {
        Level::ALL
            .into_iter()
            .find(|level| level.as_str() == text)
            .ok_or_else(|| NameError::UnknownLevel(shortened(text)))
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The member name inside a level (`"n1"` of `node/n1`). Shared, because one
/// name sits in several indexes.
pub type MemberName = Arc<str>;

/// A lock. The derived order of the variants *is* the lock order of
/// LOCKS.md; members of one level sort by name, byte-wise.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LockName {
    /// `cluster/[lockset]`
    ClusterSet,
    /// `cluster/BGL`, the big Ganeti lock; a member of `cluster/[lockset]`.
    Bgl,
    InstanceSet,
    Instance(MemberName),
    NodeGroupSet,
    NodeGroup(MemberName),
    NodeSet,
    Node(MemberName),
    NodeResSet,
    NodeRes(MemberName),
    NetworkSet,
    Network(MemberName),
    ServiceSet,
    Service(MemberName),
    /// `cluster/config`, last in the order, on level `config`.
    Config,
}

/// Why a text is not a lock name or level.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NameError {
    UnknownLevel(String),
    Malformed(String),
    TooLong(usize),
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NameError::UnknownLevel(text) => write!(f, "Unknown lock-level name '{text}'"),
            NameError::Malformed(text) => write!(f, "Unknown lock name '{text}'"),
            NameError::TooLong(bytes) => write!(
                f,
                "Lock name of {bytes} bytes is longer than the limit of {LOCK_NAME_BYTES_MAX}"
            ),
        }
    }
}

impl std::error::Error for NameError {}

/// A lock name taken apart: a lock of its own, or a member of a level.
enum Parts<'a> {
    Fixed(LockName),
    Member(Level, &'a str),
}

impl LockName {
    /// Parses the wire form `"<level>/<name>"`.
    pub fn parse(text: &str) -> Result<LockName, NameError> {
        Ok(match LockName::parts(text)? {
            Parts::Fixed(name) => name,
            Parts::Member(level, member) => {
                let member: MemberName = Arc::from(member);
                match level {
                    Level::Instance => LockName::Instance(member),
                    Level::NodeGroup => LockName::NodeGroup(member),
                    Level::Node => LockName::Node(member),
                    Level::NodeRes => LockName::NodeRes(member),
                    Level::Network => LockName::Network(member),
                    Level::Service => LockName::Service(member),
                    Level::Cluster | Level::Config => unreachable!("no members at this level"),
                }
            }
        })
    }

    /// The level of the lock `text` names, checked as [`LockName::parse`]
    /// checks it, without building the name.
    pub fn level_of(text: &str) -> Result<Level, NameError> {
        Ok(match LockName::parts(text)? {
            Parts::Fixed(name) => name.level(),
            Parts::Member(level, _) => level,
        })
    }

    fn parts(text: &str) -> Result<Parts<'_>, NameError> {
        if text.len() > LOCK_NAME_BYTES_MAX {
            return Err(NameError::TooLong(text.len()));
        }
        let malformed = || NameError::Malformed(shortened(text));
        let (level, member) = text.split_once('/').ok_or_else(malformed)?;
        let level = Level::parse(level).map_err(|_| malformed())?;
        if member.is_empty() {
            return Err(malformed());
        }
        match (level, member) {
            (Level::Cluster, "[lockset]") => Ok(Parts::Fixed(LockName::ClusterSet)),
            (Level::Cluster, "BGL") => Ok(Parts::Fixed(LockName::Bgl)),
            (Level::Cluster, "config") => Ok(Parts::Fixed(LockName::Config)),
            (Level::Cluster | Level::Config, _) => Err(malformed()),
            (level, "[lockset]") => Ok(Parts::Fixed(LockName::group_of_level(level))),
            (level, member) => Ok(Parts::Member(level, member)),
        }
    }

    /// The group lock of a level with groups. `Config` has none; asking for
    /// it is a programmer error.
    fn group_of_level(level: Level) -> LockName {
        match level {
            Level::Cluster => LockName::ClusterSet,
            Level::Instance => LockName::InstanceSet,
            Level::NodeGroup => LockName::NodeGroupSet,
            Level::Node => LockName::NodeSet,
            Level::NodeRes => LockName::NodeResSet,
            Level::Network => LockName::NetworkSet,
            Level::Service => LockName::ServiceSet,
            Level::Config => unreachable!("level config has no group lock"),
        }
    }

    pub fn level(&self) -> Level {
        match self {
            LockName::ClusterSet | LockName::Bgl => Level::Cluster,
            LockName::InstanceSet | LockName::Instance(_) => Level::Instance,
            LockName::NodeGroupSet | LockName::NodeGroup(_) => Level::NodeGroup,
            LockName::NodeSet | LockName::Node(_) => Level::Node,
            LockName::NodeResSet | LockName::NodeRes(_) => Level::NodeRes,
            LockName::NetworkSet | LockName::Network(_) => Level::Network,
            LockName::ServiceSet | LockName::Service(_) => Level::Service,
            LockName::Config => Level::Config,
        }
    }

    /// The group lock this lock is a member of (Ganeti's
    /// `lockImplications`): every named lock and the BGL have exactly one,
    /// group locks and `cluster/config` none.
    pub fn group(&self) -> Option<LockName> {
        match self {
            LockName::Bgl
            | LockName::Instance(_)
            | LockName::NodeGroup(_)
            | LockName::Node(_)
            | LockName::NodeRes(_)
            | LockName::Network(_)
            | LockName::Service(_) => Some(LockName::group_of_level(self.level())),
            _ => None,
        }
    }

    /// True for the `<level>/[lockset]` locks, which stand for their whole level.
    pub fn is_group(&self) -> bool {
        matches!(
            self,
            LockName::ClusterSet
                | LockName::InstanceSet
                | LockName::NodeGroupSet
                | LockName::NodeSet
                | LockName::NodeResSet
                | LockName::NetworkSet
                | LockName::ServiceSet
        )
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockName::ClusterSet => f.write_str("cluster/[lockset]"),
            LockName::Bgl => f.write_str("cluster/BGL"),
            LockName::Config => f.write_str("cluster/config"),
            LockName::InstanceSet
            | LockName::NodeGroupSet
            | LockName::NodeSet
            | LockName::NodeResSet
            | LockName::NetworkSet
            | LockName::ServiceSet => write!(f, "{}/[lockset]", self.level()),
            LockName::Instance(member)
            | LockName::NodeGroup(member)
            | LockName::Node(member)
            | LockName::NodeRes(member)
            | LockName::Network(member)
            | LockName::Service(member) => write!(f, "{}/{member}", self.level()),
        }
    }
}

impl std::str::FromStr for LockName {
    type Err = NameError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        LockName::parse(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(text: &str) -> LockName {
        LockName::parse(text).expect("valid lock name")
    }

    #[test]
    fn wire_forms_round_trip() {
        for text in [
            "cluster/[lockset]",
            "cluster/BGL",
            "instance/[lockset]",
            "instance/inst1.example.com",
            "nodegroup/[lockset]",
            "nodegroup/uuid-1",
            "node/[lockset]",
            "node/n1",
            "node-res/[lockset]",
            "node-res/n1",
            "network/[lockset]",
            "network/net0",
            "service/[lockset]",
            "service/reporter",
            "cluster/config",
            "node/with/slash",
        ] {
            assert_eq!(lock(text).to_string(), text);
        }
    }

    #[test]
    fn the_order_is_the_table_of_locks_md() {
        let table = [
            "cluster/[lockset]",
            "cluster/BGL",
            "instance/[lockset]",
            "instance/a",
            "instance/b",
            "nodegroup/[lockset]",
            "nodegroup/g",
            "node/[lockset]",
            "node/A",
            "node/a",
            "node-res/[lockset]",
            "node-res/a",
            "network/[lockset]",
            "network/a",
            "service/[lockset]",
            "service/reporter",
            "cluster/config",
        ];
        let locks: Vec<LockName> = table.iter().map(|text| lock(text)).collect();
        assert!(locks.windows(2).all(|pair| pair[0] < pair[1]));
    }

    #[test]
    fn groups_and_levels() {
        assert_eq!(lock("cluster/BGL").group(), Some(LockName::ClusterSet));
        assert_eq!(lock("node/n1").group(), Some(LockName::NodeSet));
        assert_eq!(lock("node-res/n1").group(), Some(LockName::NodeResSet));
        assert_eq!(lock("node/[lockset]").group(), None);
        assert_eq!(lock("cluster/config").group(), None);
        assert_eq!(lock("cluster/config").level(), Level::Config);
        assert_eq!(lock("cluster/BGL").level(), Level::Cluster);
        assert!(lock("network/[lockset]").is_group());
        assert!(!lock("cluster/BGL").is_group());
    }

    #[test]
    fn malformed_names_are_errors_that_quote_the_name() {
        for text in [
            "",
            "node",
            "node/",
            "cluster/other",
            "config/x",
            "bogus/x",
            "/x",
            "Node/n1",
        ] {
            let error = LockName::parse(text).expect_err(text);
            assert!(error.to_string().contains(&format!("'{text}'")), "{error}");
        }
        let long = format!("node/{}", "x".repeat(LOCK_NAME_BYTES_MAX));
        assert_eq!(LockName::parse(&long), Err(NameError::TooLong(long.len())));
    }

    #[test]
    fn levels_parse_and_print() {
        for level in Level::ALL {
            assert_eq!(Level::parse(level.as_str()), Ok(level));
        }
        assert!(Level::parse("nodes").is_err());
    }
}
