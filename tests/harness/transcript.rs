//! Comparing transcripts: the observable outcomes of one scenario, one line
//! each, on the reference etcd and on the flavour under test.

use crate::{bounded, test_flavor, Flavor};
use std::future::Future;
use std::time::Duration;

/// Runs `scenario` on the reference etcd, then on the flavour under test
/// (`test_flavor`), within `limit`, and hands both outcomes to `compare`.
pub async fn same_as_etcd<T, F, Fut>(limit: Duration, scenario: F, compare: impl FnOnce(&T, &T))
where
    F: Fn(Flavor) -> Fut,
    Fut: Future<Output = T>,
{
    bounded(limit, async {
        let want = scenario(Flavor::Etcd).await;
        let got = scenario(test_flavor()).await;
        compare(&want, &got);
    })
    .await
}

/// Prints the reference's lines, then asserts that the reference met its
/// own expectations (`want_violations`: the scenario itself is sound), that
/// the target met them (`got_violations`) and that both transcripts are
/// equal line by line; on failure every differing line is listed, etcd's
/// and the target's (`got_name`) side by side.
pub fn assert_same_lines(
    want: &[String],
    want_violations: &[String],
    got: &[String],
    got_violations: &[String],
    got_name: &str,
) {
    for l in want {
        eprintln!("etcd: {l}");
    }
    assert!(
        want_violations.is_empty(),
        "the scenario itself changed on real etcd:\n{}",
        want_violations.join("\n")
    );
    let n = want.len().max(got.len());
    let line = |t: &[String], i: usize| t.get(i).cloned().unwrap_or("<none>".into());
    let diffs: Vec<String> = (0..n)
        .filter(|&i| want.get(i) != got.get(i))
        .map(|i| {
            format!(
                "line {i}:\n  etcd: {}\n  {got_name}: {}",
                line(want, i),
                line(got, i)
            )
        })
        .collect();
    assert!(
        diffs.is_empty() && got_violations.is_empty(),
        "{} of {n} lines differ:\n{}\n{}",
        diffs.len(),
        diffs.join("\n"),
        got_violations.join("\n")
    );
}
