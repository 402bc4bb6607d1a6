//! wconfd's methods (PROTOCOL.md "3. wconfd methods"), decoded from the
//! wire into typed requests, and the JSON forms of owners, locks and
//! listings.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use super::workers::{
    NoticeCursor, decode_caps, decode_cursor, decode_filter, decode_groups, decode_page,
    decode_request, decode_sort, decode_strings, encode_caps, encode_cursor, encode_filter,
    encode_page, encode_request, encode_sort,
};
use super::{Args, Request, WireError};
use crate::jobs::JobId;
use crate::locks::{
    Action, Entry, Ident, Level, LockError, LockName, Mode, Owner, PendingRequest, Priority, Token,
};
use crate::text::shortened;
use crate::workers::{Filter, Page, Request as WorkerRequest, Sort};

/// Limits the decoder enforces, from the settings.
#[derive(Clone, Copy, Debug)]
pub struct DecodeLimits {
    /// Entries in one lock request or lock list.
    pub request_entries_max: usize,
    /// Longest `awaitLocks` timeout.
    pub await_timeout_ms_max: u64,
}

/// Every method of wconfd.
#[derive(Clone, Debug, PartialEq)]
pub enum WconfdRequest {
    Echo(String),
    CleanupLocks,
    ReadConfig,
    WriteConfig {
        owner: Owner,
        config: Value,
    },
    VerifyConfig,
    LockConfig {
        owner: Owner,
        shared: bool,
    },
    UnlockConfig {
        owner: Owner,
    },
    WriteConfigAndUnlock {
        owner: Owner,
        config: Value,
    },
    FlushConfig,
    ListLocks {
        owner: Owner,
    },
    ListAllLocks,
    /// With `tokens` *(extension)*, each holder also carries its grant:
    /// token and the dead previous holders it was told of.
    ListAllLocksOwners {
        tokens: bool,
    },
    ListLocksWaitingStatus,
    /// *(extension)* Every pending request with how long it has waited and
    /// who blocks it.
    ListWaiters,
    /// *(extension)* Why a job's owner waits: its pending request, the
    /// owners blocking it, what they hold of it and whether they wait
    /// themselves, recursively (SCHEDULING.md "Why").
    ExplainWait {
        job: u64,
    },
    TryUpdateLocks {
        owner: Owner,
        request: Vec<Entry>,
    },
    UpdateLocksWaiting {
        owner: Owner,
        priority: Priority,
        request: Vec<Entry>,
    },
    AwaitLocks {
        owner: Owner,
        priority: Priority,
        request: Vec<Entry>,
        timeout_ms: u64,
        /// Answer the grant's fence (token, dead previous holders) in an
        /// object *(extension)*.
        fence: bool,
    },
    /// *(extension)* Whether `token` is the grant `owner` holds `lock`
    /// with now.
    CheckFence {
        owner: Owner,
        lock: LockName,
        token: u64,
    },
    /// *(extension)* What a request would meet now, changing nothing.
    WhatIfLocks {
        owner: Owner,
        request: Vec<Entry>,
        priority: Priority,
    },
    HasPendingRequest {
        owner: Owner,
    },
    FreeLocks {
        owner: Owner,
    },
    FreeLocksLevel {
        owner: Owner,
        level: Level,
    },
    DownGradeLocksLevel {
        owner: Owner,
        level: Level,
    },
    IntersectLocks {
        owner: Owner,
        locks: Vec<LockName>,
    },
    OpportunisticLockUnion {
        owner: Owner,
        wanted: Vec<(LockName, Mode)>,
    },
    GuardedOpportunisticLockUnion {
        count: usize,
        owner: Owner,
        wanted: Vec<(LockName, Mode)>,
    },
    // The worker registry *(extension)*, WORKERS.md.
    RegisterWorker {
        caps: BTreeMap<String, String>,
        groups: Option<BTreeSet<String>>,
        address: Option<String>,
        prepare: Option<Vec<String>>,
    },
    DeregisterWorker {
        uuid: String,
    },
    SetWorkerState {
        uuid: String,
        state: String,
        kill: bool,
    },
    SetWorkerFail {
        uuid: String,
        reason: String,
    },
    SetWorkerGroups {
        uuid: String,
        groups: BTreeSet<String>,
    },
    GetWorkerInfo {
        uuid: String,
    },
    ListWorkers {
        filter: Filter,
        sort: Sort,
        page: Page,
    },
    /// luxid: whether some registered worker could ever fit (submit's
    /// check).
    CheckWorkers {
        request: WorkerRequest,
    },
    /// luxid: a job waits for workers (or changes its priority).
    RequestWorkers {
        job: JobId,
        priority: i64,
        request: WorkerRequest,
    },
    /// luxid: the job ended (or was canceled, or died).
    ReleaseWorkers {
        job: JobId,
        status: String,
    },
    /// luxid: prepare `seq` of a worker ended.
    WorkerPrepared {
        uuid: String,
        seq: u64,
        status: String,
        reason: String,
    },
    /// luxid: the notices after `cursor`, held until there are some.
    WatchWorkers {
        cursor: Option<NoticeCursor>,
        timeout_ms: u64,
    },
    /// wconfd's event sequence (extension, EVENTS.md): held until events
    /// after the position arrive or the timeout passes.
    WatchEvents(super::events::WatchEvents),
}

impl WconfdRequest {
    /// The owner a query asks about rather than acts as: any peer may
    /// ask, but it must be an owner that could exist.
    pub fn subject(&self) -> Option<&Owner> {
        use WconfdRequest::*;
        match self {
            CheckFence { owner, .. } | WhatIfLocks { owner, .. } => Some(owner),
            _ => None,
        }
    }

    /// The owner a request acts as, if any (for the peer check and the
    /// liveness watch).
    pub fn owner(&self) -> Option<&Owner> {
        use WconfdRequest::*;
        match self {
            WriteConfig { owner, .. }
            | LockConfig { owner, .. }
            | UnlockConfig { owner }
            | WriteConfigAndUnlock { owner, .. }
            | ListLocks { owner }
            | TryUpdateLocks { owner, .. }
            | UpdateLocksWaiting { owner, .. }
            | AwaitLocks { owner, .. }
            | HasPendingRequest { owner }
            | FreeLocks { owner }
            | FreeLocksLevel { owner, .. }
            | DownGradeLocksLevel { owner, .. }
            | IntersectLocks { owner, .. }
            | OpportunisticLockUnion { owner, .. }
            | GuardedOpportunisticLockUnion { owner, .. } => Some(owner),
            // A subject asked about, not the caller (see `subject`).
            CheckFence { .. } | WhatIfLocks { .. } => None,
            Echo(_)
            | CleanupLocks
            | ReadConfig
            | VerifyConfig
            | FlushConfig
            | ListAllLocks
            | ListAllLocksOwners { .. }
            | ListLocksWaitingStatus
            | ListWaiters
            | ExplainWait { .. }
            | RegisterWorker { .. }
            | DeregisterWorker { .. }
            | SetWorkerState { .. }
            | SetWorkerFail { .. }
            | SetWorkerGroups { .. }
            | GetWorkerInfo { .. }
            | ListWorkers { .. }
            | CheckWorkers { .. }
            | RequestWorkers { .. }
            | ReleaseWorkers { .. }
            | WorkerPrepared { .. }
            | WatchWorkers { .. }
            | WatchEvents(_) => None,
        }
    }

    /// Decodes a request; unknown methods and wrong argument shapes are
    /// `GenericError`s naming the method and the argument.
    pub fn decode(request: &Request, limits: &DecodeLimits) -> Result<WconfdRequest, WireError> {
        use WconfdRequest::*;
        let method = request.method.as_str();
        let args = &request.args;
        let arity = |count| Args::exactly(method, args, count);
        let decoded = match method {
            "echo" => Echo(arity(1)?.string(0)?.to_owned()),
            "cleanupLocks" => nothing(arity(0)?, CleanupLocks),
            "readConfig" => nothing(arity(0)?, ReadConfig),
            "verifyConfig" => nothing(arity(0)?, VerifyConfig),
            "flushConfig" => nothing(arity(0)?, FlushConfig),
            "listAllLocks" => nothing(arity(0)?, ListAllLocks),
            "listAllLocksOwners" => {
                let args = Args::between(method, args, 0, 1)?;
                ListAllLocksOwners {
                    tokens: !args.flags(0, &["tokens"])?.is_empty(),
                }
            }
            "checkFence" => {
                let args = arity(3)?;
                CheckFence {
                    owner: owner(&args, 0)?,
                    lock: decode_lock(args.get(1)).map_err(|what| args.bad(1, what))?,
                    token: args.u64(2)?,
                }
            }
            "whatIfLocks" => {
                let args = Args::between(method, args, 2, 3)?;
                WhatIfLocks {
                    owner: owner(&args, 0)?,
                    request: entries(&args, 1, limits)?,
                    priority: if args.len() > 2 { args.i64(2)? } else { 0 },
                }
            }
            "listLocksWaitingStatus" => nothing(arity(0)?, ListLocksWaitingStatus),
            "listWaiters" => nothing(arity(0)?, ListWaiters),
            "explainWait" => {
                let args = arity(1)?;
                ExplainWait {
                    job: args
                        .get(0)
                        .as_u64()
                        .filter(|job| *job > 0)
                        .ok_or_else(|| args.bad(0, "is not a job id"))?,
                }
            }
            "writeConfig" => {
                let args = arity(2)?;
                WriteConfig {
                    owner: owner(&args, 0)?,
                    config: config(&args, 1)?,
                }
            }
            "writeConfigAndUnlock" => {
                let args = arity(2)?;
                WriteConfigAndUnlock {
                    owner: owner(&args, 0)?,
                    config: config(&args, 1)?,
                }
            }
            "lockConfig" => {
                let args = arity(2)?;
                LockConfig {
                    owner: owner(&args, 0)?,
                    shared: args.bool(1)?,
                }
            }
            "unlockConfig" => UnlockConfig {
                owner: owner(&arity(1)?, 0)?,
            },
            "listLocks" => ListLocks {
                owner: owner(&arity(1)?, 0)?,
            },
            "hasPendingRequest" => HasPendingRequest {
                owner: owner(&arity(1)?, 0)?,
            },
            "freeLocks" => FreeLocks {
                owner: owner(&arity(1)?, 0)?,
            },
            "tryUpdateLocks" => {
                let args = arity(2)?;
                TryUpdateLocks {
                    owner: owner(&args, 0)?,
                    request: entries(&args, 1, limits)?,
                }
            }
            "updateLocksWaiting" => {
                let args = arity(3)?;
                UpdateLocksWaiting {
                    owner: owner(&args, 0)?,
                    priority: args.i64(1)?,
                    request: entries(&args, 2, limits)?,
                }
            }
            "awaitLocks" => {
                let args = Args::between(method, args, 4, 5)?;
                let timeout_ms = args.u64(3)?;
                if timeout_ms > limits.await_timeout_ms_max {
                    return Err(args.bad(
                        3,
                        format!(
                            "(timeout {timeout_ms} ms) is over the limit of {} ms",
                            limits.await_timeout_ms_max
                        ),
                    ));
                }
                AwaitLocks {
                    owner: owner(&args, 0)?,
                    priority: args.i64(1)?,
                    request: entries(&args, 2, limits)?,
                    timeout_ms,
                    fence: !args.flags(4, &["fence"])?.is_empty(),
                }
            }
            "freeLocksLevel" => {
                let args = arity(2)?;
                FreeLocksLevel {
                    owner: owner(&args, 0)?,
                    level: level(&args, 1)?,
                }
            }
            "downGradeLocksLevel" => {
                let args = arity(2)?;
                DownGradeLocksLevel {
                    owner: owner(&args, 0)?,
                    level: level(&args, 1)?,
                }
            }
            "intersectLocks" => {
                let args = arity(2)?;
                let list = bounded_list(&args, 1, limits)?;
                let locks = list
                    .iter()
                    .map(|item| lock_name(&args, 1, item))
                    .collect::<Result<_, _>>()?;
                IntersectLocks {
                    owner: owner(&args, 0)?,
                    locks,
                }
            }
            "opportunisticLockUnion" => {
                let args = arity(2)?;
                OpportunisticLockUnion {
                    owner: owner(&args, 0)?,
                    wanted: lock_modes(&args, 1, limits)?,
                }
            }
            "guardedOpportunisticLockUnion" => {
                let args = arity(3)?;
                let count =
                    usize::try_from(args.u64(0)?).map_err(|_| args.bad(0, "is too large"))?;
                GuardedOpportunisticLockUnion {
                    count,
                    owner: owner(&args, 1)?,
                    wanted: lock_modes(&args, 2, limits)?,
                }
            }
            "registerWorker" => {
                let args = arity(4)?;
                let caps = decode_caps(args.get(0)).map_err(|what| args.bad(0, what))?;
                let groups = match args.get(1) {
                    Value::Null => None,
                    value => Some(decode_groups(value).map_err(|what| args.bad(1, what))?),
                };
                let address = optional_string(&args, 2)?;
                let prepare = match args.get(3) {
                    Value::Null => None,
                    value => {
                        Some(decode_strings(value, "arguments").map_err(|what| args.bad(3, what))?)
                    }
                };
                RegisterWorker {
                    caps,
                    groups,
                    address,
                    prepare,
                }
            }
            "deregisterWorker" => DeregisterWorker {
                uuid: arity(1)?.string(0)?.to_owned(),
            },
            "setWorkerState" => {
                let args = arity(3)?;
                let kill = match args.get(2) {
                    Value::Null => false,
                    Value::Object(options) => {
                        if let Some(other) = options.keys().find(|key| *key != "kill") {
                            return Err(args
                                .bad(2, format!("has an unknown option '{}'", shortened(other))));
                        }
                        match options.get("kill") {
                            None => false,
                            Some(Value::Bool(kill)) => *kill,
                            Some(_) => return Err(args.bad(2, "kill is not a boolean")),
                        }
                    }
                    _ => return Err(args.bad(2, "is neither null nor {\"kill\": bool}")),
                };
                SetWorkerState {
                    uuid: args.string(0)?.to_owned(),
                    state: args.string(1)?.to_owned(),
                    kill,
                }
            }
            "setWorkerFail" => {
                let args = arity(2)?;
                SetWorkerFail {
                    uuid: args.string(0)?.to_owned(),
                    reason: args.string(1)?.to_owned(),
                }
            }
            "setWorkerGroups" => {
                let args = arity(2)?;
                SetWorkerGroups {
                    uuid: args.string(0)?.to_owned(),
                    groups: decode_groups(args.get(1)).map_err(|what| args.bad(1, what))?,
                }
            }
            "getWorkerInfo" => GetWorkerInfo {
                uuid: arity(1)?.string(0)?.to_owned(),
            },
            "listWorkers" => {
                let args = arity(3)?;
                let filter = decode_filter(args.get(0)).map_err(|what| args.bad(0, what))?;
                let sort = decode_sort(args.get(1))
                    .map_err(|what| args.bad(1, what))?
                    .map_err(|error| WireError::generic(error.to_string()))?;
                let page = decode_page(args.get(2)).map_err(|what| args.bad(2, what))?;
                ListWorkers { filter, sort, page }
            }
            "checkWorkers" => {
                let args = arity(1)?;
                CheckWorkers {
                    request: decode_request(args.get(0)).map_err(|what| args.bad(0, what))?,
                }
            }
            "requestWorkers" => {
                let args = arity(3)?;
                RequestWorkers {
                    job: args.u64(0)?,
                    priority: args.i64(1)?,
                    request: decode_request(args.get(2)).map_err(|what| args.bad(2, what))?,
                }
            }
            "releaseWorkers" => {
                let args = arity(2)?;
                ReleaseWorkers {
                    job: args.u64(0)?,
                    status: args.string(1)?.to_owned(),
                }
            }
            "workerPrepared" => {
                let args = arity(4)?;
                WorkerPrepared {
                    uuid: args.string(0)?.to_owned(),
                    seq: args.u64(1)?,
                    status: args.string(2)?.to_owned(),
                    reason: args.string(3)?.to_owned(),
                }
            }
            "watchEvents" => WatchEvents(super::events::WatchEvents::decode(&arity(3)?)?),
            "watchWorkers" => {
                let args = arity(2)?;
                let timeout_ms = args.u64(1)?;
                if timeout_ms > limits.await_timeout_ms_max {
                    return Err(args.bad(
                        1,
                        format!(
                            "(timeout {timeout_ms} ms) is over the limit of {} ms",
                            limits.await_timeout_ms_max
                        ),
                    ));
                }
                WatchWorkers {
                    cursor: decode_cursor(args.get(0)).map_err(|what| args.bad(0, what))?,
                    timeout_ms,
                }
            }
            _ => {
                return Err(WireError::generic(format!(
                    "unknown method '{}'",
                    shortened(method)
                )));
            }
        };
        Ok(decoded)
    }
}

impl WconfdRequest {
    /// The method's name on the wire.
    pub fn method(&self) -> &'static str {
        use WconfdRequest::*;
        match self {
            Echo(_) => "echo",
            CleanupLocks => "cleanupLocks",
            ReadConfig => "readConfig",
            WriteConfig { .. } => "writeConfig",
            VerifyConfig => "verifyConfig",
            LockConfig { .. } => "lockConfig",
            UnlockConfig { .. } => "unlockConfig",
            WriteConfigAndUnlock { .. } => "writeConfigAndUnlock",
            FlushConfig => "flushConfig",
            ListLocks { .. } => "listLocks",
            ListAllLocks => "listAllLocks",
            ListAllLocksOwners { .. } => "listAllLocksOwners",
            CheckFence { .. } => "checkFence",
            WhatIfLocks { .. } => "whatIfLocks",
            ListLocksWaitingStatus => "listLocksWaitingStatus",
            ListWaiters => "listWaiters",
            ExplainWait { .. } => "explainWait",
            TryUpdateLocks { .. } => "tryUpdateLocks",
            UpdateLocksWaiting { .. } => "updateLocksWaiting",
            AwaitLocks { .. } => "awaitLocks",
            HasPendingRequest { .. } => "hasPendingRequest",
            FreeLocks { .. } => "freeLocks",
            FreeLocksLevel { .. } => "freeLocksLevel",
            DownGradeLocksLevel { .. } => "downGradeLocksLevel",
            IntersectLocks { .. } => "intersectLocks",
            OpportunisticLockUnion { .. } => "opportunisticLockUnion",
            GuardedOpportunisticLockUnion { .. } => "guardedOpportunisticLockUnion",
            RegisterWorker { .. } => "registerWorker",
            DeregisterWorker { .. } => "deregisterWorker",
            SetWorkerState { .. } => "setWorkerState",
            SetWorkerFail { .. } => "setWorkerFail",
            SetWorkerGroups { .. } => "setWorkerGroups",
            GetWorkerInfo { .. } => "getWorkerInfo",
            ListWorkers { .. } => "listWorkers",
            CheckWorkers { .. } => "checkWorkers",
            RequestWorkers { .. } => "requestWorkers",
            ReleaseWorkers { .. } => "releaseWorkers",
            WorkerPrepared { .. } => "workerPrepared",
            WatchWorkers { .. } => "watchWorkers",
            WatchEvents(_) => "watchEvents",
        }
    }

    /// The request as a client sends it.
    pub fn encode(&self) -> Request {
        use WconfdRequest::*;
        let entries = |request: &[Entry]| -> Value {
            Value::Array(request.iter().map(encode_entry).collect())
        };
        let args = match self {
            Echo(text) => vec![json!(text)],
            CleanupLocks
            | ReadConfig
            | VerifyConfig
            | FlushConfig
            | ListAllLocks
            | ListAllLocksOwners { tokens: false }
            | ListLocksWaitingStatus
            | ListWaiters => Vec::new(),
            ListAllLocksOwners { tokens: true } => vec![json!({"tokens": true})],
            CheckFence { owner, lock, token } => {
                vec![encode_owner(owner), json!(lock.to_string()), json!(token)]
            }
            WhatIfLocks {
                owner,
                request,
                priority,
            } => vec![encode_owner(owner), entries(request), json!(priority)],
            ExplainWait { job } => vec![json!(job)],
            WriteConfig { owner, config } | WriteConfigAndUnlock { owner, config } => {
                vec![encode_owner(owner), config.clone()]
            }
            LockConfig { owner, shared } => vec![encode_owner(owner), json!(shared)],
            UnlockConfig { owner }
            | ListLocks { owner }
            | HasPendingRequest { owner }
            | FreeLocks { owner } => vec![encode_owner(owner)],
            TryUpdateLocks { owner, request } => vec![encode_owner(owner), entries(request)],
            UpdateLocksWaiting {
                owner,
                priority,
                request,
            } => vec![encode_owner(owner), json!(priority), entries(request)],
            AwaitLocks {
                owner,
                priority,
                request,
                timeout_ms,
                fence,
            } => {
                let mut args = vec![
                    encode_owner(owner),
                    json!(priority),
                    entries(request),
                    json!(timeout_ms),
                ];
                if *fence {
                    args.push(json!({"fence": true}));
                }
                args
            }
            FreeLocksLevel { owner, level } | DownGradeLocksLevel { owner, level } => {
                vec![encode_owner(owner), json!(level.as_str())]
            }
            IntersectLocks { owner, locks } => vec![encode_owner(owner), encode_locks(locks)],
            OpportunisticLockUnion { owner, wanted } => {
                vec![encode_owner(owner), encode_lock_modes(wanted)]
            }
            GuardedOpportunisticLockUnion {
                count,
                owner,
                wanted,
            } => vec![json!(count), encode_owner(owner), encode_lock_modes(wanted)],
            RegisterWorker {
                caps,
                groups,
                address,
                prepare,
            } => vec![
                encode_caps(caps),
                json!(groups),
                json!(address),
                json!(prepare),
            ],
            DeregisterWorker { uuid } | GetWorkerInfo { uuid } => vec![json!(uuid)],
            SetWorkerState { uuid, state, kill } => {
                vec![json!(uuid), json!(state), json!({"kill": kill})]
            }
            SetWorkerFail { uuid, reason } => vec![json!(uuid), json!(reason)],
            SetWorkerGroups { uuid, groups } => vec![json!(uuid), json!(groups)],
            ListWorkers { filter, sort, page } => {
                vec![encode_filter(filter), encode_sort(*sort), encode_page(page)]
            }
            CheckWorkers { request } => vec![encode_request(request)],
            RequestWorkers {
                job,
                priority,
                request,
            } => vec![json!(job), json!(priority), encode_request(request)],
            ReleaseWorkers { job, status } => vec![json!(job), json!(status)],
            WorkerPrepared {
                uuid,
                seq,
                status,
                reason,
            } => vec![json!(uuid), json!(seq), json!(status), json!(reason)],
            WatchWorkers { cursor, timeout_ms } => vec![encode_cursor(*cursor), json!(timeout_ms)],
            WatchEvents(watch) => watch.encode(),
        };
        Request {
            method: self.method().to_owned(),
            args,
        }
    }
}

fn optional_string(args: &Args<'_>, index: usize) -> Result<Option<String>, WireError> {
    match args.get(index) {
        Value::Null => Ok(None),
        Value::String(text) => Ok(Some(text.clone())),
        _ => Err(args.bad(index, "is neither null nor a string")),
    }
}

fn nothing(_: Args<'_>, request: WconfdRequest) -> WconfdRequest {
    request
}

fn owner(args: &Args<'_>, index: usize) -> Result<Owner, WireError> {
    decode_owner(args.get(index)).map_err(|what| args.bad(index, what))
}

/// An owner from its wire form `[ident, livelock_path, pid]`.
pub fn decode_owner(value: &Value) -> Result<Owner, String> {
    let Some([ident, livelock, pid]) = value.as_array().map(Vec::as_slice) else {
        return Err("is not an owner [ident, livelock, pid]".to_owned());
    };
    let ident = match ident {
        Value::String(name) => Ident::Name(name.clone()),
        Value::Number(number) => Ident::Job(
            number
                .as_u64()
                .ok_or("has an ident that is neither a string nor a job id")?,
        ),
        _ => return Err("has an ident that is neither a string nor a job id".to_owned()),
    };
    let livelock = livelock
        .as_str()
        .ok_or("has a livelock path that is not a string")?
        .to_owned();
    let pid = pid
        .as_u64()
        .and_then(|pid| u32::try_from(pid).ok())
        .filter(|pid| (1..=i32::MAX as u32).contains(pid))
        .ok_or("has a pid that is not a positive process id")?;
    Ok(Owner {
        ident,
        livelock,
        pid,
    })
}

pub fn encode_owner(owner: &Owner) -> Value {
    let ident = match &owner.ident {
        Ident::Name(name) => json!(name),
        Ident::Job(id) => json!(id),
    };
    json!([ident, owner.livelock, owner.pid])
}

fn config(args: &Args<'_>, index: usize) -> Result<Value, WireError> {
    match args.get(index) {
        Value::Object(_) => Ok(args.get(index).clone()),
        _ => Err(args.bad(index, "is not a configuration object")),
    }
}

fn level(args: &Args<'_>, index: usize) -> Result<Level, WireError> {
    Level::parse(args.string(index)?)
        .map_err(|error| args.bad(index, format!("is not a level: {error}")))
}

fn bounded_list<'a>(
    args: &Args<'a>,
    index: usize,
    limits: &DecodeLimits,
) -> Result<&'a [Value], WireError> {
    let list = args.list(index)?;
    if list.len() > limits.request_entries_max {
        return Err(args.bad(
            index,
            format!(
                "has {} entries, over the limit of {}",
                list.len(),
                limits.request_entries_max
            ),
        ));
    }
    Ok(list)
}

fn lock_name(args: &Args<'_>, index: usize, value: &Value) -> Result<LockName, WireError> {
    decode_lock(value).map_err(|what| args.bad(index, what))
}

/// A lock from its wire form, `"<level>/<name>"`.
pub fn decode_lock(value: &Value) -> Result<LockName, String> {
    let text = value
        .as_str()
        .ok_or("has a lock name that is not a string")?;
    LockName::parse(text).map_err(|error| format!("has a bad lock name: {error}"))
}

/// A request entry, `[lockname, "shared" | "exclusive" | "release"]`.
pub fn decode_entry(value: &Value) -> Result<Entry, String> {
    let Some([lock, action]) = value.as_array().map(Vec::as_slice) else {
        return Err("has an entry that is not [lock, action]".to_owned());
    };
    let action = action.as_str().and_then(Action::parse).ok_or_else(|| {
        format!(
            "has an action that is not \"shared\", \"exclusive\" or \"release\": {}",
            shortened(&action.to_string())
        )
    })?;
    Ok(Entry::new(decode_lock(lock)?, action))
}

/// `[lockname, "shared" | "exclusive"]`.
pub fn decode_lock_mode(value: &Value) -> Result<(LockName, Mode), String> {
    let Some([lock, mode]) = value.as_array().map(Vec::as_slice) else {
        return Err("has an entry that is not [lock, mode]".to_owned());
    };
    let Some(Action::Acquire(mode)) = mode.as_str().and_then(Action::parse) else {
        return Err("has a mode that is not \"shared\" or \"exclusive\"".to_owned());
    };
    Ok((decode_lock(lock)?, mode))
}

/// A request: `[[lockname, "shared" | "exclusive" | "release"], ...]`.
fn entries(args: &Args<'_>, index: usize, limits: &DecodeLimits) -> Result<Vec<Entry>, WireError> {
    bounded_list(args, index, limits)?
        .iter()
        .map(|item| decode_entry(item).map_err(|what| args.bad(index, what)))
        .collect()
}

/// `[[lockname, "shared" | "exclusive"], ...]`.
fn lock_modes(
    args: &Args<'_>,
    index: usize,
    limits: &DecodeLimits,
) -> Result<Vec<(LockName, Mode)>, WireError> {
    bounded_list(args, index, limits)?
        .iter()
        .map(|item| decode_lock_mode(item).map_err(|what| args.bad(index, what)))
        .collect()
}

pub fn encode_entry(entry: &Entry) -> Value {
    json!([entry.lock.to_string(), entry.action.as_str()])
}

pub fn encode_owners(owners: &[impl AsRef<Owner>]) -> Value {
    Value::Array(
        owners
            .iter()
            .map(|owner| encode_owner(owner.as_ref()))
            .collect(),
    )
}

pub fn encode_locks(locks: &[LockName]) -> Value {
    Value::Array(locks.iter().map(|lock| json!(lock.to_string())).collect())
}

pub fn encode_lock_modes(locks: &[(LockName, Mode)]) -> Value {
    Value::Array(
        locks
            .iter()
            .map(|(lock, mode)| json!([lock.to_string(), mode.as_str()]))
            .collect(),
    )
}

/// `listAllLocksOwners`: `[[lock, [[owner, mode], ...]], ...]`.
pub fn encode_locks_owners<O: AsRef<Owner>>(rows: &[(LockName, Vec<(O, Mode)>)]) -> Value {
    Value::Array(
        rows.iter()
            .map(|(lock, holders)| {
                let holders: Vec<Value> = holders
                    .iter()
                    .map(|(owner, mode)| json!([encode_owner(owner.as_ref()), mode.as_str()]))
                    .collect();
                json!([lock.to_string(), holders])
            })
            .collect(),
    )
}

/// The pending half of `listLocksWaitingStatus`: `[[prio, owner, request], ...]`.
pub fn encode_pending(pending: &[PendingRequest]) -> Value {
    Value::Array(
        pending
            .iter()
            .map(|waiter| {
                let request: Vec<Value> = waiter.request.iter().map(encode_entry).collect();
                json!([waiter.priority, encode_owner(&waiter.owner), request])
            })
            .collect(),
    )
}

/// One waiter of `listWaiters` *(extension)*: its pending request as
/// `listLocksWaitingStatus` lists it, what it holds already (the first
/// locks, each with its mode and fencing token, and how many in all), the
/// seconds it has waited, and the owners that block it, in owner order.
pub fn encode_waiter(
    waiter: &PendingRequest,
    waiting_seconds: f64,
    blockers: &[impl AsRef<Owner>],
    holds: &[(LockName, Mode, Token)],
    holds_count: usize,
) -> Value {
    let request: Vec<Value> = waiter.request.iter().map(encode_entry).collect();
    let holds: Vec<Value> = holds
        .iter()
        .map(|(lock, mode, token)| json!([lock.to_string(), mode.as_str(), token]))
        .collect();
    json!({
        "priority": waiter.priority,
        "owner": encode_owner(&waiter.owner),
        "request": request,
        "holds": holds,
        "holds_count": holds_count,
        "waiting_seconds": waiting_seconds,
        "blockers": encode_owners(blockers),
    })
}

/// Lock errors are `GenericError`s with Ganeti's texts, as Ganeti's
/// WConfD raises them.
/// A lock error as `GenericError`: its text, and for a deadlock a second
/// argument `{"cycle": [{"owner", "holds"}, ...]}` (the requester last).
pub fn lock_error(error: &LockError) -> WireError {
    let mut wire = WireError::generic(error.to_string());
    if let LockError::Deadlock(cycle) = error {
        let members: Vec<Value> = cycle
            .iter()
            .map(|(owner, holds)| json!({"owner": encode_owner(owner), "holds": encode_lock_modes(holds)}))
            .collect();
        wire.args.push(json!({"cycle": members}));
    }
    wire
}

/// A grant's fence as `awaitLocks` with `fence` answers it:
/// `{"blockers": [], "token": N, "died": [{"lock", "owner", "token"}, ...]}`.
pub fn encode_fence(token: u64, died: &[crate::locks::Death]) -> Value {
    json!({
        "blockers": [],
        "token": token,
        "died": died.iter().map(encode_death).collect::<Vec<_>>(),
    })
}

/// `whatIfLocks`' answer: `{"granted", "blockers", "filed_under",
/// "ahead", "error"}` (`error`: the text of the error the request would
/// get, and for a deadlock its `cycle`).
pub fn encode_what_if(what_if: &crate::locks::WhatIf) -> Value {
    let ahead: Vec<Value> = what_if
        .ahead
        .iter()
        .map(|waiter| {
            json!({
                "priority": waiter.priority,
                "owner": encode_owner(&waiter.owner),
                "request": waiter.request.iter().map(encode_entry).collect::<Vec<_>>(),
            })
        })
        .collect();
    let mut answer = json!({
        "granted": what_if.error.is_none() && what_if.blockers.is_empty(),
        "blockers": encode_owners(&what_if.blockers),
        "filed_under": what_if.filed_under.as_deref().map(encode_owner),
        "ahead": ahead,
        "error": what_if.error.as_ref().map(|error| error.to_string()),
    });
    if let Some(crate::locks::LockError::Deadlock(_)) = &what_if.error {
        let wire = lock_error(what_if.error.as_ref().expect("matched"));
        answer["cycle"] = wire.args[1]["cycle"].clone();
    }
    answer
}

/// The first `max` violations of the configuration lock check (D70), each
/// as `{"kind", "uuid", "name", "change", "locks"}` (`name` null if the
/// entity has none; `locks` the missing ones, in lock order).
pub fn encode_violations(
    violations: &[crate::store::config_check::Violation],
    max: usize,
) -> Value {
    Value::Array(
        violations
            .iter()
            .take(max)
            .map(|violation| {
                json!({
                    "kind": violation.kind.as_str(),
                    "uuid": violation.uuid,
                    "name": violation.name,
                    "change": violation.change.as_str(),
                    "locks": violation.locks.iter().map(ToString::to_string).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}

/// A death mark as `{"lock", "owner", "token"}`.
pub fn encode_death(death: &crate::locks::Death) -> Value {
    json!({"lock": death.lock.to_string(), "owner": encode_owner(&death.owner), "token": death.token})
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const LIMITS: DecodeLimits = DecodeLimits {
        request_entries_max: 3,
        await_timeout_ms_max: 60_000,
    };

    fn decode(method: &str, args: Value) -> Result<WconfdRequest, WireError> {
        let Value::Array(args) = args else {
            panic!("args")
        };
        WconfdRequest::decode(
            &Request {
                method: method.to_owned(),
                args,
            },
            &LIMITS,
        )
    }

    fn j1() -> Value {
        json!([1, "/r/livelocks/job_000001_1", 42])
    }

    #[test]
    fn lock_requests_decode_to_typed_entries() {
        let request = decode(
            "updateLocksWaiting",
            json!([
                j1(),
                -5,
                [["cluster/BGL", "shared"], ["node/n1", "release"]]
            ]),
        )
        .expect("valid");
        assert_eq!(
            request,
            WconfdRequest::UpdateLocksWaiting {
                owner: Owner::job(1, "/r/livelocks/job_000001_1", 42),
                priority: -5,
                request: vec![
                    Entry::shared(LockName::Bgl),
                    Entry::release(LockName::parse("node/n1").expect("valid")),
                ],
            }
        );
        let named = decode("listLocks", json!([["master", "/r/livelocks/m", 7]])).expect("valid");
        assert_eq!(
            named.owner(),
            Some(&Owner::named("master", "/r/livelocks/m", 7))
        );
    }

    #[test]
    fn owners_round_trip() {
        for owner in [
            Owner::job(7, "/l/job_000007_1", 3),
            Owner::named("x", "/l/x", 9),
        ] {
            assert_eq!(decode_owner(&encode_owner(&owner)), Ok(owner));
        }
    }

    #[test]
    fn bad_shapes_name_the_method_and_argument() {
        let cases = [
            ("noSuchMethod", json!([]), "unknown method 'noSuchMethod'"),
            ("echo", json!([]), "echo takes 1 argument, got 0"),
            ("echo", json!([1]), "echo: argument 1 is not a string"),
            ("listLocks", json!([[1, "/l", 0]]), "pid"),
            ("listLocks", json!([[1, "/l", -3]]), "pid"),
            ("listLocks", json!([[1.5, "/l", 3]]), "ident"),
            ("listLocks", json!([[1, 2, 3]]), "livelock"),
            ("listLocks", json!([[1, "/l"]]), "is not an owner"),
            (
                "tryUpdateLocks",
                json!([j1(), [["node/n1", "own"]]]),
                "action",
            ),
            (
                "tryUpdateLocks",
                json!([j1(), [["nodes/n1", "shared"]]]),
                "'nodes/n1'",
            ),
            (
                "tryUpdateLocks",
                json!([j1(), [["node/n1"]]]),
                "[lock, action]",
            ),
            ("tryUpdateLocks", json!([j1(), {}]), "is not a list"),
            ("freeLocksLevel", json!([j1(), "nodes"]), "'nodes'"),
            (
                "opportunisticLockUnion",
                json!([j1(), [["node/a", "release"]]]),
                "mode",
            ),
            ("lockConfig", json!([j1(), "yes"]), "boolean"),
            ("writeConfig", json!([j1(), []]), "configuration object"),
            ("awaitLocks", json!([j1(), 0, [], 60_001]), "over the limit"),
            (
                "guardedOpportunisticLockUnion",
                json!([-1, j1(), []]),
                "non-negative",
            ),
        ];
        for (method, args, expected) in cases {
            let error = decode(method, args).expect_err(expected);
            assert_eq!(error.class, "GenericError");
            assert!(error.message().contains(expected), "{method}: {error}");
        }
    }

    #[test]
    fn the_entries_limit_is_enforced() {
        let four = json!([
            ["node/a", "shared"],
            ["node/b", "shared"],
            ["node/c", "shared"],
            ["node/d", "shared"]
        ]);
        let error = decode("tryUpdateLocks", json!([j1(), four])).expect_err("too many");
        assert!(error.message().contains("over the limit of 3"), "{error}");
        let error = decode(
            "intersectLocks",
            json!([j1(), ["node/a", "node/b", "node/c", "node/d"]]),
        )
        .expect_err("too many");
        assert!(error.message().contains("over the limit of 3"), "{error}");
    }

    /// Every method name, and some that are none.
    const METHOD_NAMES: [&str; 27] = [
        "echo",
        "cleanupLocks",
        "readConfig",
        "verifyConfig",
        "flushConfig",
        "listAllLocks",
        "listAllLocksOwners",
        "listLocksWaitingStatus",
        "listWaiters",
        "writeConfig",
        "writeConfigAndUnlock",
        "lockConfig",
        "unlockConfig",
        "listLocks",
        "hasPendingRequest",
        "freeLocks",
        "tryUpdateLocks",
        "updateLocksWaiting",
        "awaitLocks",
        "freeLocksLevel",
        "downGradeLocksLevel",
        "intersectLocks",
        "opportunisticLockUnion",
        "guardedOpportunisticLockUnion",
        "",
        "Echo",
        "noSuchMethod",
    ];

    fn owner_strategy() -> impl Strategy<Value = Owner> {
        (
            prop_oneof![
                any::<u64>().prop_map(Ident::Job),
                ".{0,8}".prop_map(Ident::Name)
            ],
            ".{0,12}",
            1..=i32::MAX as u32,
        )
            .prop_map(|(ident, livelock, pid)| Owner {
                ident,
                livelock,
                pid,
            })
    }

    fn lock_strategy() -> impl Strategy<Value = LockName> {
        prop_oneof![
            Just("cluster/BGL".to_owned()),
            Just("node/[lockset]".to_owned()),
            Just("cluster/config".to_owned()),
            "(node|instance|nodegroup|node-res|network)/[a-z0-9.-]{1,12}",
        ]
        .prop_map(|text| LockName::parse(&text).expect("a valid lock name"))
    }

    fn mode_strategy() -> impl Strategy<Value = Mode> {
        prop_oneof![Just(Mode::Shared), Just(Mode::Exclusive)]
    }

    fn entry_strategy() -> impl Strategy<Value = Entry> {
        (
            lock_strategy(),
            prop_oneof![
                Just(Action::Release),
                mode_strategy().prop_map(Action::Acquire)
            ],
        )
            .prop_map(|(lock, action)| Entry::new(lock, action))
    }

    fn level_strategy() -> impl Strategy<Value = Level> {
        proptest::sample::select(vec![
            "cluster",
            "instance",
            "nodegroup",
            "node",
            "node-res",
            "network",
            "config",
        ])
        .prop_map(|name| Level::parse(name).expect("a valid level"))
    }

    /// A valid request of a method that takes arguments, as a typed value.
    fn request_strategy() -> impl Strategy<Value = WconfdRequest> {
        use WconfdRequest::*;
        let entries = || proptest::collection::vec(entry_strategy(), 0..=3);
        let wanted = || proptest::collection::vec((lock_strategy(), mode_strategy()), 0..=3);
        prop_oneof![
            ".{0,20}".prop_map(Echo),
            owner_strategy().prop_map(|owner| ListLocks { owner }),
            owner_strategy().prop_map(|owner| FreeLocks { owner }),
            (owner_strategy(), any::<bool>())
                .prop_map(|(owner, shared)| LockConfig { owner, shared }),
            (owner_strategy(), entries())
                .prop_map(|(owner, request)| TryUpdateLocks { owner, request }),
            (owner_strategy(), any::<i64>(), entries()).prop_map(|(owner, priority, request)| {
                UpdateLocksWaiting {
                    owner,
                    priority,
                    request,
                }
            }),
            (
                owner_strategy(),
                any::<i64>(),
                entries(),
                0..=60_000u64,
                any::<bool>()
            )
                .prop_map(|(owner, priority, request, timeout_ms, fence)| AwaitLocks {
                    owner,
                    priority,
                    request,
                    timeout_ms,
                    fence,
                }),
            (owner_strategy(), lock_strategy(), any::<u64>())
                .prop_map(|(owner, lock, token)| CheckFence { owner, lock, token }),
            (owner_strategy(), entries(), any::<i64>()).prop_map(|(owner, request, priority)| {
                WhatIfLocks {
                    owner,
                    request,
                    priority,
                }
            }),
            (owner_strategy(), level_strategy())
                .prop_map(|(owner, level)| FreeLocksLevel { owner, level }),
            (owner_strategy(), level_strategy())
                .prop_map(|(owner, level)| DownGradeLocksLevel { owner, level }),
            (
                owner_strategy(),
                proptest::collection::vec(lock_strategy(), 0..=3)
            )
                .prop_map(|(owner, locks)| IntersectLocks { owner, locks }),
            (owner_strategy(), wanted())
                .prop_map(|(owner, wanted)| OpportunisticLockUnion { owner, wanted }),
            (0..1000usize, owner_strategy(), wanted()).prop_map(|(count, owner, wanted)| {
                GuardedOpportunisticLockUnion {
                    count,
                    owner,
                    wanted,
                }
            }),
        ]
    }

    /// The requests [`request_strategy`] leaves out: those without
    /// arguments, the configuration writes and the plain owner ones.
    fn other_request_strategy() -> impl Strategy<Value = WconfdRequest> {
        use WconfdRequest::*;
        let config = || {
            proptest::collection::btree_map("[a-z_]{1,8}", any::<i64>(), 0..4)
                .prop_map(|fields| json!(fields))
        };
        prop_oneof![
            proptest::sample::select(vec![
                CleanupLocks,
                ReadConfig,
                VerifyConfig,
                FlushConfig,
                ListAllLocks,
                ListAllLocksOwners { tokens: false },
                ListAllLocksOwners { tokens: true },
                ListLocksWaitingStatus,
                ListWaiters,
            ]),
            (1u64..1_000_000).prop_map(|job| ExplainWait { job }),
            (owner_strategy(), config()).prop_map(|(owner, config)| WriteConfig { owner, config }),
            (owner_strategy(), config())
                .prop_map(|(owner, config)| WriteConfigAndUnlock { owner, config }),
            owner_strategy().prop_map(|owner| UnlockConfig { owner }),
            owner_strategy().prop_map(|owner| HasPendingRequest { owner }),
        ]
    }

    proptest! {
        /// Any arguments to any method: an answer (a request or an error
        /// naming the method), never a panic.
        #[test]
        fn any_arguments_decode_or_are_refused(
            method in proptest::sample::select(&METHOD_NAMES[..]),
            args in proptest::collection::vec(crate::protocol::arbitrary::json(), 0..5),
        ) {
            let request = Request { method: method.to_owned(), args };
            match WconfdRequest::decode(&request, &LIMITS) {
                Ok(decoded) => {
                    let _ = decoded.owner();
                }
                Err(error) => {
                    prop_assert_eq!(error.class, "GenericError");
                    prop_assert!(!error.message().is_empty());
                }
            }
        }

        /// Whole requests as bytes: whatever arrives, an answer.
        #[test]
        fn any_frame_parses_or_is_refused(frame in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(request) = crate::protocol::parse_request(&frame) {
                let _ = WconfdRequest::decode(&request, &LIMITS);
            }
        }

        /// What a client encodes from a valid request decodes back to it,
        /// through the wire's bytes.
        #[test]
        fn valid_requests_round_trip(
            request in prop_oneof![request_strategy(), other_request_strategy()]
        ) {
            let encoded = request.encode();
            prop_assert_eq!(encoded.method.as_str(), request.method());
            let bytes = serde_json::to_vec(&json!({"method": encoded.method, "args": encoded.args}))
                .expect("JSON to a Vec");
            let parsed = crate::protocol::parse_request(&bytes).expect("a valid request");
            prop_assert_eq!(WconfdRequest::decode(&parsed, &LIMITS), Ok(request));
        }
    }
}
