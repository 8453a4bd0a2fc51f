//! Enum fields in the JSON mapping as etcd's gateway (golang/protobuf's
//! `jsonpb`) reads and writes them: a known value by name or number, any
//! other number that fits an `int32` kept as it is (etcd 3.4 and 3.5
//! answer `"sort_order": 7` and show a type-7 permission as
//! `"permType": 7`); names are case-sensitive, and quoted numbers,
//! fractions and numbers past `int32` are refused.

use retcd_api::authpb::Permission;
use retcd_api::etcdserverpb::{RangeRequest, WatchCreateRequest};

fn range(json: &str) -> Result<RangeRequest, String> {
    serde_json::from_str(json).map_err(|e| e.to_string())
}

#[test]
fn test_enum_fields_read_as_jsonpb_reads_them() {
    assert_eq!(range(r#"{"sort_order":"DESCEND"}"#).unwrap().sort_order, 2);
    assert_eq!(range(r#"{"sort_order":2}"#).unwrap().sort_order, 2);
    assert_eq!(range(r#"{"sort_order":7}"#).unwrap().sort_order, 7);
    assert_eq!(range(r#"{"sort_order":-1}"#).unwrap().sort_order, -1);
    assert_eq!(range(r#"{"sort_order":-0}"#).unwrap().sort_order, 0);
    assert_eq!(range(r#"{"sortTarget":9}"#).unwrap().sort_target, 9);
    for refused in [
        r#"{"sort_order":"7"}"#,
        r#"{"sort_order":"descend"}"#,
        r#"{"sort_order":1.0}"#,
        r#"{"sort_order":1e0}"#,
        r#"{"sort_order":2147483648}"#,
        r#"{"sort_order":-2147483649}"#,
        r#"{"sort_order":true}"#,
    ] {
        assert!(range(refused).is_err(), "{refused}");
    }
    let w: WatchCreateRequest = serde_json::from_str(r#"{"filters":["NOPUT",5]}"#).unwrap();
    assert_eq!(w.filters, [0, 5]);
}

#[test]
fn test_enum_fields_written_as_jsonpb_writes_them() {
    let perm = |perm_type| {
        serde_json::to_string(&Permission {
            perm_type,
            key: b"a".to_vec(),
            range_end: Vec::new(),
        })
        .unwrap()
    };
    assert_eq!(perm(1), r#"{"permType":"WRITE","key":"YQ=="}"#);
    assert_eq!(perm(7), r#"{"permType":7,"key":"YQ=="}"#);
    let w = WatchCreateRequest {
        filters: vec![1, 5],
        ..Default::default()
    };
    assert_eq!(
        serde_json::to_string(&w).unwrap(),
        r#"{"filters":["NODELETE",5]}"#
    );
}
