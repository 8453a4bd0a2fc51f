//! Go's `encoding/json` of etcd's protobuf response structs (what
//! `etcdctl -w json` prints): fields in struct (proto) order under their
//! JSON tag names, zero values omitted where the tag says `omitempty`,
//! `[]byte` as base64, 64-bit integers as plain numbers.

use base64::Engine as _;
use etcd_client::proto::{PbEvent, PbKeyValue, PbMember, PbResponseHeader};

use crate::gofmt;

/// One JSON object being written.
pub struct Obj {
    s: String,
    first: bool,
}

impl Default for Obj {
    fn default() -> Self {
        Obj::new()
    }
}

impl Obj {
    pub fn new() -> Obj {
        Obj {
            s: String::from("{"),
            first: true,
        }
    }

    fn key(&mut self, k: &str) {
        if !self.first {
            self.s.push(',');
        }
        self.first = false;
        gofmt::json_string(&mut self.s, &crate::raw::bytes(k));
        self.s.push(':');
    }

    /// A value already encoded.
    pub fn raw(&mut self, k: &str, v: &str) -> &mut Obj {
        self.key(k);
        self.s.push_str(v);
        self
    }

    /// `omitempty` number.
    pub fn num<T: PartialEq + Default + std::fmt::Display>(&mut self, k: &str, v: T) -> &mut Obj {
        if v != T::default() {
            self.raw(k, &v.to_string());
        }
        self
    }

    /// Number without `omitempty`.
    pub fn num_always<T: std::fmt::Display>(&mut self, k: &str, v: T) -> &mut Obj {
        self.raw(k, &v.to_string())
    }

    pub fn bool(&mut self, k: &str, v: bool) -> &mut Obj {
        if v {
            self.raw(k, "true");
        }
        self
    }

    pub fn bool_always(&mut self, k: &str, v: bool) -> &mut Obj {
        self.raw(k, if v { "true" } else { "false" })
    }

    pub fn str(&mut self, k: &str, v: &str) -> &mut Obj {
        if !v.is_empty() {
            self.str_always(k, v);
        }
        self
    }

    pub fn str_always(&mut self, k: &str, v: &str) -> &mut Obj {
        self.key(k);
        gofmt::json_string(&mut self.s, &crate::raw::bytes(v));
        self
    }

    /// `omitempty` `[]byte`.
    pub fn bytes(&mut self, k: &str, v: &[u8]) -> &mut Obj {
        if !v.is_empty() {
            self.raw(k, &bytes(v));
        }
        self
    }

    /// `omitempty` slice of encoded values.
    pub fn arr(&mut self, k: &str, v: &[String]) -> &mut Obj {
        if !v.is_empty() {
            self.raw(k, &arr(v));
        }
        self
    }

    /// `omitempty` []string.
    pub fn strs(&mut self, k: &str, v: &[String]) -> &mut Obj {
        let enc: Vec<String> = v.iter().map(|s| string(s)).collect();
        self.arr(k, &enc)
    }

    /// `omitempty` pointer to a struct.
    pub fn opt(&mut self, k: &str, v: Option<String>) -> &mut Obj {
        if let Some(v) = v {
            self.raw(k, &v);
        }
        self
    }

    /// A header embedded as `*pb.ResponseHeader` (its fields inline).
    pub fn inline_header(&mut self, h: Option<&PbResponseHeader>) -> &mut Obj {
        if let Some(h) = h {
            self.num("cluster_id", h.cluster_id)
                .num("member_id", h.member_id)
                .num("revision", h.revision)
                .num("raft_term", h.raft_term);
        }
        self
    }

    pub fn header(&mut self, h: &Option<PbResponseHeader>) -> &mut Obj {
        self.opt("header", h.as_ref().map(header))
    }

    pub fn done(&mut self) -> String {
        let mut s = std::mem::take(&mut self.s);
        s.push('}');
        s
    }
}

pub fn string(s: &str) -> String {
    let mut out = String::new();
    gofmt::json_string(&mut out, &crate::raw::bytes(s));
    out
}

pub fn bytes(v: &[u8]) -> String {
    format!(
        "\"{}\"",
        base64::engine::general_purpose::STANDARD.encode(v)
    )
}

pub fn arr(v: &[String]) -> String {
    format!("[{}]", v.join(","))
}

/// A slice without `omitempty`: `null` when empty (nil), as Go.
pub fn arr_or_null(v: &[String]) -> String {
    if v.is_empty() {
        "null".into()
    } else {
        arr(v)
    }
}

pub fn header(h: &PbResponseHeader) -> String {
    Obj::new()
        .num("cluster_id", h.cluster_id)
        .num("member_id", h.member_id)
        .num("revision", h.revision)
        .num("raft_term", h.raft_term)
        .done()
}

pub fn kv(kv: &PbKeyValue) -> String {
    Obj::new()
        .bytes("key", &kv.key)
        .num("create_revision", kv.create_revision)
        .num("mod_revision", kv.mod_revision)
        .num("version", kv.version)
        .bytes("value", &kv.value)
        .num("lease", kv.lease)
        .done()
}

pub fn kvs(v: &[PbKeyValue]) -> Vec<String> {
    v.iter().map(kv).collect()
}

pub fn event(e: &PbEvent) -> String {
    Obj::new()
        .num("type", e.r#type)
        .opt("kv", e.kv.as_ref().map(kv))
        .opt("prev_kv", e.prev_kv.as_ref().map(kv))
        .done()
}

pub fn member(m: &PbMember) -> String {
    Obj::new()
        .num("ID", m.id)
        .str("name", &m.name)
        .strs("peerURLs", &m.peer_ur_ls)
        .strs("clientURLs", &m.client_ur_ls)
        .bool("isLearner", m.is_learner)
        .done()
}

pub fn members(v: &[PbMember]) -> Vec<String> {
    v.iter().map(member).collect()
}
