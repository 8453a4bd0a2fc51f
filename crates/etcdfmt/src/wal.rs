//! etcd's write-ahead log (`member/wal/*.wal`), read-only.
//!
//! A segment is a sequence of frames: an 8-byte little-endian length
//! (with the top bit set, bits 56–58 count the zero padding after the
//! record) then a `walpb.Record {type, crc, data}`. The CRC is CRC-32C,
//! rolling from record to record; a `crc` record restarts it (each segment
//! begins with one carrying the previous segment's last CRC). Record
//! types: 1 metadata, 2 entry (`raftpb.Entry`), 3 state (`raftpb.HardState`),
//! 4 crc, 5 snapshot (`walpb.Snapshot`). A zero length is the zeroed,
//! preallocated tail. An entry with an index at or below an earlier one
//! replaces it and everything after it (a new leader's log), as etcd's
//! `ReadAll` does.
//!
//! A torn last record (a member killed in the middle of a write: short,
//! or failing its CRC at the very end of the last segment) ends the log
//! there, as etcd's repair does; damage anywhere else is an error.
//!
//! [`to_retcd`] turns an etcd `InternalRaftRequest` into retcd's, for
//! replaying etcd's entries through retcd's apply.

use std::path::{Path, PathBuf};

use prost::Message;
use retcd_api::etcdserverpb as pb;
use retcd_api::retcdpb;

const METADATA: i64 = 1;
const ENTRY: i64 = 2;
const STATE: i64 = 3;
const CRC: i64 = 4;
const SNAPSHOT: i64 = 5;

/// `walpb.Record`.
#[derive(Clone, PartialEq, prost::Message)]
struct Record {
    #[prost(int64, tag = "1")]
    r#type: i64,
    #[prost(uint32, tag = "2")]
    crc: u32,
    #[prost(bytes = "vec", tag = "3")]
    data: Vec<u8>,
}

/// `raftpb.Entry`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Entry {
    #[prost(uint64, tag = "2")]
    pub term: u64,
    #[prost(uint64, tag = "3")]
    pub index: u64,
    /// 0 normal, 1 conf change, 2 conf change v2.
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    #[prost(bytes = "vec", tag = "4")]
    pub data: Vec<u8>,
}

/// `raftpb.HardState`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HardState {
    #[prost(uint64, tag = "1")]
    pub term: u64,
    #[prost(uint64, tag = "2")]
    pub vote: u64,
    #[prost(uint64, tag = "3")]
    pub commit: u64,
}

/// `walpb.Snapshot` (the raft snapshot a segment's log continues from).
#[derive(Clone, PartialEq, prost::Message)]
pub struct SnapshotMark {
    #[prost(uint64, tag = "1")]
    pub index: u64,
    #[prost(uint64, tag = "2")]
    pub term: u64,
}

/// Everything read from a WAL directory.
#[derive(Debug, Default)]
pub struct EtcdWal {
    /// Entries in index order, overwrites applied.
    pub entries: Vec<Entry>,
    /// The last hard state (its `commit`: what this member knew committed).
    pub hard_state: HardState,
    /// The last snapshot mark.
    pub snapshot: Option<SnapshotMark>,
    /// Bytes of the segments read.
    pub bytes: u64,
    /// A torn record ended the last segment early.
    pub torn_tail: bool,
}

/// Why a WAL cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("wal: {0}")]
    Corrupt(String),
}

/// The segment files of `dir` (`<seq:016x>-<index:016x>.wal`), in order.
pub fn segments(dir: &Path) -> Result<Vec<PathBuf>, WalError> {
    let mut names: Vec<(u64, PathBuf)> = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".wal") else {
            continue;
        };
        let Some((seq, _index)) = stem.split_once('-') else {
            continue;
        };
        if let Ok(seq) = u64::from_str_radix(seq, 16) {
            names.push((seq, e.path()));
        }
    }
    names.sort();
    for w in names.windows(2) {
        if w[1].0 != w[0].0 + 1 {
            return Err(WalError::Corrupt(format!(
                "segments out of sequence: {} then {}",
                w[0].1.display(),
                w[1].1.display()
            )));
        }
    }
    Ok(names.into_iter().map(|(_, p)| p).collect())
}

/// Reads every segment of `dir` (`progress(bytes_done, bytes_total)` after
/// each segment).
pub fn read_dir(dir: &Path, progress: &mut dyn FnMut(u64, u64)) -> Result<EtcdWal, WalError> {
    let segs = segments(dir)?;
    if segs.is_empty() {
        return Err(WalError::Corrupt(format!(
            "no .wal files in {}",
            dir.display()
        )));
    }
    let total: u64 = segs
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    let mut wal = EtcdWal::default();
    let mut crc: u32 = 0;
    for (i, seg) in segs.iter().enumerate() {
        let data = std::fs::read(seg)?;
        let last = i + 1 == segs.len();
        read_segment(&data, last, &mut crc, &mut wal)
            .map_err(|e| WalError::Corrupt(format!("{}: {e}", seg.display())))?;
        wal.bytes += data.len() as u64;
        progress(wal.bytes, total);
    }
    Ok(wal)
}

fn read_segment(data: &[u8], last: bool, crc: &mut u32, wal: &mut EtcdWal) -> Result<(), String> {
    let mut at = 0usize;
    while at + 8 <= data.len() {
        let len_field = u64::from_le_bytes(data[at..at + 8].try_into().expect("8 bytes"));
        if len_field == 0 {
            break; // the preallocated, zeroed tail
        }
        let rec_len = (len_field & 0x00FF_FFFF_FFFF_FFFF) as usize;
        let pad = if len_field >> 63 == 1 {
            ((len_field >> 56) & 0x7) as usize
        } else {
            0
        };
        let start = at + 8;
        let end = start.checked_add(rec_len).and_then(|e| e.checked_add(pad));
        let torn = |why: String| -> Result<bool, String> {
            if last {
                Ok(true)
            } else {
                Err(why)
            }
        };
        let Some(end) = end.filter(|e| *e <= data.len()) else {
            if torn(format!("record at {at} runs past the end"))? {
                wal.torn_tail = true;
            }
            return Ok(());
        };
        let rec = match Record::decode(&data[start..start + rec_len]) {
            Ok(r) => r,
            Err(e) => {
                if torn(format!("record at {at}: {e}"))? {
                    wal.torn_tail = true;
                }
                return Ok(());
            }
        };
        if rec.r#type == CRC {
            if *crc != 0 && rec.crc != *crc {
                return Err(format!(
                    "crc record at {at} does not continue the previous segment"
                ));
            }
            *crc = rec.crc;
            at = end;
            continue;
        }
        let sum = crc32c::crc32c_append(*crc, &rec.data);
        if sum != rec.crc {
            // A bad CRC on the last record of the last segment is a torn
            // write; anywhere else it is damage.
            let rest_zero = data[end..].iter().take(8).all(|b| *b == 0);
            if last && rest_zero {
                wal.torn_tail = true;
                return Ok(());
            }
            return Err(format!("record at {at}: crc mismatch"));
        }
        *crc = sum;
        match rec.r#type {
            ENTRY => {
                let e = Entry::decode(rec.data.as_slice())
                    .map_err(|e| format!("entry at {at}: {e}"))?;
                if let Some(first) = wal.entries.first().map(|f| f.index) {
                    if e.index <= wal.entries.last().map_or(0, |l| l.index) {
                        // An overwrite: drop the replaced suffix.
                        let keep = e.index.saturating_sub(first) as usize;
                        wal.entries.truncate(keep);
                    }
                }
                wal.entries.push(e);
            }
            STATE => {
                wal.hard_state = HardState::decode(rec.data.as_slice())
                    .map_err(|e| format!("state at {at}: {e}"))?;
            }
            SNAPSHOT => {
                wal.snapshot = Some(
                    SnapshotMark::decode(rec.data.as_slice())
                        .map_err(|e| format!("snapshot at {at}: {e}"))?,
                );
            }
            METADATA => {}
            t => return Err(format!("record at {at}: unknown type {t}")),
        }
        at = end;
    }
    Ok(())
}

/// etcd's `RequestHeader`.
#[derive(Clone, PartialEq, prost::Message)]
struct RequestHeader {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(string, tag = "2")]
    username: String,
    #[prost(uint64, tag = "3")]
    auth_revision: u64,
}

/// etcd's `AuthUserAddRequest` with 3.5's `hashedPassword`.
#[derive(Clone, PartialEq, prost::Message)]
struct UserAdd {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    password: String,
    #[prost(message, optional, tag = "3")]
    options: Option<retcd_api::authpb::UserAddOptions>,
    #[prost(string, tag = "4")]
    hashed_password: String,
}

/// etcd's `AuthUserChangePasswordRequest` with 3.5's `hashedPassword`.
#[derive(Clone, PartialEq, prost::Message)]
struct ChangePassword {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    password: String,
    #[prost(string, tag = "3")]
    hashed_password: String,
}

/// etcd's `InternalRaftRequest` (api/etcdserverpb/raft_internal.proto):
/// the fields retcd replays. Reads (range, auth gets and lists, status),
/// authenticate (tokens do not outlive the old cluster), membership and
/// version entries are not replayed.
#[derive(Clone, PartialEq, prost::Message)]
struct EtcdRequest {
    #[prost(message, optional, tag = "100")]
    header: Option<RequestHeader>,
    #[prost(message, optional, tag = "4")]
    put: Option<pb::PutRequest>,
    #[prost(message, optional, tag = "5")]
    delete_range: Option<pb::DeleteRangeRequest>,
    #[prost(message, optional, tag = "6")]
    txn: Option<pb::TxnRequest>,
    #[prost(message, optional, tag = "7")]
    compaction: Option<pb::CompactionRequest>,
    #[prost(message, optional, tag = "8")]
    lease_grant: Option<pb::LeaseGrantRequest>,
    #[prost(message, optional, tag = "9")]
    lease_revoke: Option<pb::LeaseRevokeRequest>,
    #[prost(message, optional, tag = "11")]
    lease_checkpoint: Option<pb::LeaseCheckpointRequest>,
    #[prost(message, optional, tag = "1000")]
    auth_enable: Option<pb::AuthEnableRequest>,
    #[prost(message, optional, tag = "1011")]
    auth_disable: Option<pb::AuthDisableRequest>,
    #[prost(message, optional, tag = "1100")]
    user_add: Option<UserAdd>,
    #[prost(message, optional, tag = "1101")]
    user_delete: Option<pb::AuthUserDeleteRequest>,
    #[prost(message, optional, tag = "1103")]
    user_change_password: Option<ChangePassword>,
    #[prost(message, optional, tag = "1104")]
    user_grant_role: Option<pb::AuthUserGrantRoleRequest>,
    #[prost(message, optional, tag = "1105")]
    user_revoke_role: Option<pb::AuthUserRevokeRoleRequest>,
    #[prost(message, optional, tag = "1200")]
    role_add: Option<pb::AuthRoleAddRequest>,
    #[prost(message, optional, tag = "1201")]
    role_delete: Option<pb::AuthRoleDeleteRequest>,
    #[prost(message, optional, tag = "1203")]
    role_grant_permission: Option<pb::AuthRoleGrantPermissionRequest>,
    #[prost(message, optional, tag = "1204")]
    role_revoke_permission: Option<pb::AuthRoleRevokePermissionRequest>,
}

/// The retcd request that replays etcd entry data `data`, or None for an
/// entry that changes nothing retcd keeps. `hash(password)` hashes a
/// plaintext password (etcd 3.4 logs them; 3.5 logs the bcrypt hash).
pub fn to_retcd(
    data: &[u8],
    hash: &dyn Fn(&str) -> Result<Vec<u8>, String>,
) -> Result<Option<retcdpb::InternalRaftRequest>, String> {
    use retcdpb::auth_request::Op;
    use retcdpb::internal_raft_request::Request as R;
    if data.is_empty() {
        return Ok(None); // a new leader's empty entry
    }
    // etcd's own rule (applyEntryNormal): data that is not an
    // InternalRaftRequest is a v2 `Request` (3.4 publishes members and the
    // cluster version through the v2 store), which retcd does not keep.
    let Ok(e) = EtcdRequest::decode(data) else {
        return Ok(None);
    };
    let pw = |plain: &str, hashed: &str| -> Result<Vec<u8>, String> {
        if !hashed.is_empty() {
            // etcd 3.5's API layer puts the bcrypt hash in base64 there
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD
                .decode(hashed)
                .map_err(|e| format!("a user's hashedPassword is not base64: {e}"))
        } else if plain.is_empty() {
            Ok(Vec::new()) // a user with no password (3.5's --no-password)
        } else {
            hash(plain)
        }
    };
    let auth = |op: Op| Some(R::Auth(retcdpb::AuthRequest { op: Some(op) }));
    let request = if let Some(r) = e.put {
        Some(R::Put(r))
    } else if let Some(r) = e.delete_range {
        Some(R::DeleteRange(r))
    } else if let Some(r) = e.txn {
        Some(R::Txn(r))
    } else if let Some(r) = e.compaction {
        Some(R::Compaction(r))
    } else if let Some(r) = e.lease_grant {
        Some(R::LeaseGrant(r))
    } else if let Some(r) = e.lease_revoke {
        Some(R::LeaseRevoke(r))
    } else if let Some(r) = e.lease_checkpoint {
        Some(R::LeaseCheckpoint(retcdpb::LeaseCheckpointRequest {
            checkpoints: r
                .checkpoints
                .into_iter()
                .map(|c| retcdpb::LeaseCheckpoint {
                    id: c.id,
                    remaining_ttl: c.remaining_ttl,
                })
                .collect(),
        }))
    } else if let Some(r) = e.auth_enable {
        auth(Op::Enable(r))
    } else if let Some(r) = e.auth_disable {
        auth(Op::Disable(r))
    } else if let Some(r) = e.user_add {
        auth(Op::UserAdd(retcdpb::AuthUserAdd {
            hashed_password: pw(&r.password, &r.hashed_password)?,
            name: r.name,
            options: r.options,
        }))
    } else if let Some(r) = e.user_delete {
        auth(Op::UserDelete(r))
    } else if let Some(r) = e.user_change_password {
        // etcd's selectPassword at apply: a password (3.4's entries) is
        // hashed, else the hashedPassword is decoded where the user has a
        // password (retcd's apply does that part)
        auth(Op::UserChangePassword(if r.password.is_empty() {
            retcdpb::AuthUserChangePassword {
                hashed_password: Vec::new(),
                given_hashed_password: Some(r.hashed_password),
                name: r.name,
            }
        } else {
            retcdpb::AuthUserChangePassword {
                hashed_password: pw(&r.password, &r.hashed_password)?,
                given_hashed_password: None,
                name: r.name,
            }
        }))
    } else if let Some(r) = e.user_grant_role {
        auth(Op::UserGrantRole(r))
    } else if let Some(r) = e.user_revoke_role {
        auth(Op::UserRevokeRole(r))
    } else if let Some(r) = e.role_add {
        auth(Op::RoleAdd(r))
    } else if let Some(r) = e.role_delete {
        auth(Op::RoleDelete(r))
    } else if let Some(r) = e.role_grant_permission {
        auth(Op::RoleGrantPermission(r))
    } else if let Some(r) = e.role_revoke_permission {
        auth(Op::RoleRevokePermission(r))
    } else {
        None
    };
    let header = e.header.unwrap_or_default();
    Ok(request.map(|request| retcdpb::InternalRaftRequest {
        id: header.id,
        request: Some(request),
        username: header.username,
        auth_revision: header.auth_revision,
    }))
}
