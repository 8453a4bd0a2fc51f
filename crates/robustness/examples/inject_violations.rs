//! Mutation test of the checker on saved run records: injects one
//! violation at a time (at 20/50/80/97 % of the history) and checks that
//! the checker reports it with the injected op as culprit.
//! `cargo run -p retcd-robustness --example inject_violations -- <file.json>...`
//! (`KINDS=0,3,6` picks mutations; see `kinds()`.)
use retcd_robustness::checks::{check_run, RunRecord};
use retcd_robustness::history::{Request, Response};
use retcd_robustness::patch::Truth;
use retcd_robustness::watch;

/// 0 get: version + 1; 2 get: stale and absent; 3 get: a consistent
/// snapshot 25 revisions back; 4 range: a key missing; 5 failed CAS: wrong
/// mod_revision; 6 put with a lease: "lease not found"; 7 revoke: "lease
/// not found" (may be linearizable: the grant may not have happened).
fn kinds() -> Vec<u32> {
    match std::env::var("KINDS") {
        Ok(k) => k.split(',').map(|x| x.parse().unwrap()).collect(),
        Err(_) => vec![0, 2, 3, 4, 5, 6, 7],
    }
}

fn main() {
    for path in std::env::args().skip(1) {
        let rec = RunRecord::load(std::path::Path::new(&path)).unwrap();
        let n = rec.history.ops.len();
        let wr = watch::check(&rec.watches, &rec.history, rec.init_rev, rec.final_rev);
        let truth = Truth::new(&wr.events_by_rev, &rec.watches, &rec.history, rec.init_rev);
        for frac in [0.2, 0.5, 0.8, 0.97] {
            for kind in kinds() {
                let mut r = rec.clone();
                let start = (n as f64 * frac) as usize;
                // find a suitable op
                let mut chosen = None;
                for j in start..n {
                    let op = &r.history.ops[j];
                    match (kind, &op.req, &op.resp) {
                        (0, Request::Get { .. }, Some(Response::Get { kv: Some(_), .. })) => {
                            chosen = Some(j);
                            break;
                        }
                        (1, Request::Put { .. }, Some(Response::Put { .. })) => {
                            chosen = Some(j);
                            break;
                        }
                        (2, Request::Get { .. }, Some(Response::Get { .. })) => {
                            chosen = Some(j);
                            break;
                        }
                        (3, Request::Get { .. }, Some(Response::Get { rev, .. }))
                            if *rev > rec.init_rev + 30 =>
                        {
                            chosen = Some(j);
                            break;
                        }
                        (4, Request::Range { .. }, Some(Response::Range { kvs, .. }))
                            if kvs.len() > 2 =>
                        {
                            chosen = Some(j);
                            break;
                        }
                        (
                            5,
                            Request::Cas { .. },
                            Some(Response::Cas {
                                succeeded: false,
                                kv: Some(_),
                                ..
                            }),
                        ) => {
                            chosen = Some(j);
                            break;
                        }
                        (6, Request::Put { lease, .. }, Some(Response::Put { .. }))
                            if *lease != 0 =>
                        {
                            chosen = Some(j);
                            break;
                        }
                        (7, Request::LeaseRevoke { .. }, Some(Response::LeaseRevoke { .. })) => {
                            chosen = Some(j);
                            break;
                        }
                        _ => {}
                    }
                }
                let Some(j) = chosen else { continue };
                let desc;
                {
                    let op = &mut r.history.ops[j];
                    match (kind, &mut op.resp) {
                        (0, Some(Response::Get { kv: Some(kv), .. })) => {
                            kv.version += 1;
                            desc = "get: version+1";
                        }
                        (1, Some(Response::Put { rev })) => {
                            *rev -= 3;
                            desc = "put: rev-3";
                        }
                        (2, Some(Response::Get { rev, kv })) => {
                            *rev -= 10;
                            *kv = None;
                            desc = "get: stale (rev-10, absent)";
                        }
                        (3, Some(Response::Get { rev, kv })) => {
                            let Request::Get { key } = &op.req else {
                                unreachable!()
                            };
                            // A consistent snapshot 25 revisions back.
                            *rev -= 25;
                            *kv = truth.state_at(*rev).unwrap().get(key).cloned();
                            desc = "get: consistent stale snapshot (rev-25)";
                        }
                        (4, Some(Response::Range { kvs, .. })) => {
                            kvs.remove(1);
                            desc = "range: a key missing";
                        }
                        (6, r) => {
                            *r = Some(Response::LeaseNotFound);
                            desc = "lease put: lease not found";
                        }
                        (7, r) => {
                            *r = Some(Response::LeaseNotFound);
                            desc = "revoke: lease not found";
                        }
                        (5, Some(Response::Cas { kv: Some(kv), .. })) => {
                            kv.mod_revision -= 1;
                            desc = "failed cas: wrong mod_revision";
                        }
                        _ => unreachable!(),
                    }
                }
                let culprit = r.history.ops[j].clone();
                let t = std::time::Instant::now();
                let out = check_run(&r);
                let found = out
                    .violations
                    .iter()
                    .any(|v| v.contains("not linearizable"));
                let culprit_ok = out
                    .violations
                    .iter()
                    .any(|v| v.contains(&format!("{culprit}")));
                println!(
                    "{} op {j}/{n} {desc}: {} in {:?}, culprit matches: {culprit_ok}, {:?}{}",
                    rec.name,
                    if found { "CAUGHT" } else { "MISSED" },
                    t.elapsed(),
                    out.lin_stats,
                    if found {
                        String::new()
                    } else {
                        format!("\n    {:?}", out.violations)
                    }
                );
                if found && !culprit_ok {
                    let v = out
                        .violations
                        .iter()
                        .find(|v| v.contains("not linearizable"))
                        .unwrap();
                    println!(
                        "    injected: {culprit}\n    {}",
                        v.lines().take(2).collect::<Vec<_>>().join("\n    ")
                    );
                }
            }
        }
    }
}
