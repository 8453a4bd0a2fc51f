//! Permission checks (etcd's `isOpPermitted` and `range_perm_cache.go`):
//! with auth enabled, a request with no user fails with "user name is
//! empty"; one whose token was issued before the last auth change fails
//! with "revision of auth store is old" (clients authenticate again); a
//! user with the `root` role may do anything; others need their roles'
//! permissions to cover the whole key range (READ for reads, WRITE for
//! writes; READWRITE counts as both).
//!
//! Worked example: bob's role grants READ on `[dir/, dir0)`. `get dir/a`
//! (the single key `[dir/a, dir/a\0)`) is inside: allowed. `get dir/ --prefix`
//! is `[dir/, dir0)`: covered exactly, allowed. `get d --prefix` is
//! `[d, e)`: `[d, dir/)` is not covered, denied. Two permissions `[a, c)` and
//! `[c, e)` together cover `[b, d)`.

use super::store::State;
use super::{AuthError, AuthInfo, ROOT_ROLE};
use retcd_api::authpb::{permission::Type as PermType, User};

/// A key range `[start, end)`; `end = None` is unbounded.
type Interval = (Vec<u8>, Option<Vec<u8>>);

impl State {
    /// The intervals a user may access with `want` (READ or WRITE).
    fn intervals(&self, user: &User, want: PermType) -> Vec<Interval> {
        let mut out = Vec::new();
        for role in user.roles.iter().filter_map(|r| self.roles.get(r)) {
            for p in &role.key_permission {
                // a type outside the enum (stored as etcd stores it) grants
                // nothing, as in etcd's `getMergedPerms`
                let Ok(t) = PermType::try_from(p.perm_type) else {
                    continue;
                };
                if t != want && t != PermType::Readwrite {
                    continue;
                }
                out.push(interval(&p.key, &p.range_end));
            }
        }
        out
    }

    /// etcd's `isOpPermitted` (see the module documentation).
    pub(super) fn check(
        &self,
        who: Option<&AuthInfo>,
        key: &[u8],
        range_end: &[u8],
        want: PermType,
    ) -> Result<(), AuthError> {
        if !self.enabled {
            return Ok(());
        }
        let who = match who {
            Some(w) if w.revision != 0 => w,
            _ => return Err(AuthError::UserEmpty),
        };
        if who.revision < self.revision {
            return Err(AuthError::AuthOldRevision);
        }
        let Some(user) = self.users.get(&who.username) else {
            return Err(AuthError::PermissionDenied);
        };
        if user.roles.iter().any(|r| r == ROOT_ROLE) {
            return Ok(());
        }
        let perms = self.intervals(user, want);
        // a key alone, or an empty or reversed range (see `is_empty`): where
        // a permission holds the key
        let ok = match (!range_end.is_empty()).then(|| interval(key, range_end)) {
            Some(request) if !is_empty(&request) => covers(perms, &request),
            _ => perms.iter().any(|iv| contains_key(iv, key)),
        };
        if ok {
            Ok(())
        } else {
            Err(AuthError::PermissionDenied)
        }
    }
}

/// A permission's or request's range as an interval: an empty `range_end`
/// is the single key, `"\0"` is every key from `key` on.
fn interval(key: &[u8], range_end: &[u8]) -> Interval {
    match range_end {
        [] => {
            let mut end = key.to_vec();
            end.push(0);
            (key.to_vec(), Some(end))
        }
        [0] => (key.to_vec(), None),
        end => (key.to_vec(), Some(end.to_vec())),
    }
}

/// Whether a request's range is empty or reversed (`end <= key`). It
/// holds no key; etcd's interval tree finds the permissions that hold its
/// first key and permits it when there is one — for a reversed range only
/// when its search, which prunes by the range's end, reaches them, which
/// depends on the tree's shape. retcd permits it when a permission holds
/// the first key; with none etcd refuses it too.
fn is_empty((start, end): &Interval) -> bool {
    end.as_ref().is_some_and(|e| e <= start)
}

fn contains_key((start, end): &Interval, key: &[u8]) -> bool {
    start.as_slice() <= key && end.as_ref().is_none_or(|e| key < e.as_slice())
}

/// Whether the union of `perms` covers all of `want`.
fn covers(mut perms: Vec<Interval>, want: &Interval) -> bool {
    perms.sort();
    let mut reached = want.0.clone();
    for (start, end) in perms {
        if start > reached {
            break;
        }
        match end {
            None => return true,
            Some(e) if e > reached => reached = e,
            Some(_) => {}
        }
        if want.1.as_ref().is_some_and(|w| reached >= *w) {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use retcd_api::authpb::{Permission, Role};

    fn perm(key: &[u8], end: &[u8]) -> Interval {
        interval(key, end)
    }

    #[test]
    fn test_point_permission_covers_only_its_key() {
        let p = vec![perm(b"foo", b"")];
        assert!(covers(p.clone(), &interval(b"foo", b"")));
        assert!(!covers(p.clone(), &interval(b"foo", b"fop")));
        assert!(contains_key(&p[0], b"foo"));
        assert!(!contains_key(&p[0], b"foo1"));
    }

    #[test]
    fn test_ranges_cover_a_request_only_together() {
        let p = vec![perm(b"a", b"c"), perm(b"c", b"e")];
        assert!(covers(p.clone(), &interval(b"a", b"e")));
        assert!(covers(p.clone(), &interval(b"b", b"d")));
        assert!(!covers(p.clone(), &interval(b"a", b"f")));
        assert!(!covers(
            vec![perm(b"a", b"b"), perm(b"c", b"e")],
            &interval(b"a", b"d")
        ));
    }

    #[test]
    fn test_from_key_permission_is_unbounded() {
        let p = vec![perm(b"m", b"\0")];
        assert!(covers(p.clone(), &interval(b"m", b"\0")));
        assert!(covers(p.clone(), &interval(b"x", b"z")));
        assert!(!covers(p.clone(), &interval(b"a", b"z")));
        assert!(!covers(vec![perm(b"a", b"z")], &interval(b"a", b"\0")));
    }

    #[test]
    fn test_check_rules() {
        let mut st = State {
            enabled: true,
            revision: 3,
            ..Default::default()
        };
        st.roles.insert(
            "r".into(),
            Role {
                name: b"r".to_vec(),
                key_permission: vec![Permission {
                    perm_type: PermType::Read as i32,
                    key: b"dir/".to_vec(),
                    range_end: b"dir0".to_vec(),
                }],
            },
        );
        st.users.insert(
            "bob".into(),
            User {
                name: b"bob".to_vec(),
                roles: vec!["r".into()],
                ..Default::default()
            },
        );
        let bob = AuthInfo {
            username: "bob".into(),
            revision: 3,
        };
        assert_eq!(st.check(Some(&bob), b"dir/a", b"", PermType::Read), Ok(()));
        assert_eq!(
            st.check(Some(&bob), b"dir/a", b"", PermType::Write),
            Err(AuthError::PermissionDenied)
        );
        assert_eq!(
            st.check(None, b"dir/a", b"", PermType::Read),
            Err(AuthError::UserEmpty)
        );
        let old = AuthInfo {
            revision: 2,
            ..bob.clone()
        };
        assert_eq!(
            st.check(Some(&old), b"dir/a", b"", PermType::Read),
            Err(AuthError::AuthOldRevision)
        );
        // an empty or reversed range: permitted where its first key is
        for (key, end) in [
            (&b"dir/a"[..], &b"dir/a"[..]),
            (b"dir/b", b"dir/a"),
            (b"dir/", b"a"),
        ] {
            assert_eq!(st.check(Some(&bob), key, end, PermType::Read), Ok(()));
        }
        for (key, end) in [(&b"a"[..], &b"a"[..]), (b"z", b"a"), (b"dir0", b"dir/")] {
            assert_eq!(
                st.check(Some(&bob), key, end, PermType::Read),
                Err(AuthError::PermissionDenied),
                "{key:?}..{end:?}"
            );
        }
        // a permission type outside the enum grants nothing (etcd stores it)
        st.roles.get_mut("r").unwrap().key_permission[0].perm_type = 7;
        assert_eq!(
            st.check(Some(&bob), b"dir/a", b"", PermType::Read),
            Err(AuthError::PermissionDenied)
        );
        st.enabled = false;
        assert_eq!(st.check(None, b"x", b"", PermType::Write), Ok(()));
    }
}
