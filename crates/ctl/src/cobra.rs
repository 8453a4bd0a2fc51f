//! etcdctl's command line: cobra 1.1.3 and pflag 1.0.5 as the shared
//! `retcd-cobra` crate parses them (retcdutl's too), and the usage page
//! etcdctl prints in their place (etcd's `cobrautl` template, rendered
//! with Go's tabwriter).

pub use retcd_cobra::*;

use crate::gofmt;

/// cobrautl's flag lines: `--name=default` (`[=default]` for a boolean)
/// and the usage after a tab.
fn cobrautl_flag_usages(flags: &[Flag]) -> String {
    let mut fs: Vec<&Flag> = flags.iter().filter(|f| !f.hidden).collect();
    fs.sort_by_key(|f| f.name);
    fs.dedup_by_key(|f| f.name);
    let mut out = String::new();
    for f in fs {
        match f.short {
            Some(s) => out.push_str(&format!("  -{s}, --{}", f.name)),
            None => out.push_str(&format!("      --{}", f.name)),
        }
        let def = if f.kind == Kind::Str {
            gofmt::quote(f.default)
        } else {
            f.default.to_string()
        };
        if f.kind == Kind::Bool {
            out.push_str(&format!("[={def}]"));
        } else {
            out.push_str(&format!("={def}"));
        }
        out.push_str(&format!("\t{}\n", f.usage));
    }
    out
}

/// Every command below `c`, depth first, cobra-sorted by name.
fn descendants<'a>(c: &'a Cmd, prefix: &str, out: &mut Vec<(String, &'a Cmd)>) {
    let mut subs: Vec<&Cmd> = c.subs.iter().collect();
    subs.sort_by_key(|s| s.name);
    for s in subs {
        let name = if prefix.is_empty() {
            s.name.to_string()
        } else {
            format!("{prefix} {}", s.name)
        };
        out.push((name.clone(), s));
        descendants(s, &name, out);
    }
}

/// etcd's cobrautl usage page of the command at `path`.
pub fn usage(root: &Cmd, path: &[&str], version: &str, api: &str) -> String {
    usage_with(root, path, version, api, true)
}

/// [`usage`]; without `help_flag` the command's `-h, --help` is not
/// listed (cobra registers it only on a command it runs or shows the help
/// of: `help bogus` prints the root's page without it).
pub fn usage_with(root: &Cmd, path: &[&str], version: &str, api: &str, help_flag: bool) -> String {
    let c = lookup(root, path);
    let (local, inherited) = flag_sets(root, path, help_flag);
    let mut t = String::new();
    t.push_str("NAME:\n");
    if path.is_empty() {
        t.push_str(&format!("\t{} - {}\n", "etcdctl", c.short));
    } else {
        t.push_str(&format!("\t{} - {}\n", path.join(" "), c.short));
    }
    t.push_str("\nUSAGE:\n");
    let mut useline = if path.is_empty() {
        c.use_.to_string()
    } else {
        format!("etcdctl {} {}", path[..path.len() - 1].join(" "), c.use_).replace("  ", " ")
    };
    if !useline.contains("[flags]") {
        useline.push_str(" [flags]");
    }
    t.push_str(&format!("\t{useline}\n"));
    if path.is_empty() {
        t.push_str(&format!("\nVERSION:\n\t{version}\n"));
    }
    if !c.subs.is_empty() {
        t.push_str(&format!("\nAPI VERSION:\n\t{api}\n"));
        t.push_str("\n\nCOMMANDS:\n");
        let mut all = Vec::new();
        descendants(c, "", &mut all);
        for (name, s) in all {
            if s.runnable {
                t.push_str(&format!("\t{name}\t{}\n", s.short));
            }
        }
    }
    if !c.long.is_empty() {
        t.push_str("\nDESCRIPTION:\n");
        for line in c
            .long
            .trim_matches(|ch| ch == '\n' || ch == '\t' || ch == ' ')
            .split('\n')
        {
            t.push_str(&format!("\t{line}\n"));
        }
    }
    t.push_str("\nOPTIONS:\n");
    t.push_str(&cobrautl_flag_usages(&local));
    if !inherited.is_empty() {
        t.push_str("\nGLOBAL OPTIONS:\n");
        t.push_str(&cobrautl_flag_usages(&inherited));
    }
    t.push('\n');
    gofmt::tabwrite(&t)
}
