//! etcd's backend layout and its mapping to retcd's tables, both ways.
//!
//! | etcd bucket       | key                          | value                         | retcd table (dump id)            |
//! |-------------------|------------------------------|-------------------------------|----------------------------------|
//! | `key`             | revision (17/18 B)           | `mvccpb.KeyValue`             | `key` (1), same bytes            |
//! | `meta`            | `consistent_index`, `term`   | u64 BE                        | `meta` (2), same bytes           |
//! |                   | `scheduledCompactRev`, `finishedCompactRev` | revision (17 B) | `meta` (2), same bytes           |
//! | `members`         | member id, hex               | JSON (`id`, `peerURLs`, ...)  | `members` (3), `retcdpb.Member`  |
//! | `members_removed` | member id, hex               | `removed`                     | (none: retcd keeps no tombstones)|
//! | `lease`           | lease id, 8 B BE             | `leasepb.Lease`               | `lease` (4), same bytes          |
//! | `alarm`           | `etcdserverpb.AlarmMember`   | empty                         | `alarm` (5), same bytes          |
//! | `auth`            | `authEnabled`, `authRevision`| 1 B, u64 BE                   | `auth` (6), `enabled`/`revision` |
//! | `authUsers`       | user name                    | `authpb.User`                 | `auth` (6), `u/` ++ name         |
//! | `authRoles`       | role name                    | `authpb.Role`                 | `auth` (6), `r/` ++ name         |
//! | `cluster`         | `clusterVersion`             | `3.5.0`                       | (none: derived from the version) |
//!
//! Reading etcd's file, other `meta` keys (`confState`, 3.6's
//! `storageVersion`) and unknown buckets are skipped: a restore makes a new
//! cluster with its own membership, as `etcdutl snapshot restore` does.

use prost::Message;
use retcd_api::etcdserverpb::{AlarmMember, AlarmType};
use retcd_api::mvccpb::KeyValue;
use retcd_api::retcdpb::Member;
use retcd_storage::backend::{
    AUTH_ENABLED_KEY, AUTH_REVISION_KEY, AUTH_ROLE_PREFIX, AUTH_USER_PREFIX,
};

/// retcd's dump table ids (`retcd_mvcc::SnapshotDump` records).
pub mod table {
    pub const KEY: u8 = 1;
    pub const META: u8 = 2;
    pub const MEMBERS: u8 = 3;
    pub const LEASES: u8 = 4;
    pub const ALARM: u8 = 5;
    pub const AUTH: u8 = 6;
}

/// etcd's buckets, in the order etcd creates them.
pub const BUCKETS: [&str; 10] = [
    "key",
    "meta",
    "lease",
    "members",
    "members_removed",
    "cluster",
    "alarm",
    "auth",
    "authUsers",
    "authRoles",
];

/// The `meta` keys both formats share.
const META_KEYS: [&str; 4] = [
    "consistent_index",
    "term",
    "scheduledCompactRev",
    "finishedCompactRev",
];

/// One row of a backend: (bucket or table, key, value).
pub type Row = (String, Vec<u8>, Vec<u8>);

/// An etcd member record (the JSON etcd's membership store writes).
#[derive(serde::Serialize, serde::Deserialize)]
struct EtcdMember {
    id: u64,
    #[serde(rename = "peerURLs", default)]
    peer_urls: Vec<String>,
    #[serde(
        rename = "isLearner",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    is_learner: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    name: String,
    #[serde(rename = "clientURLs", default, skip_serializing_if = "Vec::is_empty")]
    client_urls: Vec<String>,
}

/// Why a row cannot be converted.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConvertError(pub String);

fn bad(why: String) -> ConvertError {
    ConvertError(why)
}

/// A revision key: 8-byte main, `_`, 8-byte sub, optionally `t`.
fn valid_revision_key(k: &[u8]) -> bool {
    (k.len() == 17 || (k.len() == 18 && k[17] == b't')) && k[8] == b'_'
}

/// retcd dump record → etcd bucket row(s).
pub fn to_etcd(
    table: u8,
    k: &[u8],
    v: &[u8],
) -> Result<Option<(&'static str, Vec<u8>, Vec<u8>)>, ConvertError> {
    Ok(match table {
        table::KEY => Some(("key", k.to_vec(), v.to_vec())),
        table::META => {
            let name = std::str::from_utf8(k).unwrap_or("");
            META_KEYS
                .contains(&name)
                .then(|| ("meta", k.to_vec(), v.to_vec()))
        }
        table::MEMBERS => {
            let m = Member::decode(v).map_err(|e| bad(format!("member record: {e}")))?;
            let json = serde_json::to_vec(&EtcdMember {
                id: m.id,
                peer_urls: m.peer_urls,
                is_learner: m.is_learner,
                name: m.name,
                client_urls: m.client_urls,
            })
            .map_err(|e| bad(e.to_string()))?;
            Some(("members", format!("{:x}", m.id).into_bytes(), json))
        }
        table::LEASES => Some(("lease", k.to_vec(), v.to_vec())),
        table::ALARM => Some(("alarm", k.to_vec(), v.to_vec())),
        table::AUTH => {
            if k == AUTH_ENABLED_KEY {
                Some(("auth", b"authEnabled".to_vec(), v.to_vec()))
            } else if k == AUTH_REVISION_KEY {
                Some(("auth", b"authRevision".to_vec(), v.to_vec()))
            } else if let Some(name) = k.strip_prefix(AUTH_USER_PREFIX) {
                Some(("authUsers", name.to_vec(), v.to_vec()))
            } else {
                k.strip_prefix(AUTH_ROLE_PREFIX)
                    .map(|name| ("authRoles", name.to_vec(), v.to_vec()))
            }
        }
        _ => None,
    })
}

/// etcd bucket row → retcd dump record, checked; None for what retcd does
/// not keep (see the module documentation).
pub fn from_etcd(
    bucket: &[u8],
    k: &[u8],
    v: &[u8],
) -> Result<Option<(u8, Vec<u8>, Vec<u8>)>, ConvertError> {
    let name = String::from_utf8_lossy(bucket);
    Ok(match bucket {
        b"key" => {
            if !valid_revision_key(k) {
                return Err(bad(format!("key bucket: {k:02x?} is not a revision")));
            }
            KeyValue::decode(v).map_err(|e| bad(format!("key bucket: revision {k:02x?}: {e}")))?;
            Some((table::KEY, k.to_vec(), v.to_vec()))
        }
        b"meta" => {
            let key = std::str::from_utf8(k).unwrap_or("");
            if !META_KEYS.contains(&key) {
                return Ok(None);
            }
            let ok = match key {
                "consistent_index" | "term" => v.len() == 8,
                _ => v.len() == 17 && v[8] == b'_',
            };
            if !ok {
                return Err(bad(format!("meta {key}: {} bytes", v.len())));
            }
            Some((table::META, k.to_vec(), v.to_vec()))
        }
        b"lease" => {
            if k.len() != 8 {
                return Err(bad(format!("lease key of {} bytes", k.len())));
            }
            retcd_api::retcdpb::Lease::decode(v).map_err(|e| bad(format!("lease: {e}")))?;
            Some((table::LEASES, k.to_vec(), v.to_vec()))
        }
        b"members" => {
            let m: EtcdMember =
                serde_json::from_slice(v).map_err(|e| bad(format!("member {name}: {e}")))?;
            let m = Member {
                id: m.id,
                name: m.name,
                peer_urls: m.peer_urls,
                client_urls: m.client_urls,
                is_learner: m.is_learner,
            };
            Some((
                table::MEMBERS,
                m.id.to_be_bytes().to_vec(),
                m.encode_to_vec(),
            ))
        }
        b"alarm" => {
            let am = AlarmMember::decode(k).map_err(|e| bad(format!("alarm: {e}")))?;
            AlarmType::try_from(am.alarm).map_err(|_| bad(format!("alarm type {}", am.alarm)))?;
            Some((table::ALARM, k.to_vec(), Vec::new()))
        }
        b"auth" => match k {
            b"authEnabled" => Some((table::AUTH, AUTH_ENABLED_KEY.to_vec(), v.to_vec())),
            b"authRevision" => {
                if v.len() != 8 {
                    return Err(bad(format!("authRevision of {} bytes", v.len())));
                }
                Some((table::AUTH, AUTH_REVISION_KEY.to_vec(), v.to_vec()))
            }
            _ => None,
        },
        b"authUsers" => {
            retcd_api::authpb::User::decode(v).map_err(|e| bad(format!("user: {e}")))?;
            Some((table::AUTH, [AUTH_USER_PREFIX, k].concat(), v.to_vec()))
        }
        b"authRoles" => {
            retcd_api::authpb::Role::decode(v).map_err(|e| bad(format!("role: {e}")))?;
            Some((table::AUTH, [AUTH_ROLE_PREFIX, k].concat(), v.to_vec()))
        }
        _ => None,
    })
}
