//! etcd 3.6's `--feature-gates` (server/features/etcd_features.go): the
//! gates, their defaults and stages, and etcd's parsing rules.

use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Alpha,
    Beta,
}

/// (gate, default, stage, the 3.5 experimental flag it replaces).
pub static GATES: &[(&str, bool, Stage, &str)] = &[
    (
        "StopGRPCServiceOnDefrag",
        false,
        Stage::Alpha,
        "experimental-stop-grpc-service-on-defrag",
    ),
    (
        "TxnModeWriteWithSharedBuffer",
        true,
        Stage::Beta,
        "experimental-txn-mode-write-with-shared-buffer",
    ),
    (
        "InitialCorruptCheck",
        false,
        Stage::Alpha,
        "experimental-initial-corrupt-check",
    ),
    (
        "CompactHashCheck",
        false,
        Stage::Alpha,
        "experimental-compact-hash-check-enabled",
    ),
    (
        "LeaseCheckpoint",
        false,
        Stage::Alpha,
        "experimental-enable-lease-checkpoint",
    ),
    (
        "LeaseCheckpointPersist",
        false,
        Stage::Alpha,
        "experimental-enable-lease-checkpoint-persist",
    ),
    ("SetMemberLocalAddr", false, Stage::Alpha, ""),
];

/// Parses `Name=bool,...` (items trimmed, empty items skipped) into the
/// gates named; `AllAlpha` / `AllBeta` set every gate of their stage.
/// Errors are etcd's texts.
pub fn parse(s: &str) -> Result<BTreeMap<&'static str, bool>, String> {
    let mut out = BTreeMap::new();
    let mut all: Vec<(Stage, bool)> = Vec::new();
    for item in s.split(',') {
        if item.is_empty() {
            continue;
        }
        let (k, v) = match item.split_once('=') {
            Some((k, v)) => (k.trim(), v.trim()),
            None => return Err(format!("missing bool value for {}", item.trim())),
        };
        let b = retcd_gostd::strconv::parse_bool(v)
            .map_err(|e| format!("invalid value of {k}={v}, err: {e}"))?;
        match k {
            "AllAlpha" => all.push((Stage::Alpha, b)),
            "AllBeta" => all.push((Stage::Beta, b)),
            _ => {
                let (name, ..) = GATES
                    .iter()
                    .find(|(n, ..)| *n == k)
                    .ok_or_else(|| format!("unrecognized feature gate: {k}"))?;
                out.insert(*name, b);
            }
        }
    }
    for (stage, b) in all {
        for (name, _, st, _) in GATES {
            if *st == stage {
                out.entry(*name).or_insert(b);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_gates() {
        let g = parse(" InitialCorruptCheck = true ,,CompactHashCheck=false").unwrap();
        assert!(g["InitialCorruptCheck"]);
        assert!(!g["CompactHashCheck"]);
        assert_eq!(
            parse("Foo=true").unwrap_err(),
            "unrecognized feature gate: Foo"
        );
        assert_eq!(
            parse("InitialCorruptCheck").unwrap_err(),
            "missing bool value for InitialCorruptCheck"
        );
        assert!(parse("InitialCorruptCheck=yes")
            .unwrap_err()
            .starts_with("invalid value of InitialCorruptCheck=yes"));
        let g = parse("AllAlpha=true,LeaseCheckpoint=false").unwrap();
        assert!(g["InitialCorruptCheck"] && !g["LeaseCheckpoint"]);
        assert!(!g.contains_key("TxnModeWriteWithSharedBuffer"));
    }
}
